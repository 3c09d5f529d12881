"""Arrays as the native calls see them (TensorRef), and native tensor descriptors (TensorDesc)."""

import operator
import sys
from typing import Any, NamedTuple, Tuple

import numpy as np

from . import _dlpack, dtypes
from ._device_memory import DeviceArray
from ._ffi import ffi, libraries
from ._layout import contiguous_strides, element_strides
from ._resource import NativeResource
from .errors import BadTensorShapeError, BadTensorStridesError, ClosedError, check

_DLPACK_CPU = 1  # DLDeviceType kDLCPU
_SIZE_MAX, _PTRDIFF_MIN, _PTRDIFF_MAX = 2**64 - 1, -(2**63), 2**63 - 1  # the C types of extents and strides
_DEVICE_BY_TORCH_TYPE = {"cpu": "cpu", "cuda": "nvidia", "npu": "ascend", "mlu": "cambricon", "musa": "moore"}


class TensorRef(NamedTuple):
    """Where an array's data is and how it is laid out; ``owner`` keeps the memory alive."""

    data: int
    device: str
    device_id: int
    dtype: int
    itemsize: int
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]  # in elements
    owner: Any


def _from_numpy(array, name, owner):
    return TensorRef(
        data=array.ctypes.data, device="cpu", device_id=0, dtype=dtypes.code_of(array.dtype, name),
        itemsize=array.dtype.itemsize, shape=tuple(array.shape),
        strides=element_strides(array.strides, array.shape, array.dtype.itemsize, name), owner=owner,
    )


def _from_torch(tensor, name):
    # Read through the tensor's own attributes: works for bfloat16 and device memory alike.
    dtype_name = str(tensor.dtype).replace("torch.", "")
    device = _DEVICE_BY_TORCH_TYPE.get(tensor.device.type)
    if device is None:
        raise ValueError(f"{name}: the torch tensor is on {tensor.device}, which no infiniop device is; "
                         f"use one of the torch devices {', '.join(sorted(_DEVICE_BY_TORCH_TYPE))}")
    if tensor.is_nested:
        raise TypeError(f"{name}: a nested torch tensor has no single shape; pass a plain tensor (one of its "
                        f"components, or a padded tensor)")
    if tensor.layout is not sys.modules["torch"].strided:  # sparse, mkldnn: they were called wrappers without memory
        raise TypeError(f"{name}: a torch tensor of layout {str(tensor.layout).replace('torch.', '')} has no "
                        f"strided memory; pass a dense one (.to_dense())")
    try:
        data = tensor.data_ptr()
    except RuntimeError:  # e.g. "Cannot access data pointer of Tensor that doesn't have storage"
        data = 0
    if data == 0 and tensor.numel():
        raise TypeError(f"{name}: the {type(tensor).__name__} owns no memory the kernels can read (a wrapper tensor "
                        f"subclass such as DTensor or FakeTensor); pass a plain torch.Tensor (a DTensor's "
                        f".to_local() or .full_tensor())")
    return TensorRef(
        data=data, device=device, device_id=tensor.device.index or 0,
        dtype=dtypes.code_of(dtype_name, name), itemsize=tensor.element_size(),
        shape=tuple(tensor.shape), strides=tuple(tensor.stride()), owner=tensor,
    )


def _from_cuda_array_interface(obj, name):
    interface = obj.__cuda_array_interface__
    dtype = np.dtype(interface["typestr"])
    shape = tuple(interface["shape"])
    return TensorRef(
        data=interface["data"][0], device="nvidia", device_id=getattr(getattr(obj, "device", None), "id", 0),
        dtype=dtypes.code_of(dtype, name), itemsize=dtype.itemsize, shape=shape,
        strides=element_strides(interface.get("strides"), shape, dtype.itemsize, name), owner=obj,
    )


