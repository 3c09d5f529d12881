"""What the functional API shares: default handles, the operator cache, output allocation, the checked run."""

import collections
import re
import threading

import numpy as np

from . import dtypes
from . import _host_memory, _known_layouts, _layout
from ._device_memory import DeviceArray
from ._layout import TensorSpec, contiguous_strides, significant_strides
from .errors import BadTensorDtypeError, BadTensorShapeError, BadTensorStridesError, InfiniopError
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


def new_output(like, shape, like_name, dtype=None):
    """An empty C-contiguous output with ``like``'s dtype (or the dtype code ``dtype``) on ``like``'s device: a
    torch tensor, cupy array or numpy array for one of those, else a DeviceArray."""
    numpy_dtype = dtypes.to_numpy(like.dtype if dtype is None else dtype, like_name)
    if _library_of(like.owner) == "torch":
        import torch
        return like.owner.new_empty(shape, dtype=getattr(torch, numpy_dtype.name))
    if _library_of(like.owner) == "cupy":
        import cupy
        with cupy.cuda.Device(like.device_id):
            return cupy.empty(shape, dtype=numpy_dtype)
    if isinstance(like.owner, DeviceArray) or like.device != "cpu":
        # Ours (on any device), or a device array of a library this package cannot allocate with (any
        # other __cuda_array_interface__ producer): a DeviceArray on the same device.
        return DeviceArray(shape, numpy_dtype, like.device, like.device_id)
    return _host_memory.empty(shape, numpy_dtype)


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


def require_out(out, names, wanted):
    """``out`` as a functional call takes it: a tuple (or list) of one array per output ``names``, None exactly
    where that output is not ``wanted``."""
    if not isinstance(out, (tuple, list)) or len(out) != len(names):
        raise TypeError(f"out: expected a tuple of {len(names)} arrays ({', '.join(names)}), "
                        f"None where an output is not wanted")
    for name, want, array in zip(names, wanted, out):
        if want and array is None:
            raise TypeError(f"{name}: expected an array in out=, got None (this output is wanted)")
        if not want and array is not None:
            raise ValueError(f"out: {name} is not wanted, so pass None for it")


def empty_in_layout(ref):
    """A fresh array with ``ref``'s dtype, shape and packed layout: numpy or cupy (their order "K"), torch (its
    strides), or for another library's device array (or a DeviceArray) a DeviceArray on its device (this package
    cannot allocate that library's arrays); None for another host array, or a layout that is not dense."""
    owner = ref.owner
    if isinstance(owner, np.ndarray):
        return np.empty_like(owner)  # order "K": the same packed layout
    if hasattr(owner, "new_empty_strided"):  # torch
        return owner.new_empty_strided(owner.shape, owner.stride())
    if _library_of(owner) == "cupy" and _layout.packed(ref.shape, ref.strides):
        import cupy
        with cupy.cuda.Device(ref.device_id):
            return cupy.empty_like(owner)  # order "K", as numpy's
    if ref.device == "cpu" and not isinstance(owner, DeviceArray):
        return None
    try:
        return DeviceArray(ref.shape, dtypes.to_numpy(ref.dtype), ref.device, ref.device_id, ref.strides)
    except ValueError:  # not dense
        return None


def empty_like_channels_last(ref):
    """A fresh array laid out like ``ref``'s when that is a channels-last packed (N, C, *spatial) one of rank >= 3
    (a C-contiguous output would not share its layout, which BatchNorm's kernels need), else None."""
    spec = TensorSpec(ref.shape, ref.dtype, ref.strides)
    if len(ref.shape) < 3 or _layout.batch_norm_layout([spec]) != "channels_last":
        return None
    return empty_in_layout(ref)


def _require_out_shapes(output_refs, specs, input_refs):
    """out= arrays of the shapes the inputs give, and the data-shaped one (the first) of its input's dtype: an
    error about them names out and the rule, not the input the native rules would compare them with."""
    for index, ((name, ref), spec) in enumerate(zip(output_refs.items(), specs)):
        if ref is None or spec is None:
            continue
        shape, like = tuple(spec[0]), spec[1]
        if tuple(ref.shape) != shape:
            raise BadTensorShapeError(f"out[{index}], {name}: shape {tuple(ref.shape)} must be {shape}, as {like} "
                                      f"gives it")
        like_dtype = input_refs[like].dtype
        if index == 0 and ref.dtype != like_dtype and like_dtype in dtypes.EX_SUPPORTED:  # else the input is wrong
            raise BadTensorDtypeError(f"out[0], {name}: dtype {dtypes.name(ref.dtype)} must be {like}'s dtype "
                                      f"{dtypes.name(like_dtype)}")


