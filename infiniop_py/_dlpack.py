"""DLPack capsules (dmlc/dlpack's dlpack.h, 1.x and the legacy 0.x form), both ways:

- ``read``: a capsule of device memory into the fields of a TensorRef. Host memory does not come here:
  numpy.from_dlpack takes it (tensors.as_tensor). The capsule is never consumed: it is not renamed
  "used_dltensor[_versioned]" and its deleter is not called, so the producer's capsule destructor frees the
  DLManagedTensor[Versioned] when the capsule goes away, as the DLPack convention allows for a capsule nobody
  consumed. The caller keeps the capsule alive (TensorRef.owner) as long as it uses the pointer.
- ``export``: a capsule of a DeviceArray (its ``__dlpack__``), which keeps the array's memory alive until the
  consumer calls the deleter, or until the capsule goes away unconsumed.
"""

import ctypes

from . import dtypes
from ._layout import contiguous_strides
from .errors import BadTensorDtypeError

CPU, CUDA = 1, 2  # DLDeviceType kDLCPU, kDLCUDA
READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY
IS_COPIED = 1 << 1  # DLPACK_FLAG_BITMASK_IS_COPIED
MAX_VERSION = (1, 0)  # the DLPack version this module reads (every 1.x keeps the layout below)
LEGACY_DEFAULT_STREAM = 1  # DLPack's name for CUDA's legacy default stream

# (DLDataType code, bits) -> infiniDtype_t code, for each numpy dtype that has one (so that, as for numpy arrays,
# an integer array, e.g. a uint8 workspace, reaches the operator's own dtype rule). Lanes must be 1.
_DLPACK_CODE_BY_KIND = {"i": 0, "u": 1, "f": 2, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBool
_DTYPES = {(_DLPACK_CODE_BY_KIND[numpy_dtype.kind], numpy_dtype.itemsize * 8): code
           for numpy_dtype, code in dtypes.CODE_BY_NUMPY.items() if numpy_dtype.kind in _DLPACK_CODE_BY_KIND}
_DL_BFLOAT = 4  # kDLBfloat
_DTYPES[(_DL_BFLOAT, 16)] = dtypes.BF16


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor[Versioned] *)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype, _capsule_is_valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def capsule_of(obj):
    """The DLPack capsule of ``obj``: versioned (DLPack 1.x) where the producer has it, else the legacy one.

    stream=1: the legacy default stream, so the producer orders its pending writes before work there. That is
    where the package runs such an array: it knows no current stream of the producer's library
    (_functional.library_stream gives None), and the NULL stream of libinfinirt is the legacy default one
    (nothing is built with per-thread default streams). The array API standard gives None the same meaning, but
    JAX (XLA) answers None by waiting on the host until the array is ready, and a stream by making that stream
    wait for it (an event). Operator objects called with another stream= leave that ordering to the caller, as
    for any array.
    """
    try:
        return obj.__dlpack__(stream=LEGACY_DEFAULT_STREAM, max_version=MAX_VERSION)
    except TypeError:  # a producer from before DLPack 1.0 (array API 2023.12) has no max_version
        return obj.__dlpack__(stream=LEGACY_DEFAULT_STREAM)


