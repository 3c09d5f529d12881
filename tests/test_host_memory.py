"""Outputs the functional API allocates on the host: large ones start on a 64-byte boundary (numpy's own start 16
bytes into a page, which splits every vector store of the CPU kernels across two cache lines), small ones are
plain numpy arrays, and both paths of the functional API (checked, and known layout) use them."""

import ml_dtypes
import numpy as np
import pytest

import infiniop_py as ip
from infiniop_py import _functional, _host_memory, _known_layouts, reference

LARGE = (1024, 1024)  # 2-4 MiB in the dtypes below: over ALIGNED_FROM_BYTES


def test_the_large_shape_is_large():
    assert np.prod(LARGE) * 2 >= _host_memory.ALIGNED_FROM_BYTES


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
def test_large_arrays_are_aligned_contiguous_writeable_and_disjoint(dtype):
    arrays = [_host_memory.empty(LARGE, dtype) for _ in range(3)]
    for value, array in enumerate(arrays):
        assert array.shape == LARGE and array.dtype == np.dtype(dtype)
        assert array.ctypes.data % _host_memory.ALIGNMENT == 0
        assert array.flags.c_contiguous and array.flags.writeable
        array[...] = value
    for value, array in enumerate(arrays):  # every element written, none shared with another array
        assert np.all(array == value)


def test_small_arrays_are_plain_numpy_arrays():
    array = _host_memory.empty((3, 5), np.float32)
    assert array.shape == (3, 5) and array.dtype == np.float32 and array.flags.owndata


def test_an_allocator_makes_a_new_array_per_call():
    new = _host_memory.allocator(LARGE, np.float32)
    first, second = new(), new()
    assert first.ctypes.data != second.ctypes.data


def _checked_path(*args, **kwargs):
    raise AssertionError("a call on a known numpy layout took the checked path")


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_functional_outputs_are_aligned_on_both_paths_and_right(dtype, monkeypatch):
    rng = np.random.default_rng(4)
    _known_layouts._runners.clear()
    calls = {}
    for path in ("checked", "known layout"):
        inputs = reference.make_batch_norm_inputs((4, 256, 1024), dtype, rng)
        calls[path] = inputs, ip.batch_norm_backward(*inputs.values())
        monkeypatch.setattr(_functional, "as_tensor", _checked_path)  # the next call must take the known layout
    monkeypatch.undo()
    for path, (inputs, results) in calls.items():
        assert results[0].ctypes.data % _host_memory.ALIGNMENT == 0, path
        expected = [np.empty_like(result) for result in results]
        with ip.Handle("cpu") as handle, ip.BatchNormBackward(handle, *expected, *inputs.values()) as operator:
            operator(*expected, *inputs.values())
        for result, want in zip(results, expected):
            assert np.array_equal(result, want), path
