"""DeviceArray outputs leave the package without a copy: ``__dlpack__`` (torch, JAX, cupy, numpy) and, on NVIDIA,
``__cuda_array_interface__``. An exported array's memory stays out of the cache until the consumer lets it go.
The CPU device's tests run everywhere; the NVIDIA ones where a GPU or the CPU emulation of CUDA is usable."""

import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest

import infiniop_py
from infiniop_py import _dlpack, reference
from infiniop_py._device_memory import DeviceArray
from _devices import EMULATED_CUDA
from _dlpack import DLPackOnly
from _helpers import BF16, F32, RMS_NORM


@pytest.fixture(autouse=True)
def _no_exports_left():
    yield
    gc.collect()
    assert not _dlpack._exports, "an export outlived its consumer"


def test_numpy_gets_the_arrays_memory_and_keeps_it_from_the_cache():
    array = DeviceArray.from_numpy(np.arange(12, dtype=F32).reshape(3, 4), "cpu")
    view = np.from_dlpack(array)
    view[1, 2] = -5  # the same memory, writable
    assert array.to_numpy()[1, 2] == -5
    address = array.buffer.address
    del array
    gc.collect()
    assert DeviceArray((3, 4), F32, "cpu").buffer.address != address  # still the view's
    np.testing.assert_array_equal(view[0], [0, 1, 2, 3])
    del view
    gc.collect()
    assert DeviceArray((3, 4), F32, "cpu").buffer.address == address  # given back when numpy let it go


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_torch_takes_a_channels_last_array_of_float32_or_bfloat16(dtype):
    torch = pytest.importorskip("torch", reason="torch is the consumer here (the [torch] extra)")
    values = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(dtype)
    host = np.ascontiguousarray(values.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # channels-last
    strides = tuple(stride // host.itemsize for stride in host.strides)
    array = DeviceArray(host.shape, dtype, "cpu", strides=strides)
    ctypes.memmove(array.buffer.address, host.ctypes.data, host.nbytes)  # CPU device memory is host memory
    tensor = torch.from_dlpack(array)
    assert tensor.stride() == strides
    assert tensor.dtype == {F32: torch.float32, BF16: torch.bfloat16}[dtype]
    np.testing.assert_array_equal(tensor.float().numpy(), values.astype(np.float32))


def test_an_exported_array_cannot_be_closed_under_its_consumer():
    array = DeviceArray((6,), F32, "cpu")
    view = np.from_dlpack(array)
    with pytest.raises(BufferError, match="consumer still uses"):
        array.close()
    view[:] = 1  # still this array's memory, not a block handed on
    del view
    gc.collect()
    array.close()
    assert array.buffer.closed


def test_a_capsule_nobody_takes_lets_the_array_go():
    array = DeviceArray((5,), F32, "cpu")
    capsules = [array.__dlpack__(), array.__dlpack__(max_version=(1, 0)), array.__dlpack__(max_version=(1, 3))]
    assert [_capsule_name(c) for c in capsules] == ["dltensor", "dltensor_versioned", "dltensor_versioned"]
    assert array.__dlpack__(max_version=(0, 8)) is not None  # a 0.x consumer: the legacy capsule
    del capsules  # their destructors release the exports (the fixture checks)


def _capsule_name(capsule):
    return repr(capsule).split('"')[1]


def test_what_cannot_be_exported_is_refused_with_the_reason():
    array = DeviceArray((2, 2), F32, "cpu")
    assert array.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError, match="cannot export to DLPack device"):
        array.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="copy=True"):
        array.__dlpack__(copy=True)
    assert not hasattr(array, "__cuda_array_interface__")  # host memory: not a CUDA array
    array.close()
    with pytest.raises(infiniop_py.ClosedError):
        array.__dlpack__()


# ---------------------------------------------------------------------------------------------- NVIDIA