def _from_dlpack_cuda(obj, device_id, name, writable):
    capsule = _dlpack.capsule_of(obj)
    data, _, dtype, itemsize, shape, strides = _dlpack.read(capsule, name, writable)
    # The owner keeps the producer's array and its unconsumed capsule (which holds the DLManagedTensor and so the
    # memory) alive; its type is no library's array, so outputs made like it are DeviceArrays on its device and
    # it runs on the default stream (_functional.new_output, library_stream).
    return TensorRef(data=data, device="nvidia", device_id=int(device_id), dtype=dtype, itemsize=itemsize,
                     shape=shape, strides=strides, owner=(obj, capsule))


def _from_device_array(array, name):
    if array.buffer.closed:
        raise ClosedError(f"{name}: the DeviceArray is closed")
    return TensorRef(
        data=array.buffer.address, device=array.device, device_id=array.device_id,
        dtype=dtypes.code_of(array.dtype, name), itemsize=array.dtype.itemsize, shape=array.shape,
        strides=array.strides, owner=array,
    )


_VOID_POINTER = ffi.typeof("void *")  # cffi parses a type given as a string on every cast
_torch_types = ()  # (torch.Tensor, torch.nn.Parameter) once torch is loaded


def torch_cpu_pointer(tensor, writable=False):
    """The data pointer of a contiguous torch CPU tensor (torch.Tensor or nn.Parameter, not other subclasses),
    else None: the fast paths take these without a TensorRef. None too for what the checked path must decide
    (as_tensor): a tensor with the negative bit, and an output (``writable``) that requires grad."""
    global _torch_types
    if not _torch_types:
        torch = sys.modules.get("torch")  # a torch tensor's module is loaded already
        if torch is None:
            return None
        _torch_types = (torch.Tensor, torch.nn.Parameter)
    if (type(tensor) not in _torch_types or not tensor.is_cpu or not tensor.is_contiguous() or tensor.is_neg()
            or (writable and tensor.requires_grad)):
        return None
    return ffi.cast(_VOID_POINTER, tensor.data_ptr())


def _is_torch_tensor(obj):
    torch = sys.modules.get("torch")  # a torch tensor's module is loaded already
    return torch is not None and isinstance(obj, torch.Tensor)


def as_tensor(obj, name, writable=False):
    """A TensorRef for a numpy array, a DeviceArray, a torch tensor, or an object with ``__cuda_array_interface__``,
    ``__dlpack__`` (host or CUDA memory) or ``__array_interface__``. ``name`` is used in error messages."""
    if isinstance(obj, np.ndarray):
        ref = _from_numpy(obj, name, obj)
    elif isinstance(obj, DeviceArray):
        ref = _from_device_array(obj, name)
    elif _is_torch_tensor(obj):
        ref = _from_torch(_resolved_torch(obj, name, writable), name)
    elif hasattr(obj, "__cuda_array_interface__"):
        ref = _from_cuda_array_interface(obj, name)
        if writable and obj.__cuda_array_interface__["data"][1]:
            raise ValueError(f"{name}: the output array is read-only")
    elif hasattr(obj, "__dlpack__"):
        device_type, device_id = obj.__dlpack_device__()
        if device_type == _dlpack.CUDA:
            ref = _from_dlpack_cuda(obj, device_id, name, writable)
        elif device_type != _DLPACK_CPU:
            raise TypeError(
                f"{name}: {type(obj).__name__} lives on DLPack device type {device_type}; only host memory "
                f"(kDLCPU = 1) and CUDA memory (kDLCUDA = 2) are taken"
            )
        else:
            # numpy asks for DLPack 1.x, whose READ_ONLY flag makes the view read-only (checked below).
            ref = _from_numpy(_readable(np.from_dlpack(obj), name, writable), name, obj)
    elif hasattr(obj, "__array_interface__"):
        # numpy honours the interface's read-only flag, data = (pointer, True) (checked below).
        ref = _from_numpy(_readable(np.asarray(obj), name, writable), name, obj)
    else:
        raise TypeError(
            f"{name}: expected an array (numpy, or with __dlpack__ or __array_interface__), "
            f"got {type(obj).__name__}"
        )
    if isinstance(ref.owner, np.ndarray):
        _readable(ref.owner, name, writable)
    return ref


