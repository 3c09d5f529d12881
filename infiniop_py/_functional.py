"""What the functional API shares: default handles, the operator cache, output allocation."""

import collections
import threading

import numpy as np

from . import dtypes
from ._layout import TensorSpec, significant_strides
from .handle import Handle
from .tensors import as_tensor

CACHE_SIZE = 64  # operator objects kept, least recently used dropped first

_lock = threading.RLock()
_handles = {}  # (device, device_id) -> Handle
_operators = collections.OrderedDict()  # layout key -> operator object


def default_handle(device, device_id):
    """The shared Handle of a device, created on first use."""
    with _lock:
        handle = _handles.get((device, device_id))
        if handle is None:
            handle = _handles[(device, device_id)] = Handle(device, device_id)
        return handle


def cached_operator(operator_class, refs):
    """The operator object for these TensorRefs' layouts (a dict in C order), created once per layout."""
    first = next(iter(refs.values()))
    key = (operator_class, first.device, first.device_id,
           tuple((ref.dtype, ref.shape, significant_strides(ref.shape, ref.strides)) for ref in refs.values()))
    with _lock:
        operator = _operators.get(key)
        if operator is None:
            handle = default_handle(first.device, first.device_id)
            specs = [TensorSpec(ref.shape, ref.dtype, ref.strides) for ref in refs.values()]
            operator = _operators[key] = operator_class(handle, *specs)
            # An evicted operator is not closed: another thread may be running it; the
            # garbage collector destroys it once nobody does.
            while len(_operators) > CACHE_SIZE:
                _operators.popitem(last=False)
        else:
            _operators.move_to_end(key)
        return operator


def new_output(like, shape, like_name):
    """An empty C-contiguous output with ``like``'s dtype, of the same kind and device as ``like``."""
    numpy_dtype = dtypes.to_numpy(like.dtype, like_name)
    if hasattr(like.owner, "new_empty"):  # torch tensor or DeviceArray: same dtype and device
        return like.owner.new_empty(shape)
    if like.device != "cpu":
        raise TypeError(f"{like_name}: cannot allocate outputs on {like.device} for "
                        f"{type(like.owner).__name__}; pass out=")
    return np.empty(shape, dtype=numpy_dtype)


def run(operator_class, inputs, output_names, output_shapes, out):
    """Convert the inputs, allocate (or take from ``out``) the outputs, run, and return the outputs.

    ``inputs``: name -> array in C order; ``output_shapes``: the shapes of a fresh allocation.
    """
    input_refs = {name: as_tensor(array, name) for name, array in inputs.items()}
    if out is None:
        first_name, first = next(iter(input_refs.items()))
        out = tuple(new_output(first, shape, first_name) for shape in output_shapes(input_refs))
    elif not isinstance(out, (tuple, list)) or len(out) != len(output_names):
        raise TypeError(f"out: expected a tuple of {len(output_names)} arrays ({', '.join(output_names)})")
    output_refs = {name: as_tensor(array, name, writable=True) for name, array in zip(output_names, out)}
    refs = {**output_refs, **input_refs}
    operator = cached_operator(operator_class, refs)
    operator._launch(list(refs.values()), None, None)
    return tuple(out)