@pytest.mark.nvidia
@pytest.mark.parametrize("protocol", ["dlpack", "cuda_array_interface"])
def test_gpu_outputs_go_back_in_through_either_protocol(protocol):
    """Outputs of a call on DeviceArrays, handed to the package again as another library's arrays would be: the
    package's reader of each protocol sees what the exporter wrote (device, dtype, shape, strides, data)."""
    rng = np.random.default_rng(3)
    inputs = RMS_NORM.make_inputs(rng, (16, 48), F32)
    outputs = infiniop_py.rms_norm_backward(*[DeviceArray.from_numpy(a, "nvidia") for a in inputs])
    assert all(isinstance(o, DeviceArray) for o in outputs)
    grad_x, grad_w = outputs
    wrap = DLPackOnly if protocol == "dlpack" else CudaArrayInterfaceOnly
    # grad_x as the next call's grad_y and x, grad_w as its weight: all read through the protocol.
    again = infiniop_py.rms_norm_backward(wrap(grad_x), wrap(grad_x), wrap(grad_w))
    gx, gw = grad_x.to_numpy(), grad_w.to_numpy()
    for got, want in zip(again, infiniop_py.rms_norm_backward(gx, gx, gw)):
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6, atol=1e-6)


class CudaArrayInterfaceOnly:
    def __init__(self, array):
        self.__cuda_array_interface__ = array.__cuda_array_interface__
        self.array = array  # keeps the memory


@pytest.mark.nvidia
def test_gpu_array_protocol_fields():
    array = DeviceArray((4, 6), np.float16, "nvidia", strides=(1, 4))
    assert array.__dlpack_device__() == (2, 0)
    interface = array.__cuda_array_interface__
    assert interface == {"shape": (4, 6), "typestr": "<f2", "data": (array.buffer.address, False),
                         "strides": (2, 8), "version": 3, "stream": 1}
    assert DeviceArray((4, 6), F32, "nvidia").__cuda_array_interface__["strides"] is None
    with pytest.raises(AttributeError, match="bfloat16"):
        DeviceArray((4,), ml_dtypes.bfloat16, "nvidia").__cuda_array_interface__
    with pytest.raises(ValueError, match="stream: 0 is ambiguous"):
        array.__dlpack__(stream=0)


@pytest.mark.nvidia
@pytest.mark.parametrize("stream, waits", [(None, False), (1, False), (-1, False), (2, True), (0x5000, True)])
def test_gpu_export_orders_another_stream_after_the_default_one(stream, waits, tmp_path, monkeypatch):
    """The package writes DeviceArrays on the legacy default stream: a consumer's other stream is made to wait for
    it through an event, and the host does not wait (counted through the emulation's trace)."""
    if not EMULATED_CUDA:
        pytest.skip("counts CUDA runtime calls through the CPU emulation's trace; a GPU's runtime keeps no record")
    array = DeviceArray((8,), F32, "nvidia")
    trace = tmp_path / "trace"
    monkeypatch.setenv("INFINIOP_EMULATED_CUDA_TRACE", str(trace))
    capsule = array.__dlpack__(stream=stream, max_version=(1, 0))
    monkeypatch.delenv("INFINIOP_EMULATED_CUDA_TRACE")
    calls = trace.read_text().split() if trace.exists() else []
    assert not {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"} & set(calls), calls
    ordering = ["cudaEventCreateWithFlags", "cudaEventRecord", "cudaStreamWaitEvent", "cudaEventDestroy"]
    assert [call for call in calls if call.startswith(("cudaEvent", "cudaStreamWait"))] == (ordering if waits else [])
    del capsule


@pytest.mark.nvidia
@pytest.mark.torch_cuda
def test_torch_reads_gpu_outputs_on_its_side_stream():
    """torch.from_dlpack on a side stream passes that stream: the export orders it after the default stream where
    the package wrote the outputs, so torch reads them without a synchronize of its own."""
    import torch

    rng = np.random.default_rng(9)
    inputs = RMS_NORM.make_inputs(rng, (512, 1024), F32)
    expected = infiniop_py.rms_norm_backward(*inputs)
    side = torch.cuda.Stream()
    for _ in range(3):  # fresh outputs each time, from the cache
        grad_x, grad_w = infiniop_py.rms_norm_backward(*[DeviceArray.from_numpy(a, "nvidia") for a in inputs])
        with torch.cuda.stream(side):
            copies = [torch.from_dlpack(array).clone() for array in (grad_x, grad_w)]
        side.synchronize()
        for got, want in zip(copies, expected):
            assert reference.relative_error(got.cpu().numpy(), want) < 5e-5  # the CPU's: both F32 sums
