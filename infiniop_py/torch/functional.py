"""Drop-ins for torch.nn.functional's rms_norm, layer_norm and batch_norm, same signatures and defaults: the forward
is PyTorch's own kernel (RMSNorm's and BatchNorm's on the CPU: this library's), the backward this library's:
through C++ autograd nodes in eager mode (autograd_nodes.py; plain autograd Functions where those cannot be built),
through the custom ops torch.ops.infiniop where torch.compile traces (ops.py). For tensor subclasses (DTensor,
FakeTensor, ...) and nested tensors, under torch.func's transforms (grad, vmap, jacrev, functional_call with grad,
...) and dispatch modes (make_fx), while torch.jit traces or torch.export exports and in forward-mode AD they are
PyTorch's own functions (_torch_serves); torch.fx's symbolic tracing records the modules as leaves
(_traced_as_leaf).

Under autocast they do what torch.nn.functional's do: where torch's autocast has a float-32 policy for the op on the
input's device (CUDA's layer_norm; CUDA's rms_norm from torch 2.12), F16/BF16 input and parameters are cast to F32
first, the norm runs in F32 and its output is F32; the casts are recorded by autograd, so each gradient comes back
in its tensor's dtype. Elsewhere (the CPU, BatchNorm) autocast leaves the norms' operands as they are.
"""

import math
import numbers
from typing import List, Optional

import torch
import torch.autograd.forward_ad as _forward_ad

from . import autograd_nodes, checks, ops

Tensor = torch.Tensor


