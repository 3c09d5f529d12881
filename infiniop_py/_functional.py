"""What the functional API shares: default handles, the operator cache, output allocation."""

import collections
import threading

import numpy as np

from . import dtypes
from ._ffi import ffi
from . import _layout
from ._layout import TensorSpec, contiguous_strides, significant_strides
from .errors import BadParamError, BadTensorStridesError
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


def _first_present(refs):
    return next(ref for ref in refs.values() if ref is not None)


def cached_operator(operator_class, refs, options):
    """The operator object for these TensorRefs' layouts (a dict in C order, None for absent tensors) and
    constructor ``options``, created once per layout."""
    first = _first_present(refs)
    key = (operator_class, first.device, first.device_id, tuple(sorted(options.items())),
           tuple(None if ref is None else (ref.dtype, ref.shape, significant_strides(ref.shape, ref.strides))
                 for ref in refs.values()))
    with _lock:
        operator = _operators.get(key)
        if operator is None:
            handle = default_handle(first.device, first.device_id)
            specs = [None if ref is None else TensorSpec(ref.shape, ref.dtype, ref.strides) for ref in refs.values()]
            operator = _operators[key] = operator_class(handle, *specs, **options)
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
    if _library_of(like.owner) == "cupy":
        import cupy
        with cupy.cuda.Device(like.device_id):
            return cupy.empty(shape, dtype=numpy_dtype)
    if like.device != "cpu":
        raise TypeError(f"{like_name}: cannot allocate outputs on {like.device} for "
                        f"{type(like.owner).__name__}; pass out=")
    return np.empty(shape, dtype=numpy_dtype)


def _library_of(array):
    return type(array).__module__.split(".")[0]


def library_stream(ref):
    """The stream torch or cupy is using on the array's GPU, so the run is ordered after the work that made its
    inputs (torch's side streams do not wait for the default stream); None (the default stream) otherwise."""
    if ref.device != "nvidia":
        return None
    library = _library_of(ref.owner)
    if library == "torch":
        import torch
        return torch.cuda.current_stream(ref.device_id)
    if library == "cupy":
        import cupy
        with cupy.cuda.Device(ref.device_id):
            return cupy.cuda.get_current_stream()
    return None


def _layouts(arrays):
    """(type, dtype, shape, byte strides) of each array (None stays None); AttributeError for objects without
    numpy's attributes."""
    return tuple([None if array is None else (type(array), array.dtype, array.shape, array.strides)
                  for array in arrays])


def _fast_key(operator_class, inputs, out, options, wanted):
    """The fast-path key of a call; entries exist only for all-numpy calls (see run), so others never match.
    An operator class's functional wrapper always passes the same option names, so their values suffice."""
    try:
        return (operator_class, tuple(options.values()), wanted, None if out is None else _layouts(out),
                _layouts(inputs.values()))
    except (AttributeError, TypeError):  # not numpy-like, or out not a sequence
        return None


def _run_fast(entry, inputs, out):
    """Run through a known layout, or return None when a buffer cannot be taken directly (the slow path then
    checks everything and raises the precise error)."""
    operator, output_specs = entry
    if out is None:
        out = tuple(None if spec is None else np.empty(spec[0], dtype=spec[1]) for spec in output_specs)
    try:
        buffers = [ffi.NULL if array is None else ffi.from_buffer(array, require_writable=True) for array in out]
        buffers += [ffi.NULL if array is None else ffi.from_buffer(array) for array in inputs.values()]
    except (BufferError, TypeError, ValueError):  # strided (not C-contiguous) or read-only
        return None
    try:
        operator._run_buffers(buffers[:len(operator.layouts)])
    except BadParamError:  # tensors sharing memory: the checked path raises the error naming them
        return None
    return tuple(out)


