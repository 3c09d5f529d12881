"""The functional API's fast path: a call on plain numpy arrays whose layouts and options already passed every
check once runs straight into the native function, without converting or validating again.

An entry is made only after a fully checked run on exact np.ndarray, C-contiguous arrays (see remember). Its
key is what may differ between two such calls: the op, the option values, which outputs are wanted, whether
out= was given, and each array's type, dtype and shape (None where absent). Strides need no place in it:
ffi.from_buffer takes only C-contiguous arrays, and C-contiguous arrays of one shape share their significant
strides (those of dims of size > 1; an empty array's layout is the contiguous one anyway, see tensors.py).

What depends on the data pointers is left to the native run, and any doubt sends the call back to the checked
path, which raises the precise error: a buffer ffi.from_buffer refuses (strided, read-only output, not a
buffer) and a BAD_PARAM status (tensors sharing memory; the native op checks footprints as _aliasing does).

The whole path costs a few microseconds, most of it one ffi.from_buffer per array, so its steps are written
to be cheap: see compile_run.

Contiguous torch CPU tensors (torch.Tensor, nn.Parameter) get entries of their own, under the same kind of key,
after a checked run on them; the same compiled path looks them up with the key it built (a miss among the numpy
entries) and takes their pointers, checking per call the device and the contiguity, which the key does not hold.
"""

import functools
import sys
import threading

import numpy as np

from . import _host_memory
from ._ffi import ffi
from .errors import BadParamError, check
from .tensors import torch_cpu_pointer

CACHE_SIZE = 64  # entries kept; the table is emptied when full (a workload has few layouts)

_lock = threading.Lock()  # serializes writers; readers use dict.get, which is atomic
_runners = {}  # key -> run(out, pointers) of one known layout of numpy arrays
_torch_runners = {}  # the same for contiguous torch CPU tensors (see _torch_pointers)


def _layout(array):
    return None if array is None else (type(array), array.dtype, array.shape)


def key(op, options, wanted, out, inputs):
    """The fast-path key of a call (the one compile_run's functions build, in plain form), or None for a
    call no entry can match: out= neither None nor a tuple or list, or an argument without numpy's attributes.
    ``op``: the functional op (its Signature); ``options``, ``wanted``: tuples of its option values and of
    which outputs are computed."""
    if out is not None and type(out) is not tuple and type(out) is not list:
        return None
    try:
        return (op, options, wanted, out is None, *map(_layout, (*(out or ()), *inputs)))
    except AttributeError:
        return None


def compile_run(op, output_count, input_count, checked_run):
    """run(inputs, out, options, wanted) of the functional op ``op`` (of this many outputs and inputs): its
    outputs, through the known layout where the call has one, else from checked_run(op, inputs, out, options,
    wanted).

    Written out for the exact number of arrays, without loops, and compiled once per op: in CPython 3.11
    looping over a call's up to ten arrays (for the key, then for the pointers) costs about 1 microsecond more
    than the same steps in straight-line code, a fifth of the functional API's overhead budget."""
    outputs = [f"out{index}" for index in range(output_count)]
    inputs = [f"in{index}" for index in range(input_count)]

    def layouts(names):
        return ", ".join(f"None if {name} is None else (type({name}), {name}.dtype, {name}.shape)" for name in names)

    def pointers(names, writable):
        keyword = ", require_writable=True" if writable else ""
        return ", ".join(f"null if {name} is None else from_buffer({name}{keyword})" for name in names)

    source = f"""
def run(inputs, out, options, wanted):
    {", ".join(inputs)}, = inputs
    runner = pointers = call_key = None
    try:
        if out is None:
            call_key = (op, options, wanted, True, {layouts(inputs)})
            runner = get_runner(call_key)
            if runner is not None:
                pointers = [{pointers(inputs, False)}]
        elif (type(out) is tuple or type(out) is list) and len(out) == {output_count}:
            {", ".join(outputs)}, = out
            call_key = (op, options, wanted, False, {layouts(outputs)}, {layouts(inputs)})
            runner = get_runner(call_key)
            if runner is not None:
                pointers = [{pointers(outputs, True)}, {pointers(inputs, False)}]
        if runner is None and torch_runners and call_key is not None:
            runner = torch_runners.get(call_key)
            if runner is not None:
                pointers = torch_pointers(inputs, 0) if out is None else torch_pointers((*out, *inputs), {output_count})
    # Not numpy-like, an unhashable dtype or shape, a buffer ffi.from_buffer refuses (strided: not
    # C-contiguous; a read-only output; not a buffer), or a torch attribute that raises.
    except (AttributeError, BufferError, TypeError, ValueError, RuntimeError):
        pointers = None
    if pointers is not None:
        outputs = runner(out, pointers)
        if outputs is not None:
            return outputs
    return checked_run(op, inputs, out, options, wanted)
"""
    namespace = {"op": op, "checked_run": checked_run, "get_runner": _runners.get, "from_buffer": ffi.from_buffer,
                 "null": ffi.NULL, "torch_runners": _torch_runners, "torch_pointers": _torch_pointers}
    exec(compile(source, f"<functional fast path of {op}>", "exec"), namespace)
    return namespace["run"]