def _forward(name, *args):
    """torch.ops.infiniop.<name> where torch.compile traces (it needs the custom op); else the same forward: in C++
    whole for ordinary operands, its backward a C++ autograd node where autograd records (autograd_nodes.forward);
    else in Python with that node (autograd_nodes.apply), or as a plain autograd Function (ops.EAGER) where the
    nodes cannot be built or do not take the operands, or, where autograd would record nothing (grad mode off, or no
    differentiable operand requiring grad), that forward alone (ops.FORWARDS)."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.infiniop, name)(*args)
    outputs = autograd_nodes.forward(name, args)
    if outputs is not None:
        return outputs
    if torch.is_grad_enabled() and (args[0].requires_grad or any(
            args[i] is not None and args[i].requires_grad for i in _PARAMETERS[name])):
        outputs = autograd_nodes.apply(name, args)
        return ops.EAGER[name].apply(*args) if outputs is None else outputs
    return ops.FORWARDS[name](*args)


# Where each op's differentiable parameters are among its arguments (the input is the first).
_PARAMETERS = {"rms_norm": (2,), "layer_norm": (2, 3), "batch_norm": (1, 2)}


# CPU inputs below these sizes run torch's own norm, forward and backward (its autograd, in C++ end to end): there our
# backward's kernel gain is smaller than what our path adds to a step. Since the eager forward runs in C++ too
# (autograd_nodes), that is little. Module forward + backward, stock's time / ours (scripts/torch_crossings.py,
# docs/performance.md), 2026-12-01, the project's 2-core Xeon, one thread, malloc keeping freed memory, two runs, at
# 4096, 8192, 16384, 32768, 65536 and 131072 elements: LayerNorm(1024) F32 0.98 0.89 0.94 0.94 1.01 1.01 and 0.90 0.96
# 1.02 1.12 1.09 1.03, BF16 0.97 1.04 1.22 1.34 1.74 1.80 and 1.03 1.19 1.34 1.54 1.92 2.24, F16 0.95 1.04 1.13 1.28
# 1.48 1.64 and 0.91 1.02 1.20 1.40 1.31 1.58; BatchNorm1d(256) F32 1.09 1.14 1.21 1.39 1.41 1.44 and 1.10 1.17 1.26
# 1.31 1.41 1.39 (1.04-1.10 from 1024 on). Each size is the larger run's crossing; two threads do not cross later but
# for one dip (F16). LayerNorm's fell (F32 196608 -> 65536, 16-bit 16384 -> 8192) and BatchNorm F32's (8192 -> 4096)
# when the library's forwards came to serve small inputs (ops._LIBRARY_LAYER_NORM_MIN_ELEMENTS). 16-bit BatchNorm with
# 16-bit parameters runs PyTorch's forward either way: its sizes are the earlier runs' (BF16 0.95 0.97 1.06 1.13 1.27
# 1.32, F16 0.91 0.94 0.99 1.07 1.15 1.23 at 4096..131072). RMSNorm has none: torch's CPU backward is a composite's
# autograd, and ours is the faster at every size. F64 (reference use) and other devices always run ours.
_TORCH_BELOW = {
    ("layer_norm", torch.float32): 65536, ("layer_norm", torch.bfloat16): 8192,
    ("layer_norm", torch.float16): 8192,
    ("batch_norm", torch.float32): 4096, ("batch_norm", torch.bfloat16): 16384,
    ("batch_norm", torch.float16): 32768,
}


def _torch_end_to_end(op, input):
    """Whether torch's own ``op`` (forward and backward) is the faster for this input (_TORCH_BELOW). Eager only:
    torch.compile traces our custom ops whatever the size."""
    if type(input) is not torch.Tensor or not input.is_cpu or torch.compiler.is_compiling():
        return False
    minimum = _TORCH_BELOW.get((op, input.dtype))
    return minimum is not None and input.numel() < minimum


# The types of operand whose memory the kernels read as torch does (None: an absent parameter).
_ORDINARY = {torch.Tensor, torch.nn.Parameter, type(None)}


def _torch_serves(input, *parameters):
    """Whether torch.nn.functional's own function must take the call, not ours:
    - for a nested input or an operand of a tensor subclass (but nn.Parameter): a subclass may override torch's
      functions (__torch_function__, to which torch's function hands the call) or wrap other tensors and own no
      memory (__torch_dispatch__: DTensor, FakeTensor, the jagged NestedTensor); our kernels bypassed the override
      or raised (a null data pointer, 2026-12-07);
    - under a torch.func transform (the check torch.autograd.Function.apply makes itself): the kernels read plain
      memory, which functorch's wrapped and batched tensors do not have;
    - while torch.jit traces (torch.jit.trace, the TorchScript ONNX export): it records torch's ops, not the kernels'
      writes, and the traced module returned its outputs unwritten (noise, with a TracerWarning);
    - inside a forward-mode AD level (torch.autograd.forward_ad): our nodes have no forward derivative, and outputs
      came without their tangent (None), silently;
    - under a TorchDispatchMode (make_fx's tracing, FakeTensorMode, FlopCounterMode, ...): a mode sees the ops torch
      runs, not the kernels' writes; the graph make_fx traced returned noise (2026-12-07);
    - while torch.export traces: an exported program is for other runtimes (AOTInductor, ExecuTorch, a process
      without this package), so it records torch's norms, as its non-strict tracing (a dispatch mode) did already;
      strict export recorded torch.ops.infiniop's, which only this package runs (2026-12-08)."""
    if input is None or type(input) not in _ORDINARY or input.is_nested:  # None, not a tensor: torch's error
        return True
    for parameter in parameters:
        if type(parameter) not in _ORDINARY:
            return True
    # _get_tracing_state: torch.jit.is_tracing's own test at half its cost (torch.compile folds both to "no").
    return (torch._C._are_functorch_transforms_active() or torch._C._get_tracing_state() is not None
            or _forward_ad._current_level >= 0
            # Where torch.compile traces (it folds both calls; it cannot trace the stack's length, and no mode is
            # active there), only while torch.export does.
            or (torch.compiler.is_exporting() if torch.compiler.is_compiling()
                else torch._C._len_torch_dispatch_stack() > 0))


# The kernels take a finite eps >= 0 and a momentum in a C float's range. For others torch's function serves, with
# its values (NaN and infinities too) or its errors: BatchNorm's eps <= 0 (refused in training, a negative one in
# eval, by torch 2.13), a momentum of None. Ours raised BadParamError (an infinite momentum even in eval, where it
# is not used), and computed BatchNorm with eps 0 in training, which torch refuses (2026-12-08).
_INF = math.inf
_FLOAT_MAX = 3.4028234663852886e38

_Proxy = torch.fx.Proxy  # what torch.fx's symbolic tracing passes for a tensor


def _traced_as_leaf(module, input):
    """A module's call where torch.fx traces symbolically (``input`` a Proxy): one call_module node, as its tracer
    records torch.nn's own norms (it does not trace into torch.nn's modules). So the traced module runs ours, kernels
    and running statistics as in eager mode. Traced through, BatchNorm's forward raised on its input checks, and the
    row norms became calls of torch's functions (2026-12-07)."""
    tracer = input.tracer
    return tracer.create_proxy("call_module", tracer.path_of_module(module), (input,), {})


# The (op, device type) pairs where torch's autocast runs the op in F32 (read_autocast_policies).
_F32_UNDER_AUTOCAST = set()
_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}  # the devices this library serves
_HALF_DTYPES = (torch.float16, torch.bfloat16)


def read_autocast_policies():
    """Read from torch's dispatcher which of our ops its autocast takes over, per device: for layer_norm and
    rms_norm, whose autocast kernels are the float-32 policy (torch's autocast_mode.h lists them under fp32). Done
    at import; again where kernels are registered later (tests emulate CUDA's policy on the CPU so)."""
    _F32_UNDER_AUTOCAST.clear()
    for op in ("layer_norm", "rms_norm"):
        for device_type, key in _AUTOCAST_KEYS.items():
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", key):
                _F32_UNDER_AUTOCAST.add((op, device_type))


read_autocast_policies()


def _f32_under_autocast(op, input):
    """Whether torch.nn.functional's ``op`` would run in F32 here: autocast on for input's device, with an F32
    policy for the op there."""
    # input.device.type costs 0.4 us a call, ten times is_cuda's
    device_type = "cuda" if input.is_cuda else "cpu" if input.is_cpu else input.device.type
    return (op, device_type) in _F32_UNDER_AUTOCAST and torch.is_autocast_enabled(device_type)


def _widened(*tensors):
    """The tensors as autocast's F32 policy casts them: F16 and BF16 ones to F32, the others (F64 too) as they are."""
    return tuple(t.float() if t is not None and t.dtype in _HALF_DTYPES else t for t in tensors)


def _shape_list(normalized_shape):
    # A module's (size,) first, at half the cost of the general case; then the modules' other tuples: a concrete
    # isinstance is half the cost of the ABC's.
    if type(normalized_shape) is tuple and len(normalized_shape) == 1 and type(normalized_shape[0]) is int:
        return [normalized_shape[0]]
    if not isinstance(normalized_shape, (tuple, list)) and isinstance(normalized_shape, numbers.Integral):
        return [int(normalized_shape)]
    return [int(size) for size in normalized_shape]


def rms_norm(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor] = None,
             eps: Optional[float] = None) -> Tensor:
    """RMSNorm over the last len(normalized_shape) dims, as torch.nn.functional.rms_norm (eps None: the epsilon of
    the dtype it computes in, as torch's: F32's for F16/BF16 data)."""
    if _torch_serves(input, weight) or not (eps is None or 0.0 <= eps < _INF):  # see _INF
        return torch.nn.functional.rms_norm(input, normalized_shape, weight, eps)
    if _f32_under_autocast("rms_norm", input):
        input, weight = _widened(input, weight)
    return _rms_norm_as_called(input, normalized_shape, weight, eps)