def _packed(ref, name, writable):
    """A packed (C-contiguous) copy of ref's array, or None where it is packed already or cannot be copied
    (an output that overlaps itself has no one value per element to copy back)."""
    if significant_strides(ref.shape, ref.strides) == significant_strides(ref.shape, contiguous_strides(ref.shape)):
        return None
    if writable and not _layout.non_overlapping(TensorSpec(ref.shape, ref.dtype, ref.strides)):
        return None
    owner = ref.owner
    if isinstance(owner, np.ndarray):
        copy = np.ascontiguousarray(owner)
    elif hasattr(owner, "contiguous") and hasattr(owner, "copy_"):  # torch
        copy = owner.contiguous()
    else:
        return None
    return as_tensor(copy, name, writable=writable)


def _launch_packed(operator_class, refs, output_names, options):
    """Run on packed copies of the arrays whose layout the native op refused, then copy the outputs back.
    Costs one extra read and write of each copied array."""
    packed = {name: None if ref is None else _packed(ref, name, name in output_names) for name, ref in refs.items()}
    if not any(packed.values()):
        return False
    run_refs = {name: packed[name] or ref for name, ref in refs.items()}
    operator = cached_operator(operator_class, run_refs, options)
    operator._launch([run_refs[name] for name in operator.layouts], None, library_stream(_first_present(refs)))
    for name in output_names:
        if packed.get(name) is not None:
            target, source = refs[name].owner, packed[name].owner
            if isinstance(target, np.ndarray):
                np.copyto(target, source)
            else:
                target.copy_(source)
    return True


def run(operator_class, inputs, output_names, output_specs, out, options=None, wanted=None, optional=()):
    """Convert the inputs, allocate (or take from ``out``) the outputs, run, and return the outputs.

    ``inputs``: name -> array (None: absent) in C order; ``output_specs(refs)``: per output, (shape, name of
    the input whose dtype and device it takes) for a fresh allocation; ``wanted``: per output, whether it
    is computed (all by default); ``options``: keyword arguments of ``operator_class``; ``optional``: the
    inputs that may be None (absent). A layout the native op refuses as strided runs on
    packed copies (see _launch_packed).
    """
    options = options or {}
    wanted = tuple(wanted or (True,) * len(output_names))
    fast_key = _fast_key(operator_class, inputs, out, options, wanted)
    fast_entry = _numpy_fast_path.get(fast_key) if fast_key is not None else None
    if fast_entry is not None:
        result = _run_fast(fast_entry, inputs, out)
        if result is not None:
            return result
    for name, array in inputs.items():
        if array is None and name not in optional:
            raise TypeError(f"{name}: expected an array, got None")
    input_refs = {name: None if array is None else as_tensor(array, name) for name, array in inputs.items()}
    specs = [spec if want else None for spec, want in zip(output_specs(input_refs), wanted)]
    if out is None:
        out = tuple(None if spec is None else new_output(input_refs[spec[1]], spec[0], spec[1]) for spec in specs)
    elif not isinstance(out, (tuple, list)) or len(out) != len(output_names):
        raise TypeError(f"out: expected a tuple of {len(output_names)} arrays ({', '.join(output_names)}), "
                        f"None where an output is not wanted")
    for name, spec, array in zip(output_names, specs, out):
        if spec is not None and array is None:
            raise TypeError(f"{name}: expected an array in out=, got None (this output is wanted)")
        if spec is None and array is not None:
            raise ValueError(f"out: {name} is not wanted, so pass None for it")
    output_refs = {name: None if array is None else as_tensor(array, name, writable=True)
                   for name, array in zip(output_names, out)}
    refs = {**output_refs, **input_refs}
    try:
        operator = cached_operator(operator_class, refs, options)
    except BadTensorStridesError:
        if _launch_packed(operator_class, refs, output_names, options):
            return tuple(out)
        raise
    operator._launch([refs[name] for name in operator.layouts], None, library_stream(_first_present(refs)))
    arrays = [array for array in (*out, *inputs.values()) if array is not None]
    if fast_key is not None and all(type(array) is np.ndarray for array in arrays):
        with _lock:
            if len(_numpy_fast_path) >= CACHE_SIZE:
                _numpy_fast_path.clear()
            _numpy_fast_path[fast_key] = (operator, [None if a is None else (a.shape, a.dtype) for a in out])
    return tuple(out)
