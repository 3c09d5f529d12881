"""How arrays enter the package: byte strides become element strides, empty arrays are
contiguous whatever numpy reports, foreign objects go through the array protocols, and
DeviceArray runs on the CPU device through infinirt memory."""


import numpy as np
import pytest

import infiniop_py
from infiniop_py import dtypes, reference
from infiniop_py.tensors import as_tensor
from _dlpack import DLPackOnly


def test_numpy_byte_strides_become_element_strides():
    a = np.zeros((4, 6), np.float32)[::2, ::-3]
    ref = as_tensor(a, "a")
    assert ref.strides == (12, -3)
    assert ref.dtype == dtypes.F32
    assert ref.data == a.__array_interface__["data"][0]


def test_stride_not_a_multiple_of_the_item_size_is_rejected():
    records = np.zeros(5, dtype=[("a", np.float32), ("b", np.int8)])
    with pytest.raises(infiniop_py.BadTensorStridesError, match=r"weights: byte stride 5 of dim 0"):
        as_tensor(records["a"], "weights")


def test_empty_arrays_get_contiguous_strides():
    empty = np.lib.stride_tricks.as_strided(np.empty(1, np.float32), shape=(0, 16), strides=(0, 0))
    assert as_tensor(empty, "e").strides == (16, 1)


def test_unsupported_dtype_names_the_tensor():
    with pytest.raises(infiniop_py.BadTensorDtypeError, match="^x: dtype F64"):
        infiniop_py.rms_norm_backward(np.ones((2, 4), np.float32), np.ones((2, 4)), np.ones(4, np.float32))
    with pytest.raises(infiniop_py.BadTensorDtypeError, match="^grad_y: dtype complex64"):
        infiniop_py.rms_norm_backward(np.ones((2, 4), np.complex64), np.ones((2, 4)), np.ones(4))


class ArrayInterfaceOnly:
    def __init__(self, array):
        self.array = array
        self.__array_interface__ = array.__array_interface__


@pytest.mark.parametrize("wrap", [ArrayInterfaceOnly, DLPackOnly])
def test_array_protocol_objects_are_used_without_copies(wrap):
    rng = np.random.default_rng(3)
    inputs = reference.make_rms_norm_inputs((3, 5, 32), np.float32, rng)
    grad_x, grad_w = np.zeros((3, 5, 32), np.float32), np.zeros(32, np.float32)
    infiniop_py.rms_norm_backward(*(wrap(a) for a in inputs.values()), out=(wrap(grad_x), wrap(grad_w)))
    expected = reference.rms_norm_backward(**inputs)
    assert reference.relative_error(grad_x, expected[0]) < 5e-5
    assert reference.relative_error(grad_w, expected[1]) < 5e-5


def test_device_array_on_the_cpu_device():
    rng = np.random.default_rng(4)
    inputs = reference.make_batch_norm_inputs((4, 3, 10), np.float32, rng)
    device_inputs = [infiniop_py.DeviceArray.from_numpy(a, "cpu") for a in inputs.values()]
    outputs = infiniop_py.batch_norm_backward(*device_inputs)
    assert all(isinstance(o, infiniop_py.DeviceArray) for o in outputs)
    for got, want in zip(outputs, reference.batch_norm_backward(**inputs)):
        assert reference.relative_error(got.to_numpy(), want) < 5e-5


@pytest.mark.parametrize("layout", ["C", "F", "channels_last", "gaps", "reversed"])
def test_from_numpy_keeps_a_dense_layout_and_packs_the_others(layout):
    """DeviceArray.from_numpy copies a dense array in its own layout (its element strides), so that outputs made
    like it keep that layout; an array with gaps or negative strides becomes C-contiguous. Values are kept."""
    base = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    array = {"C": base, "F": np.asfortranarray(base),
             "channels_last": np.ascontiguousarray(base.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
             "gaps": base[:, :, ::2], "reversed": base[::-1]}[layout]
    device_array = infiniop_py.DeviceArray.from_numpy(array, "cpu")
    kept = tuple(stride // array.itemsize for stride in array.strides)
    assert device_array.strides == (kept if layout in ("C", "F", "channels_last") else
                                    tuple(s // 4 for s in np.ascontiguousarray(array).strides))
    host = device_array.to_numpy()
    np.testing.assert_array_equal(host, array)
    assert host.strides == (array.strides if layout in ("C", "F", "channels_last") else
                            np.ascontiguousarray(array).strides)


def test_channels_last_device_arrays_get_outputs_in_their_layout():
    """A channels-last device array of a library the package cannot allocate with gets a DeviceArray grad_input
    (and y) in its layout, which BatchNorm's kernels need (a C-contiguous one was refused: BAD_TENSOR_STRIDES)."""
    rng = np.random.default_rng(5)
    inputs = reference.make_batch_norm_inputs((4, 3, 10), np.float32, rng)
    channels_last = {name: np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1) if a.ndim == 3 else a
                     for name, a in inputs.items()}
    device_inputs = [infiniop_py.DeviceArray.from_numpy(a, "cpu") for a in channels_last.values()]
    assert device_inputs[0].strides == (30, 1, 3)
    outputs = infiniop_py.batch_norm_backward(*device_inputs)
    assert outputs[0].strides == device_inputs[0].strides
    for got, want in zip(outputs, reference.batch_norm_backward(**inputs)):
        assert reference.relative_error(got.to_numpy(), want) < 5e-5
    x = device_inputs[0]
    y, _, save_invstd = infiniop_py.batch_norm(x, training=True, need_stats=True)
    assert isinstance(y, infiniop_py.DeviceArray) and y.strides == x.strides
    x64 = inputs["input"].astype(np.float64)
    expected = (x64 - x64.mean(axis=(0, 2), keepdims=True)) / np.sqrt(x64.var(axis=(0, 2), keepdims=True) + 1e-5)
    assert reference.relative_error(y.to_numpy(), expected) < 5e-5
    assert reference.relative_error(save_invstd.to_numpy(), 1 / np.sqrt(x64.var(axis=(0, 2)) + 1e-5)) < 5e-5


@pytest.mark.parametrize("strides", [(1, 1), (4, 2), (3,)])
def test_device_array_strides_must_be_dense(strides):
    with pytest.raises(ValueError, match=r"strides .* (densely|one entry per dim)"):
        infiniop_py.DeviceArray((2, 3), np.float32, "cpu", strides=strides)