def _rms_norm_as_called(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor] = None,
                       eps: Optional[float] = None) -> Tensor:
    """rms_norm of the operands as they are, whatever autocast's policy: for modules whose own forward autocast
    does not touch (foreign_rms_norm: transformers' RMSNorm classes compute with elementwise ops)."""
    return _forward("rms_norm", input, _shape_list(normalized_shape), weight, eps)[0]


def layer_norm(input: Tensor, normalized_shape: List[int], weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last len(normalized_shape) dims, as torch.nn.functional.layer_norm."""
    # The size test first: where it holds torch's function serves whatever the operands (and at the least cost).
    if _torch_end_to_end("layer_norm", input) or _torch_serves(input, weight, bias) or not 0.0 <= eps < _INF:
        return torch.nn.functional.layer_norm(input, normalized_shape, weight, bias, eps)
    if _f32_under_autocast("layer_norm", input):
        input, weight, bias = _widened(input, weight, bias)
    return _forward("layer_norm", input, _shape_list(normalized_shape), weight, bias, eps)[0]


def batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """BatchNorm over dim 1 of an (N, C, *spatial) input, as torch.nn.functional.batch_norm: in training the batch
    statistics normalize, and running_mean / running_var (when given) are updated in place with ``momentum``
    (running_var with the unbiased batch variance); otherwise the running statistics normalize."""
    if (_torch_serves(input, running_mean, running_var, weight, bias) or not 0.0 < eps < _INF
            or momentum is None or not -_FLOAT_MAX <= momentum <= _FLOAT_MAX):
        return torch.nn.functional.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    # An empty input: torch's value, the input times weight[0] plus bias[0], whatever the other sizes.
    if input.numel() == 0:
        return torch.nn.functional.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if _torch_end_to_end("batch_norm", input):
        # Our checks first: torch's CPU kernel updates running_mean before it finds running_var on another device.
        checks.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
        return torch.nn.functional.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    outputs = _forward("batch_norm", input, weight, bias, running_mean, running_var, training, momentum, eps)
    # The eager Function updates the running statistics itself; the custom op is functional (its outputs end with
    # the new ones), so its caller copies them in.
    if torch.compiler.is_compiling() and training and running_mean is not None and running_var is not None:
        with torch.no_grad():
            running_mean.copy_(outputs[3])
            running_var.copy_(outputs[4])
    return outputs[0]

