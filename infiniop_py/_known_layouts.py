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

Torch tensors (torch.Tensor, nn.Parameter) of any layout the native op takes as it is, on the CPU or CUDA, get
entries of their own after a checked run on them, under a key of their own (each kind's key is built only where the
first input is of that kind): per tensor its type, dtype, shape, strides, device (type and index) and negative bit,
and for an output whether it requires grad. So another device, dtype or layout never reuses a wrong entry, and a tensor the checked
path must decide (the negative bit, an output requiring grad) finds none: those are never remembered. The stream is
no part of the layout: each CUDA call reads torch's current stream on the tensors' device, and takes its workspace
from torch's caching allocator, which hands a block to another stream only after this one's work on it (and, under
CUDA-graph capture, from the graph's pool); the operator's spare workspaces, one list for all streams, serve the CPU.
Their data and the stream go to the native run as the integers torch gives (_ffi.by_address), not cast to void *.
Once infiniop_py.torch has loaded its C++ extension (the torch path's first call), a torch call without out= is also
remembered in a C++ table per (op, options, wanted outputs), which builds the key from the tensors' C++ fields, makes
the outputs with at::empty_strided and calls the native run in one call: 4 us for a small BatchNorm2d backward where
this Python path takes 12.6 (use_native_torch_calls). It keys, refuses and runs as the Python entries do (exact
torch.Tensor or nn.Parameter, no negative bit; per tensor dtype, device, shape and strides; torch's current stream
and its caching allocator's workspace on CUDA), and gives None, sending the call here, wherever it does not serve.

DeviceArrays (the package's own arrays, and the outputs that arrays of other libraries get) have entries of their
own too, looked up where the first input is a DeviceArray: per array its type, dtype, shape, strides, device and
device id. They run on the default stream with its spare workspaces, as the checked path runs them; a closed one
raises in the lookup, so the checked path reports it.
"""

import functools
import sys
import threading

import numpy as np

from . import _host_memory
from ._device_memory import DeviceArray, array_maker
from ._ffi import ffi
from .errors import BadParamError, check

CACHE_SIZE = 64  # entries kept; the table is emptied when full (a workload has few layouts)

_lock = threading.Lock()  # serializes writers; readers use dict.get, which is atomic
_runners = {}  # key -> run(out, pointers) of one known layout of numpy arrays
_torch_runners = {}  # torch key -> run(out, pointers) of one known layout of torch tensors
_device_array_runners = {}  # DeviceArray key -> run(out, pointers) of one known layout of DeviceArrays
_VOID_POINTER = ffi.typeof("void *")  # cffi parses a type given as a string on every cast
# (op, options, wanted) -> the known torch layouts of calls without out=, in C++ (see use_native_torch_calls)
_native_torch_tables = {}
_native_torch_table = None  # the C++ table's class, once infiniop_py.torch has loaded its extension


def use_native_torch_calls(table_class):
    """From now on remember torch calls without out= in C++ tables too: ``table_class`` (KnownTorchCalls of
    infiniop_py.torch's C++ extension, loaded on the torch path's first use) builds the key, makes the outputs and
    calls the native run in one call, a third of the Python path's host time (issue 52). The Python entries stay:
    for out=, and for a call the C++ table does not look up."""
    global _native_torch_table
    _native_torch_table = table_class


def forget():
    """Empty every table of known layouts (the compiled paths hold them: emptied, not replaced)."""
    with _lock:
        for table in (_runners, _torch_runners, _device_array_runners, _native_torch_tables):
            table.clear()


def _layout(array):
    return None if array is None else (type(array), array.dtype, array.shape)


def _torch_layout(tensor, written=False):
    if tensor is None:
        return None
    layout = (type(tensor), tensor.dtype, tensor.shape, tensor.stride(), tensor.device, tensor.is_neg())
    return (*layout, tensor.requires_grad) if written else layout


def _torch_output_layout(tensor):
    return _torch_layout(tensor, written=True)


def _device_array_layout(array):
    if array is None:
        return None
    return (type(array), array.dtype, array.shape, array.strides, array.buffer.device, array.buffer.device_id)


def _call_key(output_layout, input_layout, op, options, wanted, out, inputs):
    """(op, options, wanted, whether out= is absent, each output's layout, each input's layout), or None for a call
    no entry can match: out= neither None nor a tuple or list, or an argument without the attributes its kind's
    layout reads (or one that raises TypeError: a torch attribute of something else)."""
    if out is not None and type(out) is not tuple and type(out) is not list:
        return None
    try:
        return (op, options, wanted, out is None, *map(output_layout, out or ()), *map(input_layout, inputs))
    except (AttributeError, TypeError):
        return None


def key(op, options, wanted, out, inputs):
    """The fast-path key of a call on numpy arrays (the one compile_run's functions build, in plain form), or None
    (see _call_key). ``op``: the functional op (its Signature); ``options``, ``wanted``: tuples of its option
    values and of which outputs are computed."""
    return _call_key(_layout, _layout, op, options, wanted, out, inputs)


def torch_key(op, options, wanted, out, inputs):
    """The fast-path key of a call on torch tensors (see key): outputs also hold whether they require grad."""
    return _call_key(_torch_output_layout, _torch_layout, op, options, wanted, out, inputs)


def device_array_key(op, options, wanted, out, inputs):
    """The fast-path key of a call on DeviceArrays (see key)."""
    return _call_key(_device_array_layout, _device_array_layout, op, options, wanted, out, inputs)


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

    def torch_layouts(names, written):
        requires_grad = ", {name}.requires_grad" if written else ""
        return ", ".join(f"None if {name} is None else (type({name}), {name}.dtype, {name}.shape, {name}.stride(), "
                         f"{name}.device, {name}.is_neg(){requires_grad.format(name=name)})" for name in names)

    def torch_pointers(names):
        return ", ".join(f"0 if {name} is None else {name}.data_ptr()" for name in names)  # see _ffi.by_address

    def device_array_layouts(names):
        return ", ".join(f"None if {name} is None else (type({name}), {name}.dtype, {name}.shape, {name}.strides, "
                         f"{name}.buffer.device, {name}.buffer.device_id)" for name in names)

    def device_array_pointers(names):  # ClosedError (a RuntimeError) for a closed one: the checked path says so
        return ", ".join(f"null if {name} is None else {name}.buffer._open_pointer()" for name in names)

    source = f"""
def run(inputs, out, options, wanted):
    {", ".join(inputs)}, = inputs
    runner = pointers = None
    try:
        if out is None:
            if type(in0) is ndarray:  # numpy entries hold exact ndarrays only: no key to build for other arrays
                runner = get_runner((op, options, wanted, True, {layouts(inputs)}))
                if runner is not None:
                    pointers = [{pointers(inputs, False)}]
            elif type(in0) is device_array:
                runner = get_device_array_runner((op, options, wanted, True, {device_array_layouts(inputs)}))
                if runner is not None:
                    pointers = [{device_array_pointers(inputs)}]
            else:
                native_table = get_native_table((op, options, wanted))
                if native_table is not None:
                    outputs = native_table.run(inputs)
                    if outputs is not None:
                        return outputs
                if torch_runners:
                    runner = get_torch_runner((op, options, wanted, True, {torch_layouts(inputs, False)}))
                    if runner is not None:
                        pointers = [{torch_pointers(inputs)}]
        elif (type(out) is tuple or type(out) is list) and len(out) == {output_count}:
            {", ".join(outputs)}, = out
            if type(in0) is ndarray:
                runner = get_runner((op, options, wanted, False, {layouts(outputs)}, {layouts(inputs)}))
                if runner is not None:
                    pointers = [{pointers(outputs, True)}, {pointers(inputs, False)}]
            elif type(in0) is device_array:
                runner = get_device_array_runner((op, options, wanted, False, {device_array_layouts(outputs)},
                                                  {device_array_layouts(inputs)}))
                if runner is not None:
                    pointers = [{device_array_pointers(outputs)}, {device_array_pointers(inputs)}]
            elif torch_runners:
                runner = get_torch_runner((op, options, wanted, False, {torch_layouts(outputs, True)},
                                           {torch_layouts(inputs, False)}))
                if runner is not None:
                    pointers = [{torch_pointers(outputs)}, {torch_pointers(inputs)}]
    # Not numpy-like, an unhashable dtype or shape, a buffer ffi.from_buffer refuses (strided: not
    # C-contiguous; a read-only output; not a buffer), or (a numpy miss with torch entries known) not a
    # torch tensor, or a torch attribute that raises, or a DeviceArray among them that is closed.
    except (AttributeError, BufferError, TypeError, ValueError, RuntimeError):
        pointers = None
    if pointers is not None:
        outputs = runner(out, pointers)
        if outputs is not None:
            return outputs
    return checked_run(op, inputs, out, options, wanted)
"""
    namespace = {"op": op, "checked_run": checked_run, "get_runner": _runners.get, "from_buffer": ffi.from_buffer,
                 "null": ffi.NULL, "torch_runners": _torch_runners, "get_torch_runner": _torch_runners.get,
                 "ndarray": np.ndarray, "device_array": DeviceArray,
                 "get_device_array_runner": _device_array_runners.get, "get_native_table": _native_torch_tables.get}
    exec(compile(source, f"<functional fast path of {op}>", "exec"), namespace)
    return namespace["run"]


def remember(op, options, wanted, out_given, out, inputs, operator):
    """Make an entry for a call (``out_given``: whether out= was passed) that just passed every check and ran
    on ``operator`` with its arrays as they are (not packed copies), writing ``out``, where all its arrays are
    C-contiguous np.ndarray, or all DeviceArrays (then in _device_array_runners), or all torch tensors on one CPU
    or CUDA device (then in _torch_runners)."""
    arrays = [array for array in (*out, *inputs) if array is not None]
    if all(type(array) is np.ndarray and array.flags.c_contiguous for array in arrays):
        call_key = key(op, options, wanted, out if out_given else None, inputs)
        if call_key is None:
            return
        runners = _runners
        new_outputs = [None if array is None else _host_memory.allocator(array.shape, array.dtype) for array in out]
        runner = _runner(operator, new_outputs, ffi.from_buffer)
    elif all(type(array) is DeviceArray for array in arrays):
        call_key = device_array_key(op, options, wanted, out if out_given else None, inputs)
        if call_key is None:
            return
        runners = _device_array_runners
        runner = _device_array_runner(operator, out)
    else:
        runner = _torch_runner(operator, out, arrays)
        if runner is None:
            return
        call_key = torch_key(op, options, wanted, out if out_given else None, inputs)
        if call_key is None:
            return
        runners = _torch_runners
        if not out_given and _native_torch_table is not None and operator._seed_order is None:
            _remember_natively((op, options, wanted), out, inputs, operator)
    with _lock:
        if len(runners) >= CACHE_SIZE:
            runners.clear()
        runners[call_key] = runner


def _remember_natively(table_key, out, inputs, operator):
    """The entry of a checked torch call without out= (one _torch_runner takes) in its C++ table: that table makes
    the key from the same tensors as its lookups do, and holds ``operator`` (its descriptor stays open)."""
    with _lock:
        table = _native_torch_tables.get(table_key)
        if table is None:
            if len(_native_torch_tables) >= CACHE_SIZE:
                _native_torch_tables.clear()
            table = _native_torch_tables[table_key] = _native_torch_table()
        table.remember(tuple(inputs), tuple(out), operator, int(ffi.cast("uintptr_t", operator._pointer)),
                       int(ffi.cast("uintptr_t", operator._run_native)), operator.workspace_size,
                       len(operator.layouts))


def _torch_runner(operator, out, arrays):
    """The runner of a checked torch call (see remember), or None where its tensors may not be remembered:
    another type than torch.Tensor or nn.Parameter (a subclass may mean anything by data_ptr), devices other
    than one CPU or CUDA device, or what the checked path must decide per call (the negative bit: it resolves a
    copy; an output requiring grad: refused while grad mode is on). The key holds each of these, so a call
    that has them finds no entry."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    types = (torch.Tensor, torch.nn.Parameter)
    if not all(type(array) in types and not array.is_neg() for array in arrays):
        return None
    if any(array is not None and array.requires_grad for array in out):
        return None
    devices = {array.device for array in arrays}
    device = next(iter(devices))
    if len(devices) != 1 or device.type not in ("cpu", "cuda"):
        return None
    # Fresh outputs take the remembered strides: the checked run's choice (a channels-last grad_input) is a
    # function of the inputs' layouts, which the key holds.
    new_outputs = [None if array is None else functools.partial(torch.empty_strided, tuple(array.shape),
                                                                array.stride(), dtype=array.dtype, device=device)
                   for array in out]
    if device.type == "cpu":
        return _runner(operator, new_outputs, _torch_address, addresses=True)
    # Per call, not cached: the caller may switch streams between calls (torch.cuda.stream). torch's raw getter
    # (the one its compiled code calls) gives the address without making a Stream object.
    raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_stream is not None:
        stream_of = functools.partial(raw_stream, device.index)
    else:
        index, current_stream = device.index, torch.cuda.current_stream

        def stream_of():
            return current_stream(index).cuda_stream

    # Stream-ordered and capture-safe, where the operator's spare list would be shared by all streams.
    new_workspace = functools.partial(torch.empty, operator.workspace_size, dtype=torch.uint8, device=device)
    return _runner(operator, new_outputs, _torch_address, stream_of, new_workspace, addresses=True)


def _device_array_runner(operator, out):
    """The runner of a checked call on DeviceArrays (see remember), all on the operator's device (the checked run
    made sure): fresh outputs take the remembered layout, as for torch; the run is on the default stream, as the
    checked path's for DeviceArrays (_functional.library_stream), with that stream's spare workspaces."""
    new_outputs = [None if array is None else array_maker(array.shape, array.dtype, array.device,
                                                          array.device_id, array.strides) for array in out]
    return _runner(operator, new_outputs, _device_array_pointer)


def _device_array_pointer(array):
    return array.buffer._open_pointer()


def _torch_address(tensor):
    return tensor.data_ptr()


def _runner(operator, new_outputs, pointer_of, stream_of=None, new_workspace=None, addresses=False):
    """run(out, pointers) of one known layout: ``pointers`` of the arrays in C order (those of the outputs only
    where ``out`` is given; else fresh outputs are made by ``new_outputs``: per output, a function of no
    arguments, or None where not wanted, and pointed to by ``pointer_of``), then the native call; the outputs, or
    None where the checked path must decide. ``stream_of``: None (the CPU), or a function giving the stream's
    address for each call; ``new_workspace``: None (the operator's spare workspaces of the default stream serve:
    the CPU's, or a GPU's for DeviceArrays), or a function giving a fresh torch tensor of workspace_size bytes per
    call; ``addresses``: whether the pointers and the stream are integer addresses (torch's; see _ffi.by_address),
    not cdata."""
    # Taken once: each attribute lookup or bound method made per call costs tens of nanoseconds. The operator
    # stays open: the functional caches never close theirs (nobody else holds them), this closure keeps it alive,
    # and finalizers do not run at exit (_resource.py), so no call needs close()'s wait.
    native, workspace_size = operator._pointer, operator.workspace_size
    run_native = operator._run_native_by_address() if addresses else operator._run_native
    take_workspace = operator._take_workspace
    spare_workspaces = None if new_workspace is not None else operator._spares_on(ffi.NULL)
    tensor_count = len(operator.layouts)  # without the Ex run, trailing absent tensors are not passed
    run_name = f"infiniop{operator._c_name}"
    null, cast, void_pointer = ffi.NULL, ffi.cast, _VOID_POINTER
    absent = 0 if addresses else null  # an absent tensor's pointer, and the CPU's stream

    def run(out, pointers):
        if out is None:
            out = tuple([None if new is None else new() for new in new_outputs])
            pointers[:0] = [absent if array is None else pointer_of(array) for array in out]
        if len(pointers) > tensor_count:
            del pointers[tensor_count:]
        stream = absent if stream_of is None else stream_of()
        if not workspace_size:
            status = run_native(native, null, 0, *pointers, stream)
        elif new_workspace is not None:
            workspace = new_workspace()  # held until the launch returns; torch frees it in stream order
            status = run_native(native, cast(void_pointer, workspace.data_ptr()), workspace_size, *pointers, stream)
        else:
            workspace = take_workspace(spare_workspaces)  # (owner, pointer), never shared by two threads at once
            try:
                # cffi releases the GIL for the duration of the native call.
                status = run_native(native, workspace[1], workspace_size, *pointers, stream)
            finally:
                spare_workspaces.append(workspace)
        if status:
            try:
                check(status, run_name)
            except BadParamError:  # tensors sharing memory: the checked path raises the error naming them
                return None
        return out if type(out) is tuple else tuple(out)

    return run