def _readable(array, name, writable):
    """``array``, or ValueError for an output (``writable``) that is read-only memory."""
    if writable and not array.flags.writeable:
        raise ValueError(f"{name}: the output array is read-only")
    return array


def _resolved_torch(tensor, name, writable):
    """What the kernels may read or write for a torch tensor: an input with the negative bit (its memory holds
    -tensor, e.g. z.conj().imag) is resolved into a copy; an output with it, or an output that requires grad
    while grad mode is on (autograd would not see the write: torch refuses in-place writes to such leaves), is
    refused."""
    if writable:
        if tensor.is_neg():
            raise ValueError(f"{name}: the output tensor has the negative bit (its memory holds its negation); "
                             f"pass a tensor without it (.resolve_neg() gives a copy)")
        if tensor.requires_grad and sys.modules["torch"].is_grad_enabled():
            raise RuntimeError(f"{name}: an output tensor that requires grad cannot be written in place (autograd "
                               f"would not see the write); pass one that does not, or write under torch.no_grad()")
        return tensor
    return tensor.resolve_neg() if tensor.is_neg() else tensor


def is_array(obj):
    return (isinstance(obj, (np.ndarray, DeviceArray)) or _is_torch_tensor(obj)
            or any(hasattr(obj, attribute) for attribute in
                   ("__cuda_array_interface__", "__dlpack__", "__array_interface__")))


def _extents(values, what):
    try:
        return tuple(operator.index(value) for value in values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of ints, got {values!r}") from None


class TensorDesc(NativeResource):
    """A native tensor descriptor: shape, dtype and element strides (None: contiguous).
    ``name`` only labels error messages."""

    def __init__(self, shape, dtype, strides=None, *, name="tensor"):
        self.shape = _extents(shape, f"{name}: shape")
        if any(extent < 0 for extent in self.shape):
            raise BadTensorShapeError(f"{name}: shape {self.shape} has a negative extent")
        if any(extent > _SIZE_MAX for extent in self.shape):
            raise BadTensorShapeError(f"{name}: shape {self.shape} has an extent beyond 2**64 - 1 (size_t)")
        self.dtype = dtypes.code_of(dtype, name)
        if strides is None:
            self.strides = contiguous_strides(self.shape)
        else:
            self.strides = _extents(strides, f"{name}: strides")
            if len(self.strides) != len(self.shape):
                raise ValueError(f"{name}: strides {self.strides} must have one entry per dim of shape {self.shape}")
            if any(not _PTRDIFF_MIN <= stride <= _PTRDIFF_MAX for stride in self.strides):
                raise BadTensorStridesError(f"{name}: strides {self.strides} has one outside int64 (ptrdiff_t)")
        op = libraries().op
        pointer = ffi.new("infiniopTensorDescriptor_t *")
        native_strides = ffi.NULL if strides is None else ffi.new("ptrdiff_t[]", self.strides)
        status = op.infiniopCreateTensorDescriptor(pointer, len(self.shape), ffi.new("size_t[]", self.shape),
                                                   native_strides, self.dtype)
        if status == BadTensorShapeError.status:  # the one shape rule of tensor descriptors C checks itself
            raise BadTensorShapeError(
                f"{name}: shape {self.shape} with strides {self.strides} of {dtypes.name(self.dtype)} reaches byte "
                f"offsets beyond 2**63 - 1; infiniopCreateTensorDescriptor failed: BAD_TENSOR_SHAPE")
        check(status, f"infiniopCreateTensorDescriptor({name})")
        self._own(pointer[0], op.infiniopDestroyTensorDescriptor, "infiniopDestroyTensorDescriptor")

    @classmethod
    def from_array(cls, array, *, name="array"):
        ref = as_tensor(array, name)
        return cls(ref.shape, ref.dtype, ref.strides, name=name)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def native(self):
        """The infiniopTensorDescriptor_t (ClosedError once closed)."""
        return self._open_pointer()

    def __repr__(self):
        state = ", closed" if self.closed else ""
        return f"TensorDesc(shape={self.shape}, dtype={dtypes.name(self.dtype)}, strides={self.strides}{state})"
