"""infiniDtype_t codes and their numpy equivalents."""

import ml_dtypes
import numpy as np

from ._ffi import ffi
from .errors import BadTensorDtypeError

_CODES = ffi.typeof("infiniDtype_t").relements  # "INFINI_DTYPE_F16" -> 12

F16 = _CODES["INFINI_DTYPE_F16"]
F32 = _CODES["INFINI_DTYPE_F32"]
BF16 = _CODES["INFINI_DTYPE_BF16"]

F64 = _CODES["INFINI_DTYPE_F64"]

# The dtypes the seed entry points compute in; the ...Ex ones add F64.
SUPPORTED = (F16, F32, BF16)
EX_SUPPORTED = (F16, F32, BF16, F64)

# Every numpy dtype that has an infiniDtype_t code: arrays of these reach the operator's own
# dtype rule (which names the tensor), instead of failing at conversion.
CODE_BY_NUMPY = {
    np.dtype(np.bool_): _CODES["INFINI_DTYPE_BOOL"],
    np.dtype(np.int8): _CODES["INFINI_DTYPE_I8"],
    np.dtype(np.int16): _CODES["INFINI_DTYPE_I16"],
    np.dtype(np.int32): _CODES["INFINI_DTYPE_I32"],
    np.dtype(np.int64): _CODES["INFINI_DTYPE_I64"],
    np.dtype(np.uint8): _CODES["INFINI_DTYPE_U8"],
    np.dtype(np.uint16): _CODES["INFINI_DTYPE_U16"],
    np.dtype(np.uint32): _CODES["INFINI_DTYPE_U32"],
    np.dtype(np.uint64): _CODES["INFINI_DTYPE_U64"],
    np.dtype(np.float16): F16,
    np.dtype(np.float32): F32,
    np.dtype(np.float64): F64,
    np.dtype(ml_dtypes.bfloat16): BF16,
}
_NUMPY_BY_CODE = {code: dtype for dtype, code in CODE_BY_NUMPY.items()}

_CODE_BY_NAME = {
    "float16": F16, "f16": F16, "half": F16,
    "float32": F32, "f32": F32, "single": F32,
    "bfloat16": BF16, "bf16": BF16,
    "float64": F64, "f64": F64, "double": F64,
}


def name(code):
    """Short name of a code, e.g. 12 -> "F16"."""
    full = ffi.typeof("infiniDtype_t").elements.get(code)
    return full[len("INFINI_DTYPE_"):] if full else f"<invalid dtype {code}>"


def is_valid_code(code):
    """A real infiniDtype_t value (INVALID excluded), as infiniopCreateTensorDescriptor requires."""
    return code in ffi.typeof("infiniDtype_t").elements and code != _CODES["INFINI_DTYPE_INVALID"]


def code_of(dtype, tensor="tensor"):
    """The infiniDtype_t code for a numpy dtype, a dtype name, or a code given as an int."""
    if isinstance(dtype, np.dtype) and dtype in CODE_BY_NUMPY:  # the common case, first
        return CODE_BY_NUMPY[dtype]
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        code = int(dtype)
        if not is_valid_code(code):
            raise BadTensorDtypeError(f"{tensor}: {code} is not a valid infiniDtype_t code")
        return code
    if dtype is None:
        raise BadTensorDtypeError(f"{tensor}: dtype is None")
    if isinstance(dtype, str) and dtype.lower() in _CODE_BY_NAME:
        return _CODE_BY_NAME[dtype.lower()]
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError as error:
        raise BadTensorDtypeError(f"{tensor}: {dtype!r} is not a dtype ({error})") from None
    if numpy_dtype not in CODE_BY_NUMPY:
        if not numpy_dtype.isnative and numpy_dtype.newbyteorder("=") in CODE_BY_NUMPY:  # from a file, say
            raise BadTensorDtypeError(
                f"{tensor}: dtype {numpy_dtype.str} is not in this machine's byte order; convert it first, e.g. "
                f"array.astype(array.dtype.newbyteorder('='))")
        raise BadTensorDtypeError(
            f"{tensor}: dtype {numpy_dtype} has no infiniDtype_t code; use float16, float32, bfloat16 or float64"
        )
    return CODE_BY_NUMPY[numpy_dtype]


def to_numpy(code, tensor="tensor"):
    """The numpy dtype of a compute dtype code (F16, F32, BF16, F64)."""
    if code not in EX_SUPPORTED:
        raise BadTensorDtypeError(
            f"{tensor}: dtype {name(code)} is not supported; use float16, float32, bfloat16 or float64"
        )
    return _NUMPY_BY_CODE[code]


def numpy_dtype_of(code):
    """The numpy dtype of any code that has one, else None."""
    return _NUMPY_BY_CODE.get(code)
