"""Python bindings (cffi, ABI mode) of infiniop's normalization operators: the three backwards and the RMSNorm,
LayerNorm and BatchNorm forwards.

Importing does not load the native library; the first call that needs it does
(see ``library_path()`` for where it came from).
"""

from ._device_memory import DeviceArray, empty_cache
from ._ffi import LibraryNotFoundError, library_path
from .batch_norm import BatchNorm, batch_norm
from .batch_norm_backward import (BatchNormBackward, batch_norm_backward, batch_norm_backward_elementwise,
                                  batch_norm_backward_reduce)
from .errors import (BadParamError, BadTensorDtypeError, BadTensorShapeError, BadTensorStridesError, ClosedError,
                     DeviceArchitectureNotSupportedError, DeviceNotFoundError, DeviceNotInitializedError,
                     DeviceTypeNotSupportedError, InfiniopError, InsufficientWorkspaceError, InternalError,
                     NotImplementedStatusError, NullPointerError)
from .handle import Handle
from .layer_norm import LayerNorm, LayerNormXhat, layer_norm
from .layer_norm_backward import LayerNormBackward, LayerNormBackwardFromInput, layer_norm_backward
from .rms_norm import RMSNorm, rms_norm
from .rms_norm_backward import RMSNormBackward, rms_norm_backward
from .tensors import TensorDesc

__version__ = "0.1.0"


def include_dir():
    """The directory of the C headers (infiniop.h, infinirt.h, infinicore.h, infiniop/...) that the bundled
    libraries were built from: compile C code against them with ``-I`` and link it with the libraries beside
    ``library_path()``. The headers of the source tree where the package was not built with them."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(here, "include")
    return bundled if os.path.isdir(bundled) else os.path.join(os.path.dirname(here), "native", "include")


def cpu_isa():
    """The instruction set of this process's CPU kernels: "avx512bf16", "avx512", "avx2" or "generic" (the best
    the CPU has, or the lower one ``INFINIOP_CPU_ISA`` names), or None where the loaded library cannot say (an
    InfiniCore install has no ``infiniopGetCpuIsaEx``). Loads the library."""
    from ._ffi import ffi, libraries
    from .errors import check

    try:
        query = libraries().op.infiniopGetCpuIsaEx
    except AttributeError:
        return None
    name = ffi.new("const char **")
    check(query(name), "infiniopGetCpuIsaEx")
    return ffi.string(name[0]).decode()


__all__ = [
    "BadParamError", "BadTensorDtypeError", "BadTensorShapeError", "BadTensorStridesError", "BatchNorm",
    "BatchNormBackward", "ClosedError", "DeviceArchitectureNotSupportedError", "DeviceArray", "DeviceNotFoundError",
    "DeviceNotInitializedError", "DeviceTypeNotSupportedError", "Handle", "InfiniopError",
    "InsufficientWorkspaceError", "InternalError", "LayerNorm", "LayerNormBackward", "LayerNormBackwardFromInput",
    "LayerNormXhat", "LibraryNotFoundError", "NotImplementedStatusError", "NullPointerError", "RMSNorm", "RMSNormBackward",
    "TensorDesc", "__version__",
    "batch_norm", "batch_norm_backward", "batch_norm_backward_elementwise", "batch_norm_backward_reduce", "cpu_isa",
    "empty_cache", "include_dir", "layer_norm", "layer_norm_backward", "library_path", "rms_norm", "rms_norm_backward",
]
