"""Runs this library's backward operators on torch tensors at the host cost of one dict lookup.

The first call of a layout goes through the functional API's checked path (conversion, every rule, the operator
made and cached). Its operator is then kept under a key of everything the layout determines: the op, its option
values, which outputs are wanted, and per tensor its dtype, shape, strides, device and negative bit. A later call
with the same key passes the data pointers straight to the native run: no TensorRef, no validation, no attribute
query of a pointer. Another device, dtype or layout makes another key, so it never reuses a wrong entry; the stream
is not part of the layout, and is read per call (torch's current stream of the tensors' device). On CUDA the
workspace comes from torch's caching allocator on that stream, so calls on other streams never share one, and
under CUDA-graph capture it comes from the graph's private pool; on the CPU the operator's spare workspaces serve.

Only for outputs this package allocated just before (fresh tensors, which overlap no input): the per-call checks
this skips are the layout rules, which the key covers, and the aliasing of an output, which fresh outputs rule out.
"""

import threading

import torch

from .. import _functional
from .._ffi import ffi
from ..errors import BadTensorStridesError, check
from ..tensors import as_tensor

CACHE_SIZE = 256  # entries kept; the table is emptied when full (a model has a few layouts per norm)

_VOID_POINTER = ffi.typeof("void *")
_NULL = ffi.NULL
_lock = threading.Lock()  # serializes writers; readers use dict.get, which is atomic
_entries = {}


def _layout(tensor):
    return None if tensor is None else (tensor.dtype, tensor.shape, tensor.stride(), tensor.device, tensor.is_neg())


def run(signature, inputs, out, options, wanted):
    """``signature.run(inputs, out, options, wanted)`` (see _functional.Signature) for torch tensors: ``out`` holds
    fresh outputs (None where not wanted), in signature.outputs' order, and is returned."""
    tensors = (*out, *inputs)
    key = (signature, options, wanted, *map(_layout, tensors))
    entry = _entries.get(key)
    if entry is None:
        signature.run(inputs, out, options, wanted)
        _remember(key, signature, tensors, options)
        return out
    native, run_native, workspace_size, order, stream_of = entry
    pointers = [_NULL if index is None or tensors[index] is None else ffi.cast(_VOID_POINTER, tensors[index].data_ptr())
                for index in order]
    stream = _NULL if stream_of is None else ffi.cast(_VOID_POINTER, stream_of())
    if workspace_size == 0:
        status = run_native(native, _NULL, 0, *pointers, stream)
    else:
        status = _run_with_workspace(entry, tensors, pointers, stream)
    if status:
        check(status, "the native run of a cached layout")
    return out


def _run_with_workspace(entry, tensors, pointers, stream):
    native, run_native, workspace_size, _, stream_of = entry
    if stream_of is None:  # CPU: the call is over when it returns, so an idle workspace of the operator serves
        operator = entry.operator
        try:
            workspace = operator._spare_workspaces.pop()  # (owner, pointer), never shared by two threads at once
        except IndexError:
            workspace = operator._take_workspace()
        try:
            return run_native(native, workspace[1], workspace_size, *pointers, stream)
        finally:
            operator._spare_workspaces.append(workspace)
    device = next(tensor.device for tensor in tensors if tensor is not None)
    workspace = torch.empty(workspace_size, dtype=torch.uint8, device=device)  # freed in stream order
    return run_native(native, ffi.cast(_VOID_POINTER, workspace.data_ptr()), workspace_size, *pointers, stream)


class _Entry(tuple):
    """(native descriptor, run function, workspace size, per C argument the index of its tensor, stream getter or
    None on the CPU), and the operator that owns the descriptor (kept alive by the entry)."""

    operator = None


def _remember(key, signature, tensors, options):
    """Keep the operator the checked run used for this layout, where it ran on the tensors themselves (not on packed
    copies of a layout the native op refuses) with no tensor of the negative bit (the checked path copies those)."""
    present = [tensor for tensor in tensors if tensor is not None]
    if any(tensor.is_neg() for tensor in present):
        return
    names = (*signature.outputs, *signature.inputs)
    refs = {name: None if tensor is None else as_tensor(tensor, name) for name, tensor in zip(names, tensors)}
    try:
        operator = _functional.cached_operator(signature.operator_class, refs,
                                               dict(zip(signature.options, options)))
    except BadTensorStridesError:
        return
    index_of = {name: index for index, name in enumerate(names)}
    order = [index_of.get(name) for name in operator.layouts]
    device = present[0].device
    stream_of = None if device.type == "cpu" else _stream_getter(device)
    entry = _Entry((operator._pointer, operator._run_native, operator.workspace_size, order, stream_of))
    entry.operator = operator
    with _lock:
        if len(_entries) >= CACHE_SIZE:
            _entries.clear()
        _entries[key] = entry


def _stream_getter(device):
    """A function of no arguments giving torch's current stream on ``device`` as an address."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return lambda: torch.cuda.current_stream(index).cuda_stream
