"""Operator: what the three operator classes share.

Validate in Python (the C rules, same order), create the native descriptor, own it and the
workspace, check that the arrays of each call match the layout it was created for, and run.
"""

import math
import operator
import sys

import numpy as np

from . import dtypes
from ._aliasing import require_no_aliasing
from ._device_memory import DeviceBuffer
from ._ffi import by_address, ffi, libraries
from ._layout import TensorSpec, contiguous_strides, significant_strides
from ._resource import NativeResource
from .errors import (BadParamError, BadTensorDtypeError, BadTensorShapeError, BadTensorStridesError, ClosedError,
                     InsufficientWorkspaceError, NotImplementedStatusError, check)
from .handle import Handle
from .tensors import TensorDesc, as_tensor, is_array, torch_cpu_pointer


_BAD_PARAM = BadParamError.status
_MAX_STREAMS = 16  # streams whose idle workspaces an operator keeps (_spares_on)


def _stream_pointer(stream):
    if stream is None:
        return ffi.NULL
    if isinstance(stream, ffi.CData):
        return ffi.cast("void *", stream)
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream
        stream = stream.cuda_stream
    elif hasattr(stream, "ptr"):  # cupy.cuda.Stream
        stream = stream.ptr
    try:
        address = operator.index(stream)  # also numpy integers
    except TypeError:
        raise TypeError(f"stream: expected None, an int address, a torch or cupy stream or a cffi pointer, "
                        f"got {type(stream).__name__}") from None
    return ffi.cast("void *", address)


def _native_function(library, name):
    """A C function of the loaded library, or None where it lacks it (an InfiniCore install has no ...Ex)."""
    try:
        return getattr(library, name)
    except AttributeError:
        return None


def _create_call(name, handle, status):
    """How a failed create is named in its error: an Ascend NOT_IMPLEMENTED also says which aclnn operators this
    CANN install lacks, if that is why."""
    if status != NotImplementedStatusError.status or handle.device != "ascend":
        return name
    from ._ascend import missing_operators_reason  # only on this path: it loads CANN's libraries again

    reason = missing_operators_reason()
    return f"{name} ({reason})" if reason else name


