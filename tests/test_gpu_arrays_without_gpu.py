"""The package's GPU array paths, checked without a GPU through fake objects that report device memory: the device
is inferred from the arguments, the right Handle is asked for, mixed devices and read-only outputs are refused,
and streams and device buffers are handled as a GPU needs. Nothing here dereferences device memory."""

import sys
import types

import ml_dtypes
import numpy as np
import pytest

import infiniop_py
from infiniop_py import _device_memory, _functional, handle as handle_module
from infiniop_py._ffi import ffi
from infiniop_py._operator import _stream_pointer
from _devices import nvidia_unusable_reason
from _dlpack import KDL_CUDA, DLPackView

# No GPU: DEVICE_NOT_FOUND from a CUDA build, DEVICE_TYPE_NOT_SUPPORTED from a build without nvcc.
NVIDIA_ABSENT = (infiniop_py.DeviceNotFoundError, infiniop_py.DeviceTypeNotSupportedError)
needs_no_gpu = pytest.mark.skipif(nvidia_unusable_reason() is None, reason="an NVIDIA GPU is usable here: the fake "
                                  "arrays would reach real kernels")

FAKE_ADDRESS = 0x1000  # never dereferenced: every call below fails before the run


class FakeCudaArray:
    """An array on NVIDIA device ``device_id`` as cupy or numba present one."""

    def __init__(self, shape, dtype=np.float32, device_id=None, readonly=False):
        self.__cuda_array_interface__ = {"version": 3, "shape": tuple(shape), "typestr": np.dtype(dtype).str,
                                         "strides": None, "data": (FAKE_ADDRESS, readonly), "stream": None}
        if device_id is not None:
            self.device = types.SimpleNamespace(id=device_id)


class FakeDLPackOnRocm:
    """A DLPack producer on a device the package has no path for (CUDA memory: test_dlpack_device.py)."""

    def __dlpack__(self, **kwargs):
        raise AssertionError("the data must not be taken")

    def __dlpack_device__(self):
        return 10, 0  # kDLROCM, device 0


@needs_no_gpu
@pytest.mark.parametrize("device_id", [None, 1])
def test_functional_api_asks_for_the_nvidia_handle_of_its_arrays(device_id):
    arrays = [FakeCudaArray((4, 8), device_id=device_id), FakeCudaArray((4, 8), device_id=device_id),
              FakeCudaArray((8,), device_id=device_id)]
    out = (FakeCudaArray((4, 8), device_id=device_id), FakeCudaArray((8,), device_id=device_id))

    with pytest.raises(NVIDIA_ABSENT, match=rf"infinirtSetDevice\(nvidia, {device_id or 0}\)"):
        infiniop_py.rms_norm_backward(*arrays, out=out)


def test_arrays_on_two_devices_are_refused_naming_the_tensor():
    grad_y, w = np.ones((4, 8), np.float32), np.ones(8, np.float32)

    with pytest.raises(ValueError, match=r"^x: the array is on nvidia:0, but the handle is on cpu:0"):
        infiniop_py.rms_norm_backward(grad_y, FakeCudaArray((4, 8)), w)


def test_operator_object_refuses_gpu_arrays_on_a_cpu_handle(cpu_handle):
    arrays = [np.ones((4, 8), np.float32), np.ones(8, np.float32), np.ones((4, 8), np.float32),
              np.ones((4, 8), np.float32), np.ones(8, np.float32)]
    with infiniop_py.RMSNormBackward(cpu_handle, *arrays) as operator:
        arrays[3] = FakeCudaArray((4, 8))
        with pytest.raises(ValueError, match="^x: the array is on nvidia:0"):
            operator(*arrays)


def test_read_only_gpu_output_is_refused(cpu_handle):
    inputs = [np.ones((4, 8), np.float32), np.ones((4, 8), np.float32), np.ones(8, np.float32)]
    with pytest.raises(ValueError, match="^grad_x: the output array is read-only"):
        infiniop_py.rms_norm_backward(*inputs, out=(FakeCudaArray((4, 8), readonly=True), np.empty(8, np.float32)))


def test_dlpack_object_on_another_device_type_is_a_type_error():
    with pytest.raises(TypeError, match="grad_y: FakeDLPackOnRocm lives on DLPack device type 10"):
        infiniop_py.rms_norm_backward(FakeDLPackOnRocm(), np.ones((4, 8), np.float32), np.ones(8, np.float32))


@needs_no_gpu
def test_cupy_inputs_get_cupy_outputs_on_their_device_and_cupy_stream(monkeypatch):
    """A cupy array has no new_empty: outputs come from cupy.empty on the array's device, and the run goes on
    cupy's current stream."""
    made, devices = [], []
    fake_cupy = types.ModuleType("cupy")
    fake_cupy.empty = lambda shape, dtype: (made.append((tuple(shape), np.dtype(dtype)))  # on the device entered last
                                            or CupyArray(shape, dtype, device_id=devices[-1]))
    fake_cupy.cuda = types.SimpleNamespace(
        Device=lambda index: _Recorder(devices, index),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x5000))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    CupyArray = type("ndarray", (FakeCudaArray,), {"__module__": "cupy._core.core"})
    inputs = [CupyArray((4, 8), device_id=1), CupyArray((4, 8), device_id=1), CupyArray((8,), device_id=1)]

    with pytest.raises(NVIDIA_ABSENT, match=r"infinirtSetDevice\(nvidia, 1\)"):
        infiniop_py.rms_norm_backward(*inputs)

    assert made == [((4, 8), np.dtype(np.float32)), ((8,), np.dtype(np.float32))]
    assert set(devices) == {1}
    stream = _functional.library_stream(infiniop_py.tensors.as_tensor(inputs[0], "x"))
    assert int(ffi.cast("uintptr_t", _stream_pointer(stream))) == 0x5000


