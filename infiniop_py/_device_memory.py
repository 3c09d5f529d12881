"""Device memory through infinirt: DeviceBuffer (raw bytes) and DeviceArray (a typed array on it).

DeviceArray lets the operators run on any built-in device without a Python array library
for it; for the CPU device infinirt memory is host memory.
"""

import math

import numpy as np

from ._ffi import ffi, libraries
from ._layout import contiguous_strides, packed
from ._resource import NativeResource
from .errors import check
from .handle import device_name, selected_device


def _free_on(device, device_id):
    """infinirtFree for memory of (device, device_id): it frees through the thread's current device, which may
    be another one (the CPU's free() on a GPU pointer would corrupt the heap)."""
    def free(pointer):
        with selected_device(device, device_id):
            return libraries().rt.infinirtFree(pointer)
    return free


class DeviceBuffer(NativeResource):
    """``nbytes`` bytes on (device, device_id); ``address`` is the device pointer as an int."""

    def __init__(self, device, device_id, nbytes):
        device = device_name(device)  # "cuda" and "CUDA" are "nvidia", as a Handle's device is
        rt = libraries().rt
        pointer = ffi.new("void **")
        with selected_device(device, device_id):
            check(rt.infinirtMalloc(pointer, max(nbytes, 1)), f"infinirtMalloc({nbytes})")
        self._own(pointer[0], _free_on(device, device_id), "infinirtFree")
        self.device = device
        self.device_id = device_id
        self.nbytes = nbytes

    @property
    def address(self):
        return int(ffi.cast("uintptr_t", self._open_pointer()))

    def _copy(self, destination, source, kind):
        with selected_device(self.device, self.device_id):
            check(libraries().rt.infinirtMemcpy(destination, source, self.nbytes, kind), "infinirtMemcpy")


def _dense_strides(shape, strides):
    """``strides`` (elements) as a tuple, or ValueError unless they lay ``shape`` out densely (packed in some order
    of its dims)."""
    strides = tuple(int(stride) for stride in strides)
    if len(strides) != len(shape):
        raise ValueError(f"strides {strides} must have one entry per dim of shape {shape}")
    if not packed(shape, strides):
        raise ValueError(f"strides {strides} do not lay out shape {shape} densely (each dim stepping over the "
                         f"elements of the dims inside it)")
    return strides


class DeviceArray:
    """An array of ``shape`` and numpy ``dtype`` in infinirt device memory: C-contiguous, or in the dense layout
    that element ``strides`` give (e.g. channels-last, as outputs laid out like such an input are)."""

    def __init__(self, shape, dtype, device, device_id=0, strides=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.strides = contiguous_strides(self.shape) if strides is None else _dense_strides(self.shape, strides)
        self.buffer = DeviceBuffer(device, device_id, math.prod(self.shape) * self.dtype.itemsize)

    @property
    def device(self):
        return self.buffer.device

    @property
    def device_id(self):
        return self.buffer.device_id

    @classmethod
    def from_numpy(cls, array, device, device_id=0):
        array = np.ascontiguousarray(array)
        device_array = cls(array.shape, array.dtype, device, device_id)
        device_array.buffer._copy(ffi.cast("void *", device_array.buffer.address),
                                  ffi.cast("void *", array.ctypes.data),
                                  libraries().rt.INFINIRT_MEMCPY_H2D)
        return device_array

    def to_numpy(self):
        """A host copy (numpy array of this shape, dtype and layout); waits for the copy."""
        flat = np.empty(math.prod(self.shape), dtype=self.dtype)
        self.buffer._copy(ffi.cast("void *", flat.ctypes.data), ffi.cast("void *", self.buffer.address),
                          libraries().rt.INFINIRT_MEMCPY_D2H)
        byte_strides = [stride * self.dtype.itemsize for stride in self.strides]
        return np.lib.stride_tricks.as_strided(flat, self.shape, byte_strides, writeable=True)

    def new_empty(self, shape):
        """An uninitialized DeviceArray of ``shape``, this dtype, on the same device."""
        return DeviceArray(shape, self.dtype, self.device, self.device_id)

    def close(self):
        """Free the device memory now (also done when the array is collected); closing twice is allowed."""
        self.buffer.close()

    def __repr__(self):
        layout = "" if self.strides == contiguous_strides(self.shape) else f", strides={self.strides}"
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}{layout}, "
                f"device={self.device!r}:{self.device_id})")
