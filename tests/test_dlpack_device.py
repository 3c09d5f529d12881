"""DLPack producers of CUDA memory (kDLCUDA, e.g. JAX GPU arrays) become "nvidia" TensorRefs, read from the
versioned (DLPack 1.x) or the legacy capsule; what the package cannot take is refused naming the argument; and
host-memory DLPack (numpy, torch, the test producer) still goes through numpy.from_dlpack. CPU only: the
addresses the CUDA views report are never dereferenced (every call below fails before a run)."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

import infiniop_py
from infiniop_py import _dlpack as _dlpack_reader, _functional, dtypes
from infiniop_py.tensors import as_tensor
from _devices import nvidia_unusable_reason
from _dlpack import (IS_COPIED, KDL_BFLOAT, KDL_COMPLEX, KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_FLOAT,
                     KDL_ROCM, DLPackOnly, DLPackView)

# No GPU: DEVICE_NOT_FOUND from a CUDA build, DEVICE_TYPE_NOT_SUPPORTED from a build without nvcc.
NVIDIA_ABSENT = (infiniop_py.DeviceNotFoundError, infiniop_py.DeviceTypeNotSupportedError)
needs_no_gpu = pytest.mark.skipif(nvidia_unusable_reason() is None, reason="an NVIDIA GPU is usable here: the fake "
                                  "addresses would reach real kernels")

ADDRESS = 0x10000  # never dereferenced
DTYPES = [(np.float16, dtypes.F16), (ml_dtypes.bfloat16, dtypes.BF16), (np.float32, dtypes.F32),
          (np.float64, dtypes.F64)]

_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype, _capsule_is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]


def cuda_view(shape, dtype=np.float32, strides=None, device_id=0, **options):
    return DLPackView(ADDRESS, shape, strides, dtype, KDL_CUDA, device_id, **options)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("dtype, code", DTYPES, ids=lambda value: getattr(value, "__name__", str(value)))
def test_cuda_view_is_an_nvidia_tensor_ref(versioned, dtype, code):
    view = cuda_view((3, 4), dtype, device_id=1, versioned=versioned)

    ref = as_tensor(view, "x")

    assert (ref.data, ref.device, ref.device_id, ref.dtype, ref.itemsize, ref.shape, ref.strides) == (
        ADDRESS, "nvidia", 1, code, np.dtype(dtype).itemsize, (3, 4), (4, 1))
    view_kept, capsule = ref.owner
    assert view_kept is view
    # The capsule the package read, not consumed (not renamed "used_..."): the producer still owns it.
    assert _capsule_is_valid(capsule, b"dltensor_versioned" if versioned else b"dltensor")
    # The versioned protocol first, an old producer's TypeError for max_version leading to a call without it;
    # stream 1, the legacy default stream where the package runs such arrays (None would make JAX wait on the host).
    assert view.requests == [{"stream": 1, "max_version": (1, 0)} if versioned else {"stream": 1}]


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("shape, strides, byte_offset, expected_strides", [
    ((3, 4), (1, 3), 0, (1, 3)),  # a transposed (Fortran-order) view
    ((3, 4), (8, 2), 64, (8, 2)),  # every other column of a wider array, at an offset
    ((3, 4), (-4, 1), 32, (-4, 1)),  # rows reversed
    ((2, 3, 4), (12, 4, 1), 16, (12, 4, 1)),
    ((0, 4), (9, 9), 0, (4, 1)),  # no elements: no layout to keep
    ((), None, 8, ()),
])
def test_cuda_view_strides_and_offset(versioned, shape, strides, byte_offset, expected_strides):
    view = cuda_view(shape, np.float16, strides, byte_offset=byte_offset, versioned=versioned)

    ref = as_tensor(view, "x")

    assert (ref.data, ref.shape, ref.strides) == (ADDRESS + byte_offset, shape, expected_strides)


def test_read_only_cuda_view_is_an_input_but_not_an_output():
    view = cuda_view((3, 4), read_only=True)

    assert as_tensor(view, "x").data == ADDRESS
    with pytest.raises(ValueError, match="^grad_x: the output array is read-only$"):
        as_tensor(view, "grad_x", writable=True)


def test_read_only_cuda_output_is_refused_by_the_functional_api():
    inputs = [np.ones((4, 8), np.float32), np.ones((4, 8), np.float32), np.ones(8, np.float32)]
    with pytest.raises(ValueError, match="^grad_x: the output array is read-only"):
        infiniop_py.rms_norm_backward(*inputs, out=(cuda_view((4, 8), read_only=True), np.empty(8, np.float32)))


def test_a_copy_exported_for_an_output_is_refused():
    """A producer that exported a copy (IS_COPIED) would never see the output's values."""
    view = cuda_view((3, 4), flags=IS_COPIED)

    assert as_tensor(view, "x").data == ADDRESS
    with pytest.raises(ValueError, match="^y: the producer exported a copy"):
        as_tensor(view, "y", writable=True)


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("dtype, message", [
    ((KDL_FLOAT, 8, 1), "DLPack dtype code 2 with 8 bits is not supported"),
    ((KDL_BFLOAT, 32, 1), "DLPack dtype code 4 with 32 bits is not supported"),
    ((KDL_COMPLEX, 64, 1), "DLPack dtype code 5 with 64 bits is not supported"),
    ((KDL_FLOAT, 32, 4), r"DLPack dtype \(code 2, bits 32\) has 4 lanes"),
])
def test_unsupported_dtypes_are_refused_naming_the_argument(versioned, dtype, message):
    with pytest.raises(infiniop_py.BadTensorDtypeError, match=f"^grad_y: {message}"):
        as_tensor(cuda_view((3, 4), dtype, versioned=versioned), "grad_y")


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_])
def test_integer_arrays_reach_the_operators_dtype_rule_as_numpy_ones_do(dtype):
    """A uint8 workspace is taken; an integer tensor is refused by the operator's rule, which names it."""
    assert as_tensor(cuda_view((3, 4), dtype), "x").dtype == as_tensor(np.zeros((3, 4), dtype), "x").dtype