def _dlpack_cuda_view(shape, dtype, device_id):  # host memory claimed to be CUDA's: nothing here reads it
    return DLPackView.of_numpy(np.zeros(shape, dtype), KDL_CUDA, device_id)


@pytest.mark.parametrize("make, dtype", [(FakeCudaArray, np.float16), (_dlpack_cuda_view, ml_dtypes.bfloat16)],
                         ids=["cuda_array_interface", "dlpack"])
def test_other_device_arrays_get_device_array_outputs_on_their_device(monkeypatch, make, dtype):
    """A device array of a library the package cannot allocate with (numba's, JAX's through DLPack, say): the
    outputs are DeviceArrays on its device, not objects built from the array's own type."""
    made = []

    class Stop(Exception):
        pass

    class RecordedDeviceArray:
        def __init__(self, shape, dtype, device, device_id=0):
            made.append((tuple(shape), np.dtype(dtype), device, device_id))
            if len(made) == 2:
                raise Stop  # before anything runs

    monkeypatch.setattr(_functional, "DeviceArray", RecordedDeviceArray)
    inputs = [make((4, 8), dtype, device_id=1), make((4, 8), dtype, device_id=1), make((8,), dtype, device_id=1)]
    with pytest.raises(Stop):
        infiniop_py.rms_norm_backward(*inputs)
    assert made == [((4, 8), np.dtype(dtype), "nvidia", 1), ((8,), np.dtype(dtype), "nvidia", 1)]


class _Recorder:
    def __init__(self, devices, index):
        devices.append(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


@pytest.mark.parametrize("stream, address", [
    (None, 0), (0x1234, 0x1234), (np.uint64(0x1234), 0x1234),
    (types.SimpleNamespace(cuda_stream=0x2000), 0x2000),  # torch.cuda.Stream
    (types.SimpleNamespace(ptr=0x3000), 0x3000),  # cupy.cuda.Stream
])
def test_stream_forms(stream, address):
    assert int(ffi.cast("uintptr_t", _stream_pointer(stream))) == address


def test_stream_of_another_kind_is_a_type_error():
    with pytest.raises(TypeError, match="stream: expected None"):
        _stream_pointer("default")


def test_device_buffer_is_freed_on_its_own_device(monkeypatch):
    """infinirtFree works through the thread's current device: a GPU buffer freed while the CPU is current must be
    freed with its device selected (fake runtime: no GPU needed)."""
    calls = []

    class FakeRuntime:
        current = (0, 0)

        def infinirtGetDevice(self, device, device_id):
            device[0], device_id[0] = self.current
            return 0

        def infinirtSetDevice(self, device, device_id):
            self.current = (device, device_id)
            return 0

        def infinirtMalloc(self, pointer, nbytes):
            pointer[0] = ffi.cast("void *", FAKE_ADDRESS)
            return 0

        def infinirtFree(self, pointer):
            calls.append((self.current, int(ffi.cast("uintptr_t", pointer))))
            return 0

    runtime = FakeRuntime()
    fake_libraries = lambda: types.SimpleNamespace(rt=runtime)  # noqa: E731
    monkeypatch.setattr(_device_memory, "libraries", fake_libraries)
    monkeypatch.setattr(handle_module, "libraries", fake_libraries)

    buffer = _device_memory.DeviceBuffer("nvidia", 1, 64)
    assert runtime.current == (0, 0)  # allocation restored the CPU
    buffer.close()

    assert calls == [((1, 1), FAKE_ADDRESS)] and runtime.current == (0, 0)


def test_channels_last_cupy_input_gets_a_cupy_grad_input_in_its_layout(monkeypatch):
    """BatchNorm's kernels take grad_input laid out as input: a channels-last cupy input gets it from
    cupy.empty_like (order "K" keeps the layout) on the input's device, a cupy array like its others (it had been a
    DeviceArray)."""
    made, devices = [], []

    class Stop(Exception):
        pass

    def empty_like(array):
        made.append((array, devices[-1]))
        raise Stop  # before anything runs

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.empty_like = empty_like
    fake_cupy.cuda = types.SimpleNamespace(Device=lambda index: _Recorder(devices, index))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    CupyArray = type("ndarray", (FakeCudaArray,), {"__module__": "cupy._core.core"})
    x, grad_output = CupyArray((2, 3, 4, 5), device_id=1), CupyArray((2, 3, 4, 5), device_id=1)
    for array in (x, grad_output):
        array.__cuda_array_interface__["strides"] = (240, 4, 60, 12)  # NHWC, F32 bytes
    statistics = [CupyArray((3,), device_id=1) for _ in range(4)]

    with pytest.raises(Stop):
        infiniop_py.batch_norm_backward(x, grad_output, *statistics[:3], save_mean=statistics[3],
                                        save_invstd=statistics[3])

    assert made == [(x, 1)]