def remember(op, options, wanted, out_given, out, inputs, operator):
    """Make an entry for a call (``out_given``: whether out= was passed) that just passed every check and ran
    on ``operator``, writing ``out``, where all its arrays are C-contiguous np.ndarray, or all contiguous torch
    CPU tensors (then in _torch_runners)."""
    call_key = key(op, options, wanted, out if out_given else None, inputs)
    if call_key is None:
        return
    arrays = [array for array in (*out, *inputs) if array is not None]
    if all(type(array) is np.ndarray and array.flags.c_contiguous for array in arrays):
        runners = _runners
        new_outputs = [None if array is None else _host_memory.allocator(array.shape, array.dtype) for array in out]
        pointer_of = ffi.from_buffer
    elif all(torch_cpu_pointer(array, index < len(out)) is not None
             for index, array in enumerate((*out, *inputs)) if array is not None):
        torch = sys.modules["torch"]
        runners = _torch_runners
        new_outputs = [None if array is None else functools.partial(torch.empty, array.shape, dtype=array.dtype)
                       for array in out]
        pointer_of = torch_cpu_pointer
    else:
        return
    runner = _runner(operator, new_outputs, pointer_of)
    with _lock:
        if len(runners) >= CACHE_SIZE:
            runners.clear()
        runners[call_key] = runner


def _torch_pointers(arrays, output_count):
    """The data pointers of a known torch layout's arrays (ffi.NULL for absent ones), or None where one is not a
    contiguous torch CPU tensor that may be passed as it is: the key holds neither the device nor the strides,
    so torch_cpu_pointer checks both, per call."""
    pointers = []
    for index, array in enumerate(arrays):
        pointer = ffi.NULL if array is None else torch_cpu_pointer(array, index < output_count)
        if pointer is None:
            return None
        pointers.append(pointer)
    return pointers


def _runner(operator, new_outputs, pointer_of):
    """run(out, pointers) of one known layout: ``pointers`` of the arrays in C order (those of the outputs only
    where ``out`` is given; else fresh outputs are made by ``new_outputs``: per output, a function of no
    arguments, or None where not wanted, and pointed to by ``pointer_of``), then the native call; the outputs, or
    None where the checked path must decide."""
    # Taken once: each attribute lookup or bound method made per call costs tens of nanoseconds. The operator
    # stays open: the functional caches never close theirs (nobody else holds them), this closure keeps it alive,
    # and finalizers do not run at exit (_resource.py), so no call needs close()'s wait.
    native, run_native, workspace_size = operator._pointer, operator._run_native, operator.workspace_size
    take_workspace, spare_workspaces = operator._take_workspace, operator._spare_workspaces
    tensor_count = len(operator.layouts)  # without the Ex run, trailing absent tensors are not passed
    run_name = f"infiniop{operator._c_name}"
    null = ffi.NULL

    def run(out, pointers):
        if out is None:
            out = tuple([None if new is None else new() for new in new_outputs])
            pointers[:0] = [null if array is None else pointer_of(array) for array in out]
        if len(pointers) > tensor_count:
            del pointers[tensor_count:]
        if workspace_size:
            try:
                workspace = spare_workspaces.pop()  # (owner, pointer), never shared by two threads at once
            except IndexError:
                workspace = take_workspace()
            try:
                # cffi releases the GIL for the duration of the native call.
                status = run_native(native, workspace[1], workspace_size, *pointers, null)
            finally:
                spare_workspaces.append(workspace)
        else:
            status = run_native(native, null, 0, *pointers, null)
        if status:
            try:
                check(status, run_name)
            except BadParamError:  # tensors sharing memory: the checked path raises the error naming them
                return None
        return out if type(out) is tuple else tuple(out)

    return run
