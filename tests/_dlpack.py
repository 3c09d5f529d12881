"""A pure-Python DLPack producer for tests: ``DLPackView`` presents any memory address as an array on any DLPack
device, through the versioned (DLPack 1.x, capsule "dltensor_versioned") or the legacy (capsule "dltensor")
protocol, with the read-only flag, strides and byte offset the test asks for.

It lets CPU-only tests hand the package "GPU" arrays whose fields can be checked (nothing here dereferences the
address), and host memory to a CUDA emulation as "nvidia" arrays:

    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    view = DLPackView.of_numpy(host, device_type=KDL_CUDA, device_id=1)   # host memory claimed to be on cuda:1
    view = DLPackView(address, (3, 4), None, np.float32, KDL_CUDA)         # any address, C-contiguous

Lifetime: each ``__dlpack__`` call builds a fresh DLManagedTensor[Versioned] (with its shape and strides arrays)
that the view keeps, and returns a capsule with no destructor and a NULL deleter. So a capsule is valid for as
long as its view lives (and the memory at ``address``: pass ``keep=`` an object that owns it, as ``of_numpy``
does), and nothing leaks or is freed twice whether or not a consumer renames it "used_...". The package keeps
the view alongside the capsule (TensorRef.owner), which is all it needs.

``requests`` records the keyword arguments of every ``__dlpack__`` call, so a test can check what a consumer
asked for.
"""

import ctypes

import ml_dtypes
import numpy as np

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM = 1, 2, 3, 10  # DLDeviceType
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 4, 5, 6  # DLDataTypeCode
READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
IS_COPIED = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED

# Laid out as dmlc/dlpack's include/dlpack/dlpack.h (1.x) declares them; written here independently of the
# package's own reader (infiniop_py/_dlpack.py), so a layout slip in one shows against the other.


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


_Deleter = ctypes.c_void_p  # always NULL here


class _Managed(ctypes.Structure):  # DLManagedTensor (legacy)
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class _ManagedVersioned(ctypes.Structure):  # DLManagedTensorVersioned
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype, _capsule_new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# PyCapsule_New keeps the name's pointer, so the names live as long as this module.
_VERSIONED_NAME, _LEGACY_NAME = b"dltensor_versioned", b"dltensor"

_ABSENT = object()  # a keyword an old producer never had


def dl_dtype(dtype):
    """(code, bits, lanes) of a numpy dtype (ml_dtypes.bfloat16 included), or of such a tuple as given."""
    if isinstance(dtype, tuple):
        return dtype
    dtype = np.dtype(dtype)
    if dtype == np.dtype(ml_dtypes.bfloat16):
        return KDL_BFLOAT, 16, 1
    code = {"f": KDL_FLOAT, "i": KDL_INT, "u": KDL_UINT, "c": KDL_COMPLEX, "b": KDL_BOOL}[dtype.kind]
    return code, dtype.itemsize * 8, 1


class DLPackView:
    """An array of ``shape`` at ``address`` + ``byte_offset`` on DLPack device (``device_type``, ``device_id``).

    ``strides``: element strides (may be negative), or None for C-contiguous (sent as NULL strides, as older
    producers do). ``dtype``: a numpy dtype (ml_dtypes.bfloat16 included), or a (code, bits, lanes) tuple for
    one numpy lacks. ``read_only``: the versioned capsule's READ_ONLY flag (the legacy one cannot say it).
    ``flags``: further versioned flag bits (e.g. IS_COPIED). ``versioned=False``: a producer from before
    DLPack 1.0, whose ``__dlpack__`` has no ``max_version`` (nor ``dl_device``, ``copy``) keyword and raises
    TypeError for it. ``keep``: an object kept alive with the view (the owner of the memory). ``version``: the
    (major, minor) put in versioned capsules.
    """

    def __init__(self, address, shape, strides, dtype, device_type, device_id=0, byte_offset=0, read_only=False,
                 versioned=True, keep=None, flags=0, version=(1, 0)):
        self.address, self.shape = address, tuple(shape)
        self.strides = None if strides is None else tuple(strides)
        self.dtype, self.device = dl_dtype(dtype), (device_type, device_id)
        self.byte_offset, self.read_only, self.versioned = byte_offset, read_only, versioned
        self.flags, self.version, self.keep = flags, version, keep
        self.requests = []
        self._structs = []  # every struct a capsule points into, kept for the view's lifetime

    @classmethod
    def of_numpy(cls, array, device_type=KDL_CPU, device_id=0, **options):
        """A view of ``array``'s memory with its layout (any numpy strides that are whole elements), claimed
        to be on ``device_type``; the view keeps ``array`` alive."""
        strides = tuple(stride // array.itemsize for stride in array.strides)
        return cls(array.ctypes.data, array.shape, strides, array.dtype, device_type, device_id, keep=array,
                   **options)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=_ABSENT, dl_device=_ABSENT, copy=_ABSENT):
        if not self.versioned and (max_version, dl_device, copy) != (_ABSENT,) * 3:
            raise TypeError("__dlpack__() got an unexpected keyword argument (a DLPack 0.x producer)")
        self.requests.append({"stream": stream, **{key: value for key, value in
                              (("max_version", max_version), ("dl_device", dl_device), ("copy", copy))
                              if value is not _ABSENT}})
        if dl_device not in (_ABSENT, None) and tuple(dl_device) != self.device:
            raise BufferError(f"DLPackView: cannot export to device {dl_device}")
        if copy is True:
            raise BufferError("DLPackView: cannot copy")
        if max_version in (_ABSENT, None) or tuple(max_version) < (1, 0) or not self.versioned:
            return self._capsule(_Managed(), _LEGACY_NAME)
        managed = _ManagedVersioned()
        managed.version.major, managed.version.minor = self.version
        managed.flags = self.flags | (READ_ONLY if self.read_only else 0)
        return self._capsule(managed, _VERSIONED_NAME)

    def _capsule(self, managed, name):
        tensor = managed.dl_tensor
        ndim = len(self.shape)
        shape = (ctypes.c_int64 * ndim)(*self.shape)
        strides = None if self.strides is None else (ctypes.c_int64 * ndim)(*self.strides)
        tensor.data, tensor.byte_offset, tensor.ndim = self.address, self.byte_offset, ndim
        tensor.device.device_type, tensor.device.device_id = self.device
        tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = self.dtype
        tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = None if strides is None else ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        self._structs.append((managed, shape, strides))
        return _capsule_new(ctypes.addressof(managed), name, None)


class DLPackOnly:
    """Only the protocol of ``array``, so the package takes its DLPack path."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()
