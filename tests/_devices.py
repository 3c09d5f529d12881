"""The suite on every device: the `device` parameter, why a device is unusable, and numpy test data moved to a
device and back.

Tests keep building numpy inputs and float64 references; `DeviceData(device)` puts each array on the device with
its layout (strides, padding, offsets, broadcast and negative strides) and writes device outputs back into the
numpy arrays they came from, so the checks after a call are the same on every device. On the CPU nothing moves.
"""

import ctypes
import functools
import os

import infiniop_py
import ml_dtypes
import numpy as np
import pytest

NVIDIA = 1  # infiniDevice_t
DEVICE_TYPE_NOT_SUPPORTED = 5

# Set by .ci/sanitize, beside INFINIOP_PY_LIBRARY_DIR naming a library built with `xmake f --nv-emulation=y`:
# its NVIDIA backend runs the CUDA kernels on the CPU (tests/native/cuda_emulation), and its "device memory" is host
# memory, which torch cannot see as CUDA memory. So the NVIDIA variants run, with their data placed through
# infinirt instead of torch.cuda, and what needs torch's CUDA skips, saying so.
EMULATED_CUDA = os.environ.get("INFINIOP_PY_TEST_EMULATED_CUDA") == "1"
EMULATED_CUDA_NO_TORCH = "needs torch.cuda, which the CPU emulation of CUDA (.ci/sanitize) has not"

# Parametrize a test (or a module, through pytestmark) over this; conftest.py skips "nvidia" with the reason
# nvidia_unusable_reason() gives.
DEVICES = ("cpu", pytest.param("nvidia", marks=pytest.mark.nvidia))


@functools.lru_cache(maxsize=None)
def nvidia_unusable_reason():
    """Why the NVIDIA variants cannot run here, or None when they can."""
    from infiniop_py._ffi import ffi, libraries

    count = ffi.new("int *")
    status = libraries().rt.infinirtGetDeviceCount(NVIDIA, count)
    if status == DEVICE_TYPE_NOT_SUPPORTED:
        return "no NVIDIA GPU: the library was built without the CUDA backend (no nvcc at build time)"
    if status != 0:
        return f"no NVIDIA GPU: infinirtGetDeviceCount(NVIDIA) fails with status {status}"
    if count[0] == 0:
        return "no NVIDIA GPU: the CUDA runtime finds no device (no GPU or no driver)"
    if EMULATED_CUDA:
        return None
    try:
        import torch
    except ImportError:
        return "no NVIDIA GPU for the tests: torch is not installed (they move data with torch.cuda)"
    if not torch.cuda.is_available():
        return f"no NVIDIA GPU for the tests: torch {torch.__version__} cannot use CUDA"
    return None


def _byte_span(array):
    """(lowest address, byte count) of the memory an array's elements occupy."""
    low = high = array.__array_interface__["data"][0]
    if array.size == 0:
        return low, 0
    for extent, stride in zip(array.shape, array.strides):
        reach = (extent - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return low, high - low + array.itemsize


# Device copies start at their host array's address modulo this, so a host array off the 16-byte grid reaches the
# kernels' element-wise paths for unaligned bases on the device too (their vector loads need 16-byte alignment).
_VECTOR_BYTES = 16


def _misalignment(host_address, device_address):
    """Bytes after device_address (< _VECTOR_BYTES) where a copy has host_address's offset from the 16-byte grid."""
    return (host_address - device_address) % _VECTOR_BYTES


def _host_bytes(address, nbytes):
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)) if nbytes else np.empty(0, np.uint8)


class CudaArrayView:
    """A strided view of torch device bytes, seen through __cuda_array_interface__ (torch refuses negative strides):
    a device array of a library the package does not know, so outputs allocated like it are DeviceArrays."""

    def __init__(self, storage, byte_offset, shape, byte_strides, dtype):
        self.storage, self.byte_offset = storage, byte_offset
        self.shape, self.byte_strides, self.dtype = tuple(shape), tuple(byte_strides), np.dtype(dtype)

    @property
    def __cuda_array_interface__(self):
        return {"version": 3, "shape": self.shape, "typestr": self.dtype.str, "strides": self.byte_strides,
                "data": (self.storage.data_ptr() + self.byte_offset, False), "stream": None}


def _torch_dtype(dtype):
    import torch
    return {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64,
            "uint8": torch.uint8}[np.dtype(dtype).name]  # uint8: workspaces


class _Placed:
    """One host array put on the device: what the package gets, and how to copy results back."""

    def __init__(self, host, device_array, write_back):
        self.host, self.device_array, self.write_back, self.output = host, device_array, write_back, False


