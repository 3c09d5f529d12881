"""_devices moves numpy test data to a device and back with the layout and values intact. Checked here with torch
CPU tensors standing in for CUDA ones, so the helper the GPU variants rely on is tested on every machine."""

import numpy as np
import pytest

from _devices import CudaArrayView, _dense_to_numpy, _place, _to_numpy
from _helpers import F64, FREE_LAYOUTS, INPUT_ROW_LAYOUTS, SUPPORTED_DTYPES, GuardedOutput, at_vector_offset, \
    with_batch_layout, with_free_layout, with_row_layout

torch = pytest.importorskip("torch")


def _values_seen_by_the_package(device_array):
    """The element values a consumer reads through the object's layout, as float64."""
    if isinstance(device_array, CudaArrayView):
        interface = device_array.__cuda_array_interface__  # host memory here: read it as numpy would
        holder = type("Interface", (), {"__array_interface__": interface})()
        return np.asarray(holder).view(device_array.dtype).astype(np.float64)
    return device_array.to(torch.float64).numpy()


def _layouts():
    for layout in INPUT_ROW_LAYOUTS:
        yield f"rows-{layout}", lambda values, layout=layout: with_row_layout(values, layout)
    for layout in FREE_LAYOUTS:
        yield f"free-{layout}", lambda values, layout=layout: with_free_layout(values, layout)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("name,make", list(_layouts()), ids=[name for name, _ in _layouts()])
def test_placed_arrays_keep_values_and_layout(dtype, name, make):
    values = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(dtype)
    array = make(values)

    placed = _place(array, "cpu")

    assert np.array_equal(_values_seen_by_the_package(placed.device_array), array.astype(np.float64))
    if min(array.strides) >= 0:  # a torch tensor with the same strides (negative ones: see _devices._place)
        assert tuple(placed.device_array.stride()) == tuple(s // array.itemsize for s in array.strides)


@pytest.mark.parametrize("offset", [0, 2, 8, 14])
def test_placed_arrays_keep_their_offset_from_the_16_byte_grid(offset):
    """So a host array off the grid reaches the kernels' paths for unaligned bases on the device too."""
    array = at_vector_offset(np.arange(4 * 520, dtype=np.float16).reshape(4, 520), offset)[:, :512]

    placed = _place(array, "cpu")

    assert placed.device_array.data_ptr() % 16 == offset
    assert np.array_equal(placed.device_array.numpy(), array)


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "padded", "reversed"])
def test_write_back_copies_device_results_into_the_host_view_only(dtype, layout):
    guarded = GuardedOutput((2, 3, 4), dtype, layout)
    placed = _place(guarded.view, "cpu")
    result = np.arange(24, dtype=np.float64).reshape(2, 3, 4).astype(dtype)

    if isinstance(placed.device_array, CudaArrayView):  # write through the view's own layout
        storage = placed.device_array.storage.numpy().view(dtype)
        offset = placed.device_array.byte_offset // guarded.view.itemsize
        np.lib.stride_tricks.as_strided(storage[offset:], guarded.view.shape, guarded.view.strides)[...] = result
    else:
        placed.device_array.copy_(torch.from_numpy(result.view(np.int16)).view(placed.device_array.dtype)
                                  if dtype.name == "bfloat16" else torch.from_numpy(result))
    placed.write_back()

    assert np.array_equal(guarded.view.astype(np.float64), result.astype(np.float64))
    guarded.assert_only_view_written()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=str)
def test_to_numpy_keeps_dtype_and_bits(dtype):
    values = np.random.default_rng(1).standard_normal((4, 6)).astype(dtype)
    tensor = _place(values, "cpu").device_array

    back = _to_numpy(tensor)

    assert back.dtype == dtype and back.tobytes() == values.tobytes()


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES + (F64,), ids=str)
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 1, 4, 5), (0, 3, 4, 5)], ids=str)
def test_dense_outputs_come_back_with_their_values_and_strides(dtype, layout, shape):
    """What fetch does with an output the package allocated: F64 too, and channels-last (BatchNorm's grad_input)."""
    values = np.random.default_rng(1).standard_normal(shape).astype(dtype)
    array = with_batch_layout(values, layout)

    fetched = _dense_to_numpy(_place(array, "cpu").device_array)

    assert fetched.dtype == array.dtype and fetched.strides == array.strides
    assert np.array_equal(fetched.astype(np.float64), values.astype(np.float64))