@pytest.mark.parametrize("device_type", [KDL_ROCM, KDL_CUDA_HOST])
def test_other_device_types_are_refused_without_taking_the_data(device_type):
    view = DLPackView(ADDRESS, (3, 4), None, np.float32, device_type)

    with pytest.raises(TypeError, match=f"^w: DLPackView lives on DLPack device type {device_type}; only host "):
        as_tensor(view, "w")
    assert view.requests == []


def test_capsule_of_an_unknown_major_version_is_refused():
    with pytest.raises(ValueError, match=r"^x: the DLPack capsule has version 2\.0; this package reads 1\.x"):
        as_tensor(cuda_view((3, 4), version=(2, 0)), "x")


def test_a_newer_minor_version_is_read():
    assert as_tensor(cuda_view((3, 4), version=(1, 3)), "x").shape == (3, 4)


def test_capsule_that_disagrees_with_dlpack_device_is_refused():
    class Disagreeing(DLPackView):
        def __dlpack_device__(self):
            return KDL_CUDA, 0

    view = Disagreeing(ADDRESS, (3, 4), None, np.float32, KDL_ROCM)
    with pytest.raises(ValueError, match=r"^x: the DLPack capsule's tensor is on device type 10"):
        as_tensor(view, "x")


def _real_producers():
    yield "numpy", lambda array: array
    try:
        import torch
    except ImportError:
        return
    yield "torch", torch.from_numpy


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("producer", [name for name, _ in _real_producers()])
def test_the_reader_agrees_with_real_producers_capsules(monkeypatch, producer, versioned):
    """The package's struct layouts against capsules numpy and torch make (host memory, read as if kDLCUDA:
    the reader checks the capsule's device type against the one it takes)."""
    make = dict(_real_producers())[producer]
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    view = base[1::2, ::-1][:, 1:6] if producer == "numpy" else base[1::2, 2:7]  # torch has no negative strides
    array = make(view)
    capsule = array.__dlpack__(max_version=(1, 0)) if versioned else array.__dlpack__()
    monkeypatch.setattr(_dlpack_reader, "CUDA", KDL_CPU)

    data, device_id, code, itemsize, shape, strides = _dlpack_reader.read(capsule, "x", writable=True)

    assert (data, device_id, code, itemsize) == (view.ctypes.data, 0, dtypes.F32, 4)
    assert (shape, strides) == (view.shape, tuple(stride // 4 for stride in view.strides))
    if versioned and producer == "numpy":
        view.flags.writeable = False
        with pytest.raises(ValueError, match="^x: the output array is read-only$"):
            _dlpack_reader.read(view.__dlpack__(max_version=(1, 0)), "x", writable=True)


def test_cuda_view_runs_on_the_default_stream():
    assert _functional.library_stream(as_tensor(cuda_view((3, 4)), "x")) is None


@needs_no_gpu
@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("with_out", [True, False], ids=["out", "fresh-outputs"])
def test_functional_api_asks_for_the_nvidia_handle_of_the_views_device(versioned, with_out):
    inputs = [cuda_view((4, 8), device_id=1, versioned=versioned), cuda_view((4, 8), device_id=1, versioned=versioned),
              cuda_view((8,), device_id=1, versioned=versioned)]
    out = (cuda_view((4, 8), device_id=1), cuda_view((8,), device_id=1)) if with_out else None

    with pytest.raises(NVIDIA_ABSENT, match=r"infinirtSetDevice\(nvidia, 1\)"):
        infiniop_py.rms_norm_backward(*inputs, out=out)


def test_cuda_view_and_host_arrays_together_are_refused_naming_the_tensor():
    grad_y, w = np.ones((4, 8), np.float32), np.ones(8, np.float32)

    with pytest.raises(ValueError, match=r"^x: the array is on nvidia:0, but the handle is on cpu:0"):
        infiniop_py.rms_norm_backward(grad_y, cuda_view((4, 8)), w)


# Host memory through DLPack: numpy.from_dlpack, as before.

def _rms_norm_backward_inputs():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(shape).astype(np.float32) for shape in ((4, 8), (4, 8), (8,))]


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
def test_host_memory_view_goes_through_numpy(versioned):
    arrays = _rms_norm_backward_inputs()
    views = [DLPackView.of_numpy(array, KDL_CPU, versioned=versioned) for array in arrays]

    ref = as_tensor(views[0], "grad_y")
    assert (ref.data, ref.device, ref.shape, ref.strides) == (arrays[0].ctypes.data, "cpu", (4, 8), (8, 1))
    for got, expected in zip(infiniop_py.rms_norm_backward(*views), infiniop_py.rms_norm_backward(*arrays)):
        np.testing.assert_array_equal(got, expected)


def test_read_only_host_memory_view_is_refused_as_an_output():
    target = np.empty((4, 8), np.float32)
    with pytest.raises(ValueError, match="^grad_x: the output array is read-only"):
        as_tensor(DLPackView.of_numpy(target, KDL_CPU, read_only=True), "grad_x", writable=True)


def test_torch_cpu_tensor_and_numpy_array_through_dlpack():
    torch = pytest.importorskip("torch")
    arrays = _rms_norm_backward_inputs()
    expected = infiniop_py.rms_norm_backward(*arrays)
    for wrapped in ([DLPackOnly(array) for array in arrays], [DLPackOnly(torch.from_numpy(a)) for a in arrays]):
        assert as_tensor(wrapped[0], "grad_y").device == "cpu"
        for got, want in zip(infiniop_py.rms_norm_backward(*wrapped), expected):
            np.testing.assert_array_equal(got, want)