def _naming_inputs(error, output, like):
    """``error`` of the C rules, which compare every tensor with the first output, as the user sees it when the
    function allocated that output: named as the input it was made like (same shape and dtype), which is what
    disagrees with the tensor the message is about ("x: dtype F16 must equal grad_y's dtype F32", not grad_x's)."""
    message = re.sub(rf"\b{re.escape(output)}\b", like, str(error))
    return type(error)(message, status=error.status)


class Signature:
    """One functional op: its operator class, the names of its tensors and options, and ``run``, which each
    functional wrapper calls."""

    def __init__(self, operator_class, inputs, outputs, output_specs, options=(), optional=(), fresh_outputs=None):
        self.operator_class = operator_class
        self.inputs = inputs  # names of the input arrays, in C order
        self.outputs = outputs  # names of the outputs, in C order
        # refs (name -> TensorRef or None) -> per output, (shape, name of the input whose dtype and device
        # a fresh one takes), or (shape, that name, the dtype code it takes instead) for a statistic
        self.output_specs = output_specs
        self.options = options  # keyword names of operator_class's scalar options
        self.optional = optional  # the inputs that may be None (absent)
        # (refs, wanted) -> the fresh outputs of a call without out=, or None for the default (C-contiguous) ones.
        # Chosen here, in the checked run, so the fast path remembers their layout and the wrapper does no work
        # per call.
        self.fresh_outputs = fresh_outputs
        # run(inputs, out, options, wanted): the functional call, see run_checked
        self.run = _known_layouts.compile_run(self, len(outputs), len(inputs), run_checked)

    def __repr__(self):
        return f"Signature({self.operator_class.__name__})"


def run_checked(signature, inputs, out, options, wanted):
    """Convert the inputs, allocate (or take from ``out``) the outputs, check everything, run, and return the
    outputs: the functional call where the fast path (signature.run, _known_layouts) has no known layout.

    ``inputs``: the input arrays (None: absent) in signature.inputs' order; ``options``: the option values in
    signature.options' order; ``wanted``: per output, whether it is computed. A layout the native op refuses
    as strided runs on packed copies (see _launch_packed).
    """
    out_given, input_arrays, option_values = out is not None, inputs, options
    operator_class, output_names = signature.operator_class, signature.outputs
    inputs = dict(zip(signature.inputs, input_arrays))
    options = dict(zip(signature.options, option_values))
    for name, array in inputs.items():
        if array is None and name not in signature.optional:
            raise TypeError(f"{name}: expected an array, got None")
    input_refs = {name: None if array is None else as_tensor(array, name) for name, array in inputs.items()}
    specs = [spec if want else None for spec, want in zip(signature.output_specs(input_refs), wanted)]
    if out is None:
        out = None if signature.fresh_outputs is None else signature.fresh_outputs(input_refs, wanted)
        if out is None:
            out = tuple(None if spec is None else new_output(input_refs[spec[1]], *spec) for spec in specs)
    else:
        require_out(out, output_names, [spec is not None for spec in specs])
    output_refs = {name: None if array is None else as_tensor(array, name, writable=True)
                   for name, array in zip(output_names, out)}
    if out_given:
        _require_out_shapes(output_refs, specs, input_refs)
    refs = {**output_refs, **input_refs}
    try:
        operator = cached_operator(operator_class, refs, options)
    except BadTensorStridesError:
        if _launch_packed(operator_class, refs, output_names, options):
            return tuple(out)
        raise
    except InfiniopError as error:
        if out_given:
            raise
        raise _naming_inputs(error, output_names[0], specs[0][1]) from None
    operator._launch([refs[name] for name in operator.layouts], None, library_stream(_first_present(refs)))
    _known_layouts.remember(signature, option_values, wanted, out_given, out, input_arrays, operator)
    return tuple(out)