class Operator(NativeResource):
    """Base of the operator classes. A subclass sets:

    _c_name       the C name between "infiniop" and "Descriptor", e.g. "RMSNormBackward"
    _outputs      names of the output tensors (written by the run)
    _in_place     (output, input) names of the one pair that may be the same memory with the same layout
    _check_layout the _layout.check_* function of the seed create (used without the Ex entry points)
    _check_layout_ex  the _layout.check_*_ex function of the Ex create
    _seed_count   how many of the leading tensors the seed create and run take
    _seed_optional  names of those the seed create takes as NULL (LayerNorm's and BatchNorm's grad_bias)
    _seed_names   the names of the tensors the seed create and run take, in their order, where they are not the
                  first _seed_count (RMSNorm's Ex forms put rstd among the outputs, before the seed's inputs)
    _seed_scalars names of the options the seed create takes too, after its tensors (RMSNorm's epsilon)
    _has_ex_run   whether infiniop<_c_name>Ex exists (it takes every tensor; else the seed run does)
    _seed_form_only  whether only the seed create and run take this class's tensors, the Ex ones being another
                  form's (LayerNormXhat: infiniopCreateLayerNormDescriptorEx takes mean and rstd, not xhat and std)
    _descriptor_c_name  the C name of the descriptor type and of its GetWorkspaceSize / Destroy functions, where
                  another op's serve this one (LayerNormBackwardFromInput's are LayerNormBackward's); else _c_name
    and passes the tensors to __init__ as a dict in the C argument order (None: an absent optional
    tensor), with the Ex create's scalar arguments as ``options`` and their seed meaning as ``seed_options``;
    its __call__ passes the arrays to _call in that same order.
    """

    _c_name = None
    _outputs = ()
    _in_place = ()
    _check_layout = None
    _check_layout_ex = None
    _seed_count = None
    _seed_optional = ()
    _seed_names = None
    _seed_scalars = ()
    _has_ex_run = False
    _seed_form_only = False
    _descriptor_c_name = None

    def __init__(self, handle, tensors, options=None, seed_options=None):
        if not isinstance(handle, Handle):
            raise TypeError(f"handle: expected a Handle, got {type(handle).__name__}")
        options, seed_options = options or {}, seed_options or {}
        self._handle = handle  # kept alive as long as the descriptor
        op = libraries().op
        create_ex = None if self._seed_form_only else _native_function(op, f"infiniopCreate{self._c_name}DescriptorEx")
        descriptor_name = self._descriptor_c_name or self._c_name
        temporaries = []
        try:
            handle_pointer = handle._begin_call()  # Handle.close() on another thread waits for the create
        except ClosedError:
            raise ClosedError(f"handle: Handle({handle.device!r}, {handle.device_id}) is closed; operators made "
                              f"from it before its close() keep working") from None
        try:
            descs = {name: None if tensor is None else self._descriptor_for(name, tensor, temporaries)
                     for name, tensor in tensors.items()}
            pointer = ffi.new(f"infiniop{descriptor_name}Descriptor_t *")
            if create_ex is not None:
                self._check_layout_ex(**descs, **options)
                natives = [ffi.NULL if desc is None else desc.native for desc in descs.values()]
                status = create_ex(handle_pointer, pointer, *natives, *options.values())
                check(status, _create_call(f"infiniopCreate{self._c_name}DescriptorEx", handle, status))
            else:
                if not self._seed_form_only:  # a seed-only form's own check names what it lacks
                    self._require_seed_call(descs, options, seed_options)
                seed_descs = {name: descs[name] for name in self._seed_tensor_names(descs)}
                seed_scalars = {name: options[name] for name in self._seed_scalars}
                self._check_layout(**seed_descs, **seed_scalars)
                create = f"infiniopCreate{self._c_name}Descriptor"
                natives = [ffi.NULL if desc is None else desc.native for desc in seed_descs.values()]
                status = getattr(op, create)(handle_pointer, pointer, *natives, *seed_scalars.values())
                check(status, _create_call(create, handle, status))
        finally:
            handle._end_call()
            for desc in temporaries:  # the op descriptor copied what it needs
                desc.close()
        destroy = f"infiniopDestroy{descriptor_name}Descriptor"
        self._own(pointer[0], getattr(op, destroy), destroy)
        # name -> TensorSpec, or None for an absent tensor; in the run function's argument order.
        ex_run = create_ex is not None and self._has_ex_run
        run_count = len(descs) if (ex_run or self._seed_names is not None) else self._seed_count
        self.layouts = {name: None if desc is None else TensorSpec(desc.shape, desc.dtype, desc.strides)
                        for name, desc in list(descs.items())[:run_count]}
        size = ffi.new("size_t *")
        query = f"infiniopGet{descriptor_name}WorkspaceSize"
        check(getattr(op, query)(pointer[0], size), query)
        self.workspace_size = int(size[0])
        run_name = f"infiniop{self._c_name}Ex" if ex_run else f"infiniop{self._c_name}"
        self._run_native = getattr(op, run_name)
        self._run_name, self._seed_order = run_name, None
        if not ex_run and self._seed_names is not None:
            self._seed_order = list(descs)
            self._run_native = self._seed_run_of(self._run_native, self._seed_order, self._seed_names)
        # Idle workspaces as (owner, address) pairs; list.pop/append are atomic, so concurrent calls never share one.
        # On a device, one list per stream (address -> list; _spares_on).
        self._spare_workspaces = []
        self._stream_workspaces = {}
        self._plain_key, self._written = self._plain_key_of(handle), [name in self._outputs for name in self.layouts]
        self._torch_key = None  # _plain_key for torch tensors, made on the first call with one

    def _plain_key_of(self, handle):
        """What _run_plain compares a call's arrays with: per run argument, (np.ndarray, numpy dtype, shape) of
        its created layout, or None where absent. None altogether (every call is checked) unless each layout is
        C-contiguous, has a numpy dtype and lives on the CPU: then any C-contiguous numpy array of that dtype and
        shape has that layout."""
        if handle.device != "cpu":
            return None
        key = []
        for layout in self.layouts.values():
            if layout is None:
                key.append(None)
                continue
            numpy_dtype = dtypes.numpy_dtype_of(layout.dtype)
            contiguous = significant_strides(layout.shape, contiguous_strides(layout.shape))
            if numpy_dtype is None or significant_strides(layout.shape, layout.strides) != contiguous:
                return None
            key.append((np.ndarray, numpy_dtype, layout.shape))
        return key

    def _seed_tensor_names(self, names):
        """The names of the seed create's and run's tensors, in their order, of all the tensors' ``names``."""
        return list(self._seed_names) if self._seed_names is not None else list(names)[:self._seed_count]

    def _run_native_by_address(self):
        """_run_native taking the tensors' data and the stream as integer addresses (_ffi.by_address)."""
        run = by_address(getattr(libraries().op, self._run_name))
        return run if self._seed_order is None else self._seed_run_of(run, self._seed_order, self._seed_names)

    @staticmethod
    def _seed_run_of(seed_run, names, seed_names):
        """The seed run called with every tensor in __init__'s order, as the Ex run is: it passes on the seed's."""
        indices = [names.index(name) for name in seed_names]

        def run(descriptor, workspace, workspace_size, *arguments):  # the tensors' pointers, then the stream
            return seed_run(descriptor, workspace, workspace_size, *[arguments[i] for i in indices], arguments[-1])

        return run

    def _require_seed_call(self, descs, options, seed_options):
        """Without the Ex entry points only what the seed create expresses can run."""
        seed_names = self._seed_tensor_names(descs)
        missing = [name for name in seed_names if descs[name] is None and name not in self._seed_optional]
        extra = [name for name in descs if name not in seed_names and descs[name] is not None]
        changed = [name for name, value in options.items()
                   if name not in self._seed_scalars and value != seed_options.get(name)]
        if missing or extra or changed:
            asked = ", ".join([f"{n}=None" for n in missing] + extra + [f"{n}={options[n]!r}" for n in changed])
            raise NotImplementedStatusError(
                f"{asked}: needs infiniopCreate{self._c_name}DescriptorEx, which the loaded library "
                f"({libraries().op_path}) does not have (an InfiniCore install offers only the seed functions)"
            )

    def _descriptor_for(self, name, tensor, temporaries):
        if isinstance(tensor, TensorDesc):
            if tensor.closed:
                raise ClosedError(f"{name}: TensorDesc is closed")
            return tensor
        if is_array(tensor):
            ref = as_tensor(tensor, name)
            self._require_handle_device(name, ref)
            desc = TensorDesc(ref.shape, ref.dtype, ref.strides, name=name)
        elif isinstance(tensor, tuple) and len(tensor) in (2, 3):
            desc = TensorDesc(*tensor, name=name)
        else:
            raise TypeError(
                f"{name}: expected a TensorDesc, an array or a (shape, dtype[, strides]) tuple, "
                f"got {type(tensor).__name__}"
            )
        temporaries.append(desc)
        return desc

    def _require_handle_device(self, name, ref):
        if (ref.device, ref.device_id) != (self._handle.device, self._handle.device_id):
            raise ValueError(
                f"{name}: the array is on {ref.device}:{ref.device_id}, "
                f"but the handle is on {self._handle.device}:{self._handle.device_id}"
            )

    def _require_created_layout(self, name, ref):
        layout = self.layouts[name]
        if ref.dtype != layout.dtype:
            raise BadTensorDtypeError(f"{name}: dtype {dtypes.name(ref.dtype)}, but the operator was created for "
                                      f"{dtypes.name(layout.dtype)}")
        if ref.shape != layout.shape:
            raise BadTensorShapeError(f"{name}: shape {ref.shape}, but the operator was created for {layout.shape}")
        if ref.strides != layout.strides and (significant_strides(ref.shape, ref.strides)
                                              != significant_strides(layout.shape, layout.strides)):
            raise BadTensorStridesError(
                f"{name}: strides {ref.strides}, but the operator was created for {layout.strides}"
            )
        self._require_handle_device(name, ref)

    def _workspace_from(self, workspace):
        """(TensorRef, nbytes) of a caller's workspace: contiguous, writable, on the handle's device."""
        ref = as_tensor(workspace, "workspace", writable=True)
        self._require_handle_device("workspace", ref)
        if significant_strides(ref.shape, ref.strides) != significant_strides(ref.shape, contiguous_strides(ref.shape)):
            raise BadTensorStridesError("workspace: must be contiguous")
        nbytes = math.prod(ref.shape) * ref.itemsize
        if nbytes < self.workspace_size:
            raise InsufficientWorkspaceError(
                f"workspace: {nbytes} bytes, but the operator needs workspace_size = {self.workspace_size}"
            )
        return ref, nbytes

    def _spares_on(self, stream_pointer):
        """The idle workspaces of calls on this stream. A workspace goes back to its stream's list when the launch
        returns, while its kernels may still run, so only a later call in that stream's order may take it again.
        One list on the CPU, whose calls are done when they return."""
        if self._handle.device == "cpu":
            return self._spare_workspaces
        key = int(ffi.cast("uintptr_t", stream_pointer))
        spares = self._stream_workspaces.get(key)
        if spares is None:
            if len(self._stream_workspaces) >= _MAX_STREAMS:
                # Forget the longest-known stream's workspaces (a program that makes a stream per call would
                # otherwise grow this without end); freeing them (cudaFree) waits for the device.
                try:
                    del self._stream_workspaces[next(iter(self._stream_workspaces))]
                except (KeyError, RuntimeError, StopIteration):  # another thread got there first
                    pass
            spares = self._stream_workspaces.setdefault(key, [])
        return spares

    def _take_workspace(self, spares):
        """An idle (owner, address) workspace from ``spares``, or a new one while other calls use those."""
        try:
            return spares.pop()
        except IndexError:
            pass
        if self._handle.device == "cpu":
            owner = np.empty(self.workspace_size, dtype=np.uint8)
            return owner, ffi.from_buffer(owner)
        owner = DeviceBuffer(self._handle.device, self._handle.device_id, self.workspace_size)
        return owner, ffi.cast("void *", owner.address)

    def _launch(self, refs, workspace, stream):
        """Run on TensorRefs given in C order (None where the operator was created without that tensor)."""
        self._launch_function(self._run_native, f"infiniop{self._c_name}", list(zip(self.layouts, refs)),
                              self._outputs, self._in_place, workspace, stream)

    def _launch_function(self, native, native_name, arguments, outputs, in_place, workspace, stream, scalars=()):
        """Run ``native`` (a run function of this descriptor) on ``arguments``, (name, TensorRef or None) in its C
        order, then ``scalars``: each tensor the operator was created with must have its created layout (others,
        such as the two-phase sums, are checked by the caller); ``outputs`` must not overlap another argument but
        for the ``in_place`` pair."""
        self._open_pointer()  # a closed operator's error first
        for name, ref in arguments:
            if name not in self.layouts:
                continue
            if (ref is None) != (self.layouts[name] is None):
                state = "without" if self.layouts[name] is None else "with"
                raise ValueError(f"{name}: the operator was created {state} it, so pass "
                                 f"{'None' if state == 'without' else 'an array'}")
            if ref is not None:
                self._require_created_layout(name, ref)
        for name, ref in arguments:
            if ref is not None and ref.data % ref.itemsize:
                raise BadParamError(f"{name}: its data address {ref.data:#x} is not a multiple of its "
                                    f"{ref.itemsize}-byte elements; the kernels take aligned elements only "
                                    f"(copy it: np.array(..., copy=True) or tensor.clone())")
        stream_pointer = _stream_pointer(stream)
        caller_workspace = None if workspace is None else self._workspace_from(workspace)
        present = {name: ref for name, ref in arguments if ref is not None}
        require_no_aliasing(present, outputs, in_place,
                            caller_workspace and (caller_workspace[0].data, self.workspace_size))
        own_workspace = None  # (owner, address) taken from the spares
        if caller_workspace is not None:
            address, nbytes = caller_workspace[0].data, caller_workspace[1]
        elif self.workspace_size == 0:
            address, nbytes = 0, 0
        else:
            spares = self._spares_on(stream_pointer)
            own_workspace = self._take_workspace(spares)
            address = own_workspace[1]
            nbytes = self.workspace_size
        data = [ffi.NULL if ref is None else ffi.cast("void *", ref.data) for _, ref in arguments]
        try:
            pointer = self._begin_call()
            try:
                # cffi releases the GIL for the duration of the native call.
                status = native(pointer, ffi.cast("void *", address), nbytes, *data, *scalars, stream_pointer)
            finally:
                self._end_call()
        finally:
            if own_workspace is not None:
                spares.append(own_workspace)
        check(status, native_name)

    def _run_plain(self, arrays, workspace):
        """Run without converting or checking again, where every array is a plain array of its created layout (see
        _plain_pointers) and the workspace, if given, a C-contiguous numpy array large enough. Returns whether it
        ran: any doubt goes back to the checked path, which names what is wrong, as does a BAD_PARAM status
        (tensors sharing memory; the native op checks the footprints before it writes anything, as _aliasing
        does). Costs a few microseconds where the checked path costs tens."""
        try:
            pointers = self._plain_pointers(arrays)
            if pointers is None:
                return False
            if workspace is not None and (type(workspace) is not np.ndarray or workspace.nbytes < self.workspace_size):
                return False
            caller_workspace = None if workspace is None else ffi.from_buffer(workspace, require_writable=True)
        except (AttributeError, BufferError, RuntimeError, TypeError, ValueError):
            return False
        native = self._begin_call()
        try:
            if caller_workspace is not None:
                status = self._run_native(native, caller_workspace, workspace.nbytes, *pointers, ffi.NULL)
            elif self.workspace_size == 0:
                status = self._run_native(native, ffi.NULL, 0, *pointers, ffi.NULL)
            else:
                own_workspace = self._take_workspace(self._spare_workspaces)
                try:
                    status = self._run_native(native, own_workspace[1], self.workspace_size, *pointers, ffi.NULL)
                finally:
                    self._spare_workspaces.append(own_workspace)
        finally:
            self._end_call()
        if status == _BAD_PARAM:
            return False
        check(status, f"infiniop{self._c_name}")
        return True

    def _plain_pointers(self, arrays):
        """The data pointers of arrays that all have their created layouts as C-contiguous numpy arrays (through
        ffi.from_buffer, which refuses any other buffer, and a read-only output) or all as contiguous torch CPU
        tensors (torch.Tensor or nn.Parameter); None for any other call."""
        layouts = [None if array is None else (type(array), array.dtype, array.shape) for array in arrays]
        null = ffi.NULL
        if layouts == self._plain_key:
            from_buffer = ffi.from_buffer
            return [null if array is None else from_buffer(array, require_writable=written)
                    for array, written in zip(arrays, self._written)]
        torch = sys.modules.get("torch")  # a torch tensor's module is loaded already
        if torch is None:
            return None
        if self._torch_key is None:
            self._torch_key = [None if key is None else (getattr(torch, key[1].name), key[2])
                               for key in self._plain_key]
        pointers = []
        for array, key, written in zip(arrays, self._torch_key, self._written):
            if key is None:
                if array is not None:
                    return None
                pointers.append(null)
                continue
            pointer = torch_cpu_pointer(array, written) if array.dtype is key[0] and array.shape == key[1] else None
            if pointer is None:
                return None
            pointers.append(pointer)
        return pointers

    def _call(self, arguments, workspace, stream):
        """Run on the tensors in the order __init__ named them (None where absent)."""
        if (self._plain_key is not None and stream is None
                and self._run_plain(arguments[:len(self.layouts)], workspace)):
            return
        refs = [None if array is None else as_tensor(array, name, writable=name in self._outputs)
                for name, array in zip(self.layouts, arguments)]
        self._launch(refs, workspace, stream)

    @property
    def handle(self):
        return self._handle

    def __repr__(self):
        state = ", closed" if self.closed else ""
        shapes = ", ".join(f"{name}={layout.shape if layout else None}" for name, layout in self.layouts.items())
        return f"{type(self).__name__}({shapes}{state})"

