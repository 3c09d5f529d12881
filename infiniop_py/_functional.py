"""What the functional API shares: default handles, the operator cache, output allocation."""

import collections
import threading

import numpy as np

from . import dtypes
from ._ffi import ffi
from ._layout import TensorSpec, significant_strides
from .errors import BadParamError
from .handle import Handle
from .tensors import as_tensor

CACHE_SIZE = 64  # operator objects kept, least recently used dropped first

_lock = threading.RLock()
_handles = {}  # (device, device_id) -> Handle
_operators = collections.OrderedDict()  # layout key -> operator object
# (operator class, numpy layouts of out or None, numpy layouts of the inputs) -> (operator, output (shape, dtype)s):
# layouts that passed every check once, so later calls with plain numpy arrays skip straight to the native run.
_numpy_fast_path = {}


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


def _layouts(arrays):
    """(type, dtype, shape, byte strides) of each array; AttributeError for objects without numpy's attributes."""
    return tuple([(type(array), array.dtype, array.shape, array.strides) for array in arrays])


def _fast_key(operator_class, inputs, out):
    """The fast-path key of a call; entries exist only for all-numpy calls (see run), so others never match."""
    try:
        return operator_class, None if out is None else _layouts(out), _layouts(inputs.values())
    except (AttributeError, TypeError):  # not numpy-like, or out not a sequence
        return None


def _run_fast(entry, inputs, out):
    """Run through a known layout, or return None when a buffer cannot be taken directly (the slow path then
    checks everything and raises the precise error)."""
    operator, output_specs = entry
    if out is None:
        out = tuple(np.empty(shape, dtype=dtype) for shape, dtype in output_specs)
    try:
        buffers = [ffi.from_buffer(array, require_writable=True) for array in out]
        buffers += [ffi.from_buffer(array) for array in inputs.values()]
    except (BufferError, TypeError, ValueError):  # strided (not C-contiguous) or read-only
        return None
    try:
        operator._run_buffers(buffers)
    except BadParamError:  # tensors sharing memory: the checked path raises the error naming them
        return None
    return tuple(out)


def run(operator_class, inputs, output_names, output_shapes, out):
    """Convert the inputs, allocate (or take from ``out``) the outputs, run, and return the outputs.

    ``inputs``: name -> array in C order; ``output_shapes``: the shapes of a fresh allocation.
    """
    fast_key = _fast_key(operator_class, inputs, out)
    fast_entry = _numpy_fast_path.get(fast_key) if fast_key is not None else None
    if fast_entry is not None:
        result = _run_fast(fast_entry, inputs, out)
        if result is not None:
            return result
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
    if fast_key is not None and all(type(array) is np.ndarray for array in (*out, *inputs.values())):
        with _lock:
            if len(_numpy_fast_path) >= CACHE_SIZE:
                _numpy_fast_path.clear()
            _numpy_fast_path[fast_key] = (operator, [(array.shape, array.dtype) for array in out])
    return tuple(out)