def _place_emulated(array):
    """The device copy of a numpy array in the emulation's device memory (host memory through infinirt), handed over
    through DLPack as CUDA memory, as a JAX array would be."""
    from infiniop_py._device_memory import DeviceBuffer
    from _dlpack import KDL_CUDA, DLPackView

    low, nbytes = _byte_span(array)
    buffer = DeviceBuffer("nvidia", 0, nbytes + _VECTOR_BYTES)
    span = buffer.address + _misalignment(low, buffer.address)  # the span's copy, as (mis)aligned as the host's
    if nbytes:
        _host_bytes(span, nbytes)[...] = _host_bytes(low, nbytes)  # the whole span, gaps included
    start = array.__array_interface__["data"][0] - low
    element_strides = [stride // array.itemsize for stride in array.strides] if array.size else None
    device_array = DLPackView(span + start, array.shape, element_strides, array.dtype, KDL_CUDA, keep=buffer)

    def write_back():
        if nbytes:
            _host_bytes(low, nbytes)[...] = _host_bytes(span, nbytes)
    return _Placed(array, device_array, write_back)


def _place(array, torch_device):
    """The device copy of a numpy array on torch_device ("cuda"; "cpu" lets tests check this helper anywhere)."""
    if EMULATED_CUDA and torch_device == "cuda":
        return _place_emulated(array)
    import torch

    torch_dtype = _torch_dtype(array.dtype)
    if array.dtype.name == "bfloat16" and min(array.strides, default=0) < 0:
        # No device array protocol carries BF16 with negative strides (torch refuses them, and
        # __cuda_array_interface__ has no BF16 type), so this layout goes over packed; F16 and F32
        # cover negative strides on the device.
        packed = torch.from_numpy(array.copy(order="C").view(np.int16)).to(torch_device).view(torch_dtype)

        def write_back():
            array[...] = _to_numpy(packed)
        return _Placed(array, packed, write_back)

    low, nbytes = _byte_span(array)
    # The whole span, gaps included, after `pad` bytes that give its copy the host's misalignment (torch's buffers
    # are aligned).
    storage = torch.zeros(nbytes + _VECTOR_BYTES, dtype=torch.uint8, device=torch_device)
    pad = _misalignment(low, storage.data_ptr())
    if nbytes:
        storage[pad:pad + nbytes] = torch.from_numpy(_host_bytes(low, nbytes).copy()).to(torch_device)
    start = pad + array.__array_interface__["data"][0] - low
    assert start % array.itemsize == 0, "a host array off its own element grid has no typed device view"
    if min(array.strides, default=0) < 0:
        device_array = CudaArrayView(storage, start, array.shape, array.strides, array.dtype)
    else:
        device_array = storage.view(torch_dtype).as_strided(
            array.shape, [s // array.itemsize for s in array.strides], start // array.itemsize)

    def write_back():
        if nbytes:
            _host_bytes(low, nbytes)[...] = storage[pad:pad + nbytes].cpu().numpy()
    return _Placed(array, device_array, write_back)


def _to_numpy(tensor):
    """A numpy copy of a C-contiguous torch device tensor (BF16 through its bits: numpy cannot take it from torch)."""
    import torch

    dtype = {torch.float16: np.float16, torch.float32: np.float32, torch.bfloat16: ml_dtypes.bfloat16,
             torch.float64: np.float64}[tensor.dtype]
    bits = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    return bits.cpu().numpy().view(dtype)


def _wait_for_the_device():
    if not EMULATED_CUDA:  # the emulation's streams are synchronous
        import torch
        torch.cuda.synchronize()


class DeviceData:
    """Numpy arrays on one device. ``put`` returns what to hand to the package (the array itself on the CPU);
    after the call, ``write_back`` copies every output into the host memory it was put from (the whole span, so
    a GuardedOutput still sees writes between the elements), and ``fetch`` copies an output the package
    allocated into a new numpy array."""

    def __init__(self, device):
        self.device = device
        self._placed = {}  # id(host array) -> _Placed; the same array twice (in place) is one device array

    def put(self, array, output=False):
        if self.device == "cpu":
            return array
        placed = self._placed.get(id(array))
        if placed is None:
            placed = self._placed[id(array)] = _place(array, "cuda")
        placed.output |= output
        return placed.device_array

    def write_back(self):
        if self.device == "cpu":
            return
        _wait_for_the_device()
        for placed in self._placed.values():
            if placed.output:
                placed.write_back()

    def fetch(self, device_array):
        """A numpy copy of an output the package allocated, with the same element strides (it may be dense in
        another order than C's, e.g. a channels-last grad_input); None stays None."""
        if self.device == "cpu" or device_array is None:
            return device_array
        _wait_for_the_device()
        if isinstance(device_array, infiniop_py.DeviceArray):  # made like a CudaArrayView (no torch tensor)
            return device_array.to_numpy()
        assert device_array.is_cuda, "outputs are allocated on the device"
        return _dense_to_numpy(device_array)


def _dense_to_numpy(tensor):
    """A numpy copy of a dense torch tensor (any order of its dims in memory), with the same element strides."""
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    span = 1 + sum((extent - 1) * stride for extent, stride in zip(shape, strides)) if 0 not in shape else 0
    assert min(strides, default=0) >= 0 and span == tensor.numel(), "outputs are allocated dense"
    flat = _to_numpy(tensor.as_strided((span,), (1,)))
    return np.lib.stride_tricks.as_strided(flat, shape, [stride * flat.itemsize for stride in strides])


def call_on(device, function, *inputs, out=None, **keywords):
    """``function(*inputs, out=out, **keywords)`` run on ``device`` with the numpy arrays among ``inputs``, ``out``
    and ``keywords`` put there (other values, None or a count, pass as they are); returns numpy arrays: ``out``
    itself (written back) when given, else fresh ones (None for an output not computed)."""
    data = DeviceData(device)
    device_inputs = [data.put(value) if isinstance(value, np.ndarray) else value for value in inputs]
    device_keywords = {name: data.put(value) if isinstance(value, np.ndarray) else value
                       for name, value in keywords.items()}
    device_out = None if out is None else tuple(None if array is None else data.put(array, output=True)
                                                for array in out)
    results = function(*device_inputs, out=device_out, **device_keywords)
    if out is None:
        return tuple(data.fetch(result) for result in results)
    assert all(result is given for result, given in zip(results, device_out)), "out= arrays must be returned"
    data.write_back()
    return tuple(out)
