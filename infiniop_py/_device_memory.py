"""Device memory through infinirt: DeviceBuffer (raw bytes) and DeviceArray (a typed array on it).

DeviceArray lets the operators run on any built-in device without a Python array library
for it; for the CPU device infinirt memory is host memory. A DeviceArray's memory comes from a cache of
blocks that earlier DeviceArrays gave back, as torch's and cupy's allocators do: the functional API makes
fresh DeviceArray outputs on every call without out=, and infinirtMalloc + infinirtFree cost tens of
microseconds and a device-wide synchronization (cudaFree) each time.
"""

import math

import numpy as np

from . import _dlpack
from ._ffi import ffi, libraries
from ._layout import contiguous_strides, element_strides, packed
from ._resource import NativeResource
from .errors import BadTensorStridesError, ClosedError, InfiniopError, check
from .handle import device_name, selected_device


def _free_on(device, device_id):
    """infinirtFree for memory of (device, device_id): it frees through the thread's current device, which may
    be another one (the CPU's free() on a GPU pointer would corrupt the heap)."""
    def free(pointer):
        with selected_device(device, device_id):
            return libraries().rt.infinirtFree(pointer)
    return free


def _allocate(device, device_id, nbytes):
    pointer = ffi.new("void **")
    with selected_device(device, device_id):
        check(libraries().rt.infinirtMalloc(pointer, max(nbytes, 1)), f"infinirtMalloc({nbytes})")
    return pointer[0]


# Blocks given back by DeviceArrays, per (device, device_id, block bytes): lists of void * (cffi pointers, which
# LeakSanitizer sees as references at exit). dict.setdefault and list.pop/append are atomic, so a finalizer that
# gives a block back in the middle of a take cannot corrupt them.
_cached_blocks = {}