def read(capsule, name, writable):
    """(data, device_id, dtype code, itemsize, shape, element strides) of a kDLCUDA capsule; ValueError (or
    BadTensorDtypeError, a ValueError) naming ``name`` for what the package cannot take."""
    if _capsule_is_valid(capsule, b"dltensor_versioned"):
        managed = DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, b"dltensor_versioned"))
        if managed.version.major != MAX_VERSION[0]:
            raise ValueError(f"{name}: the DLPack capsule has version {managed.version.major}."
                             f"{managed.version.minor}; this package reads 1.x")
        if writable and managed.flags & READ_ONLY:
            raise ValueError(f"{name}: the output array is read-only")
        if writable and managed.flags & IS_COPIED:
            raise ValueError(f"{name}: the producer exported a copy (DLPack IS_COPIED), so writes to the output "
                             f"would not reach the array")
    elif _capsule_is_valid(capsule, b"dltensor"):
        managed = DLManagedTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    else:
        raise ValueError(f"{name}: __dlpack__ returned {capsule!r}, not an unused DLPack capsule "
                         f"(\"dltensor_versioned\" or \"dltensor\")")
    tensor = managed.dl_tensor
    if tensor.device.device_type != CUDA:
        raise ValueError(f"{name}: the DLPack capsule's tensor is on device type {tensor.device.device_type}, "
                         f"but __dlpack_device__ said {CUDA} (kDLCUDA)")
    dtype = tensor.dtype
    if dtype.lanes != 1:
        raise BadTensorDtypeError(f"{name}: DLPack dtype (code {dtype.code}, bits {dtype.bits}) has {dtype.lanes} "
                                  f"lanes; only scalar element types (lanes 1) are supported")
    code = _DTYPES.get((dtype.code, dtype.bits))
    if code is None:
        raise BadTensorDtypeError(f"{name}: DLPack dtype code {dtype.code} with {dtype.bits} bits is not "
                                  f"supported; use float16, float32, bfloat16 or float64")
    shape = tuple(tensor.shape[dim] for dim in range(tensor.ndim))
    # NULL strides: a C-contiguous tensor (older dlpack.h allowed that; the current one asks for strides when
    # ndim != 0, but older producers still send NULL). An array with no elements has no layout to keep, as in
    # _layout.element_strides.
    if not tensor.strides or 0 in shape:
        strides = contiguous_strides(shape)
    else:
        strides = tuple(tensor.strides[dim] for dim in range(tensor.ndim))
    data = (tensor.data or 0) + tensor.byte_offset
    return data, tensor.device.device_id, code, dtype.bits // 8, shape, strides


# ---------------------------------------------------------------------------------------------------------------
# Export. Each capsule's structs (and the array they describe) stay in _exports, keyed by the address of the
# DLManagedTensor[Versioned], until its deleter runs: called by the consumer that took the capsule (renaming it
# "used_..."), or by the capsule's destructor where nobody did.
_exports = {}
_NAMES = (b"dltensor_versioned", b"dltensor")  # PyCapsule_New keeps the name's pointer: these live with the module


@_DELETER
def _delete(managed):
    _exports.pop(managed, None)


# The destructor gets the capsule while it is being destroyed: it is passed as a plain address (a py_object
# argument would take a new reference to it), so these two are prototypes of their own.
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_raw_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)
def _destroy_capsule(capsule):
    for name in _NAMES:  # still so named: nobody consumed it
        if _raw_is_valid(capsule, name):
            _exports.pop(_raw_pointer(capsule, name), None)


_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))


def exported(owner):
    """Whether a capsule of ``owner`` is still held (by a consumer, or unconsumed)."""
    return any(entry[0] is owner for entry in list(_exports.values()))


def dl_dtype(numpy_dtype):
    """(DLDataType code, bits) of a numpy dtype (ml_dtypes.bfloat16: kDLBfloat)."""
    if numpy_dtype.kind == "V" and numpy_dtype.itemsize == 2 and numpy_dtype.name == "bfloat16":
        return _DL_BFLOAT, 16
    return _DLPACK_CODE_BY_KIND[numpy_dtype.kind], numpy_dtype.itemsize * 8


def export(owner, address, shape, strides, numpy_dtype, device, versioned):
    """A capsule of the array at ``address`` (element ``strides``) on DLPack ``device`` (type, id), versioned or
    legacy, that keeps ``owner`` alive until the consumer is done with it."""
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    if versioned:
        managed.version.major, managed.version.minor = MAX_VERSION
        managed.flags = 0  # writable, not a copy
    ndim = len(shape)
    shape_array, strides_array = (ctypes.c_int64 * ndim)(*shape), (ctypes.c_int64 * ndim)(*strides)
    tensor = managed.dl_tensor
    tensor.data, tensor.byte_offset, tensor.ndim = address, 0, ndim
    tensor.device.device_type, tensor.device.device_id = device
    tensor.dtype.code, tensor.dtype.bits = dl_dtype(numpy_dtype)
    tensor.dtype.lanes = 1
    tensor.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(strides_array, ctypes.POINTER(ctypes.c_int64))
    managed.deleter = _delete
    key = ctypes.addressof(managed)
    _exports[key] = (owner, managed, shape_array, strides_array)
    try:
        return _capsule_new(key, _NAMES[0] if versioned else _NAMES[1],
                            ctypes.cast(_destroy_capsule, ctypes.c_void_p))
    except BaseException:
        del _exports[key]
        raise