def _block_bytes(nbytes):
    """The size class of an allocation: up to 1/8 more than asked for, so that arrays of nearby sizes share
    blocks and the classes stay few."""
    step = max(512, 1 << max(nbytes.bit_length() - 4, 0))
    return max(-(-nbytes // step) * step, step)


def _take_block(key):
    """A cached block of ``key`` (device, device_id, block bytes), else a new one. A failed allocation frees the
    device's cached blocks and tries once more."""
    try:
        return _cached_blocks[key].pop()
    except (KeyError, IndexError):
        pass
    device, device_id, nbytes = key
    try:
        return _allocate(device, device_id, nbytes)
    except InfiniopError:
        if not empty_cache(device, device_id):
            raise
    return _allocate(device, device_id, nbytes)


def _give_back_to(key):
    # The key's list bound here, not looked up at each call: a block may go back during interpreter exit
    # (_CachedBlockBuffer.__del__), when module globals may already be gone. Lists are never removed.
    blocks = _cached_blocks.setdefault(key, [])

    def give_back(pointer):
        blocks.append(pointer)
        return 0  # INFINI_STATUS_SUCCESS, as close() checks it
    return give_back


def empty_cache(device=None, device_id=None):
    """Free the device memory that closed or collected DeviceArrays left in this package's cache (of ``device``
    and ``device_id`` where given, else of all); returns how many bytes that was. Like torch.cuda.empty_cache:
    memory in use is untouched, and allocations that fail empty the device's cache themselves."""
    device = None if device is None else device_name(device)
    freed = 0
    for key in list(_cached_blocks):
        if (device is None or key[0] == device) and (device_id is None or key[1] == device_id):
            blocks = _cached_blocks.get(key, [])
            free = _free_on(key[0], key[1])
            while True:
                try:
                    pointer = blocks.pop()
                except IndexError:
                    break
                check(free(pointer), "infinirtFree")
                freed += key[2]
    return freed


class DeviceBuffer(NativeResource):
    """``nbytes`` bytes on (device, device_id), infinirtMalloc'd and freed; ``address`` is the device pointer as
    an int."""

    def __init__(self, device, device_id, nbytes):
        device = device_name(device)  # "cuda" and "CUDA" are "nvidia", as a Handle's device is
        self._own(_allocate(device, device_id, nbytes), _free_on(device, device_id), "infinirtFree")
        self.device = device
        self.device_id = device_id
        self.nbytes = nbytes

    @property
    def address(self):
        return int(ffi.cast("uintptr_t", self._open_pointer()))

    def _copy(self, destination, source, kind):
        with selected_device(self.device, self.device_id):
            check(libraries().rt.infinirtMemcpy(destination, source, self.nbytes, kind), "infinirtMemcpy")


class _CachedBlockBuffer:
    """A block taken from the cache (see the module's docstring) of ``key``'s (device, device_id, block bytes)
    size class, given back by ``give_back`` on close() or when it is collected: DeviceBuffer's interface without
    its NativeResource machinery. Nothing waits on a buffer (a native call takes its pointer while the caller holds
    the array), and giving a block back is a list append, harmless at any time, interpreter exit included, so a
    list holding the pointer is all its state: popped (atomically) once, by whoever closes or collects it first.
    Fresh outputs are made per functional call: this one costs 0.33 us to make and drop where a NativeResource
    cost 0.56, and its pointer 0.02 us to read where one's cost 0.1 (a 2-core AMD EPYC)."""

    __slots__ = ("device", "device_id", "nbytes", "_held", "_give_back")

    def __init__(self, key, nbytes, give_back):
        self._held = [_take_block(key)]
        self._give_back = give_back
        self.device, self.device_id = key[0], key[1]
        self.nbytes = nbytes

    @property
    def closed(self):
        return not self._held

    def _open_pointer(self):
        try:
            return self._held[0]
        except IndexError:
            raise ClosedError("DeviceBuffer is closed") from None

    address = DeviceBuffer.address
    _copy = DeviceBuffer._copy

    def close(self):
        """Give the block back now (also done when the buffer is collected); closing twice is allowed."""
        try:
            pointer = self._held.pop()
        except (AttributeError, IndexError):  # closed, or (collected) __init__ failed before taking a block
            return
        self._give_back(pointer)

    __del__ = close


def _dense_strides_of(array):
    """A numpy array's element strides where it lies densely in memory from its first element (packed in some
    order of its dims, which no negative stride is), else None."""
    if array.size == 0:
        return None
    try:
        strides = element_strides(array.strides, array.shape, array.dtype.itemsize, "array")
    except BadTensorStridesError:
        return None
    return strides if packed(array.shape, strides) else None


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


def _array_layout(shape, dtype, device, device_id, strides):
    """DeviceArray's arguments checked: (shape, numpy dtype, element strides, bytes, its blocks' cache key)."""
    shape, dtype = tuple(shape), np.dtype(dtype)
    strides = contiguous_strides(shape) if strides is None else _dense_strides(shape, strides)
    nbytes = math.prod(shape) * dtype.itemsize
    return shape, dtype, strides, nbytes, (device_name(device), device_id, _block_bytes(nbytes))


class DeviceArray:
    """An array of ``shape`` and numpy ``dtype`` in infinirt device memory: C-contiguous, or in the dense layout
    that element ``strides`` give (e.g. channels-last, as outputs laid out like such an input are).

    Its memory comes from this package's cache and goes back to it when the array is closed or collected,
    without waiting for the device (``empty_cache`` frees what is cached). As with torch's caching allocator,
    work queued on another stream than the default one that still reads or writes the array must be ordered
    before the array is dropped (synchronize that stream, or keep the array until then): the memory may be
    reused at once, by outputs that the functional API writes on the default stream."""

    def __init__(self, shape, dtype, device, device_id=0, strides=None):
        self.shape, self.dtype, self.strides, nbytes, key = _array_layout(shape, dtype, device, device_id, strides)
        self.buffer = _CachedBlockBuffer(key, nbytes, _give_back_to(key))

    @property
    def device(self):
        return self.buffer.device

    @property
    def device_id(self):
        return self.buffer.device_id

    @classmethod
    def from_numpy(cls, array, device, device_id=0):
        """A device copy of ``array`` in its own layout where that is dense (C order, channels-last, any packed
        order of its dims), so that outputs made like it keep it too; other arrays (views with gaps, negative
        strides) are copied C-contiguous first."""
        array = np.asarray(array)
        strides = _dense_strides_of(array)
        if strides is None:
            array = np.ascontiguousarray(array)
        device_array = cls(array.shape, array.dtype, device, device_id, strides)
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

    def __dlpack_device__(self):
        """(DLPack device type, device id): kDLCPU or kDLCUDA; BufferError for Ascend (DLPack has no type for it)."""
        if self.device == "cpu":
            return _dlpack.CPU, 0
        if self.device == "nvidia":
            return _dlpack.CUDA, self.device_id
        raise BufferError(f"DeviceArray on {self.device}: DLPack has no device type for it; use to_numpy()")

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this array, no copy (versioned where ``max_version`` allows 1.x), for
        ``torch.from_dlpack``, ``jax.dlpack.from_dlpack``, ``cupy.from_dlpack``, ``numpy.from_dlpack`` (CPU):
        the memory stays alive (not reused) until the consumer is done with it. ``stream``: the consumer's
        stream (CUDA): the package writes DeviceArrays on the legacy default stream (None or 1), so another stream
        is made to wait for that one (an event; the host does not wait; -1: no wait, the consumer orders it)."""
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(dl_device) != device:
            raise BufferError(f"DeviceArray on {device}: cannot export to DLPack device {tuple(dl_device)} "
                              f"(copy it with to_numpy() first)")
        if copy:
            raise BufferError("DeviceArray exports its own memory only (copy=True asked for a copy)")
        if device[0] == _dlpack.CUDA and stream not in (None, 1, -1):
            if stream == 0:
                raise ValueError("stream: 0 is ambiguous in DLPack; pass 1 (legacy default) or 2 (per-thread)")
            self._order_before(stream)
        versioned = max_version is not None and tuple(max_version) >= _dlpack.MAX_VERSION
        return _dlpack.export(self, self.buffer.address, self.shape, self.strides, self.dtype, device, versioned)

    def _order_before(self, stream):
        """Make work queued on ``stream`` (a CUDA stream handle, as an int) wait for the work queued so far on the
        legacy default stream, through an event: the host does not wait."""
        rt = libraries().rt
        event = ffi.new("infinirtEvent_t *")
        with selected_device(self.device, self.device_id):
            check(rt.infinirtEventCreate(event), "infinirtEventCreate")
            try:
                check(rt.infinirtEventRecord(event[0], ffi.NULL), "infinirtEventRecord")
                check(rt.infinirtStreamWaitEvent(ffi.cast("void *", stream), event[0]), "infinirtStreamWaitEvent")
            finally:
                rt.infinirtEventDestroy(event[0])  # released once its work is done; the wait stays queued

    @property
    def __cuda_array_interface__(self):
        """Version 3, for cupy, numba and torch.as_tensor (NVIDIA arrays of numpy dtypes; AttributeError
        otherwise: bfloat16 has no typestr). ``stream`` 1: consumers wait for the legacy default stream, where
        the package writes DeviceArrays."""
        if self.device != "nvidia":
            raise AttributeError(f"__cuda_array_interface__: the DeviceArray is on {self.device}")
        if self.dtype.kind == "V":
            raise AttributeError("__cuda_array_interface__ has no typestr for bfloat16; use __dlpack__")
        contiguous = self.strides == contiguous_strides(self.shape)
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.buffer.address, False),
                "strides": None if contiguous else tuple(stride * self.dtype.itemsize for stride in self.strides),
                "version": 3, "stream": 1}

    def new_empty(self, shape):
        """An uninitialized DeviceArray of ``shape``, this dtype, on the same device."""
        return DeviceArray(shape, self.dtype, self.device, self.device_id)

    def close(self):
        """Give the memory back to the cache now (also done when the array is collected); closing twice is
        allowed. BufferError while a DLPack consumer holds the array: drop the array instead, and its memory
        goes back when the consumers are done."""
        if _dlpack.exported(self):
            raise BufferError("DeviceArray.close(): a DLPack consumer still uses this array's memory (its "
                              "memory goes back to the cache when the consumers and this array are gone)")
        self.buffer.close()

    def __repr__(self):
        layout = "" if self.strides == contiguous_strides(self.shape) else f", strides={self.strides}"
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype}{layout}, "
                f"device={self.device!r}:{self.device_id})")


def array_maker(shape, dtype, device, device_id=0, strides=None):
    """A function of no arguments that makes DeviceArray(shape, dtype, device, device_id, strides) anew at each
    call, with the arguments checked and the block's size class found once: for outputs made per call (the
    functional API's fast path), where DeviceArray() costs four times as much."""
    shape, dtype, strides, nbytes, key = _array_layout(shape, dtype, device, device_id, strides)
    give_back, new = _give_back_to(key), object.__new__

    def make():
        array = new(DeviceArray)
        array.shape, array.dtype, array.strides = shape, dtype, strides
        array.buffer = _CachedBlockBuffer(key, nbytes, give_back)
        return array

    return make
