"""The custom ops under torch.ops.infiniop: three backward kernels of this library, and three forwards (PyTorch's
own kernels but RMSNorm's and BatchNorm's on the CPU, which are this library's where they take the operands; saving
the statistics in F32) whose autograd formula calls them.

Each op has a fake implementation, so torch.compile(fullgraph=True) traces through it. The backward ops mirror
ATen's schemas (``_fused_rms_norm_backward``, ``native_layer_norm_backward``, ``native_batch_norm_backward``),
except that a gradient not asked for in ``output_mask`` comes back as an empty tensor (custom ops cannot return
None). CPU tensors run the CPU backend; CUDA tensors the CUDA backend, on torch's current stream, through the
functional ops' signatures: a layout's first call is checked in full, later ones run from its cached operator
(_known_layouts).

Outside torch.compile the same forwards and formulas run as plain autograd Functions (EAGER, at the end), which
cost less per call than the custom ops' own autograd layer.
"""

from typing import Optional, Sequence

import importlib

import torch

from . import checks

# The functional ops' signatures (the package's names are the functions, which shadow their modules).
_RMS_NORM_FORWARD = importlib.import_module("infiniop_py.rms_norm")._SIGNATURE
_LAYER_NORM_FORWARD = importlib.import_module("infiniop_py.layer_norm")._SIGNATURE
_BATCH_NORM_FORWARD = importlib.import_module("infiniop_py.batch_norm")._SIGNATURE
_RMS_NORM_BACKWARD = importlib.import_module("infiniop_py.rms_norm_backward")._SIGNATURE
_LAYER_NORM_BACKWARD = importlib.import_module("infiniop_py.layer_norm_backward")._FROM_INPUT_SIGNATURE
_BATCH_NORM_BACKWARD = importlib.import_module("infiniop_py.batch_norm_backward")._SIGNATURE

Tensor = torch.Tensor


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _statistics_dtype(dtype):
    """What PyTorch's forwards save mean / rstd / invstd in: F64 for F64 data, else F32."""
    return torch.float64 if dtype is torch.float64 else torch.float32


def _statistics(tensor, input, shape=None):
    """Saved statistics as the kernels take them: F32 (F64 for F64 data), of ``shape`` where given. The forwards
    below save them so, but for BatchNorm with 16-bit parameters, whose 16-bit statistics are widened here."""
    if tensor is None:
        return None
    # Each step is skipped where it has nothing to do: a tensor call (.to, .reshape) costs a microsecond or two
    # even then, several per backward, and the forwards' statistics are input.shape[:-k] + (1,) * k, which the
    # usual k = 1 squeezes to ``shape`` at half reshape's cost.
    dtype = _statistics_dtype(input.dtype)
    if tensor.dtype is not dtype:
        tensor = tensor.to(dtype)
    if shape is None or tensor.shape == shape:
        return tensor
    if tensor.dim() == len(shape) + 1:
        squeezed = tensor.squeeze(-1)
        if squeezed.shape == shape:
            return squeezed
    return tensor.reshape(shape)


def _absent(like):
    """The stand-in for an output not asked for (custom ops return tensors, never None)."""
    return like.new_empty(0)


def _leading(input, normalized_shape):
    return input.shape[:input.dim() - len(normalized_shape)]


def _new_statistic(leading, dtype, device):
    """An empty per-row statistic of the leading shape on ``device`` (torch.empty(*sizes) takes 0.8 us,
    torch.empty(torch.Size) 1.6; no sizes at all: a 0-dim one)."""
    return (torch.empty(*leading, dtype=dtype, device=device) if leading
            else torch.empty((), dtype=dtype, device=device))


def _kept_dims(statistic, normalized_dims):
    """A per-row statistic shaped as PyTorch's forwards save it: the leading dims, then a 1 per normalized dim
    (unsqueeze takes 0.8 us, view(torch.Size) 1.9)."""
    if normalized_dims == 1:
        return statistic.unsqueeze(-1)
    return statistic.view(statistic.shape + (1,) * normalized_dims)


def _same_layout(tensor, like):
    """``tensor`` with ``like``'s strides (both dense), copied only where they differ."""
    if tensor.stride() == like.stride():
        return tensor
    return torch.empty_like(like).copy_(tensor)


def _batch_packed(input):
    """Channels-first or channels-last packed (C innermost, then the spatial dims, then N): what the BatchNorm
    kernels take without copies. Ranks 4 and 5 ask torch's own channels-last check (0.15 us, where a movedim view
    costs 1.2, twice a backward); its rule skips size-1 dims as is_contiguous does."""
    if input.is_contiguous():
        return True
    memory_format = _CHANNELS_LAST_FORMATS.get(input.dim())
    if memory_format is not None:
        return input.is_contiguous(memory_format=memory_format)
    return input.movedim(1, -1).is_contiguous()


_CHANNELS_LAST_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


# ---------------------------------------------------------------------------------------------- backward ops

def _rms_norm_backward_body(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], rstd: Tensor,
                            weight: Optional[Tensor], output_mask: Sequence[bool]) -> tuple[Tensor, Tensor]:
    """(grad_input, grad_weight) of RMSNorm from the forward's rstd (any shape of input.shape[:-k] elements)."""
    leading = _leading(input, normalized_shape)
    want_weight = bool(output_mask[1]) and weight is not None
    if weight is None:  # no affine: the kernel takes a weight, so give it ones
        weight = torch.ones(normalized_shape, dtype=input.dtype, device=input.device)
    data, grad_data, kernel_weight = _rms_norm_kernel_operands(input, grad_out, weight)
    grad_input = torch.empty_like(data, memory_format=torch.contiguous_format)
    grad_weight = torch.empty_like(kernel_weight, memory_format=torch.contiguous_format) if want_weight else None
    _RMS_NORM_BACKWARD.run(
        (grad_data.contiguous(), data.contiguous(), kernel_weight, _statistics(rstd, data, leading)),
        (grad_input, grad_weight), (0.0,), (True, want_weight))
    # Widened operands: each gradient rounded once to its tensor's dtype, as torch's own backward rounds it.
    if grad_input.dtype is not input.dtype:
        grad_input = grad_input.to(input.dtype)
    if want_weight and grad_weight.dtype is not weight.dtype:
        grad_weight = grad_weight.to(weight.dtype)
    return (grad_input if output_mask[0] else _absent(input),
            grad_weight if want_weight else _absent(input))


def _rms_norm_kernel_operands(input, grad_out, weight):
    """(input, grad_out, weight) in dtypes the kernel takes together: a weight of the data's dtype, or F32 with
    F16/BF16 data. torch runs RMSNorm with any two float dtypes (BF16 weights on F32 data: a model cast to BF16
    given F32 inputs), so a narrower weight is widened to F32 (F64 for F64 data), and F64 weights widen the data
    to F64 instead; both exactly."""
    if weight.dtype is input.dtype or (weight.dtype is torch.float32 and input.dtype in _HALF_DTYPES):
        return input, grad_out, weight
    if weight.dtype is torch.float64:
        return input.double(), grad_out.double(), weight
    return input, grad_out, weight.to(torch.float64 if input.dtype is torch.float64 else torch.float32)


rms_norm_backward = torch.library.custom_op("infiniop::rms_norm_backward", _rms_norm_backward_body,
                                             mutates_args=())


@rms_norm_backward.register_fake
def _(grad_out, input, normalized_shape, rstd, weight, output_mask):
    want_weight = output_mask[1] and weight is not None
    return (torch.empty_like(input, memory_format=torch.contiguous_format) if output_mask[0] else _absent(input),
            torch.empty_like(weight, memory_format=torch.contiguous_format) if want_weight else _absent(input))


def _layer_norm_backward_body(grad_out: Tensor, input: Tensor, normalized_shape: Sequence[int], mean: Tensor,
                              rstd: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                              output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_input, grad_weight, grad_bias) of LayerNorm from the forward's mean and rstd; ``bias`` only says the
    dtype of grad_bias."""
    leading = _leading(input, normalized_shape)
    grad_input = torch.empty_like(input, memory_format=torch.contiguous_format)
    grad_weight, grad_bias = _layer_norm_parameter_gradients(weight, bias, output_mask)
    _layer_norm_kernel(grad_out.contiguous(), input.contiguous(), _statistics(mean, input, leading),
                       _statistics(rstd, input, leading),
                       weight, (grad_input, grad_weight, grad_bias))
    return (grad_input if output_mask[0] else _absent(input),
            _absent(input) if grad_weight is None else grad_weight,
            _absent(input) if grad_bias is None else grad_bias)


layer_norm_backward = torch.library.custom_op("infiniop::layer_norm_backward", _layer_norm_backward_body,
                                               mutates_args=())


def _layer_norm_parameter_gradients(weight, bias, output_mask):
    """Fresh grad_weight and grad_bias (None where not wanted), in the parameters' dtype."""
    parameter = weight if weight is not None else bias  # both gradients take the first parameter's dtype
    return (_fresh_like(parameter) if output_mask[1] and weight is not None else None,
            _fresh_like(parameter) if output_mask[2] and bias is not None else None)


def _fresh_like(parameter):
    """An empty contiguous tensor of the parameter's dtype and shape (empty_like costs half of new_empty)."""
    return torch.empty_like(parameter, memory_format=torch.contiguous_format)


def _layer_norm_kernel(grad_out, input, mean, rstd, weight, out):
    _LAYER_NORM_BACKWARD.run((grad_out, weight, input, mean, rstd), out, (),
                             (True, out[1] is not None, out[2] is not None))


@layer_norm_backward.register_fake
def _(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    grad_weight, grad_bias = _layer_norm_parameter_gradients(weight, bias, output_mask)
    return (torch.empty_like(input, memory_format=torch.contiguous_format) if output_mask[0] else _absent(input),
            _absent(input) if grad_weight is None else grad_weight,
            _absent(input) if grad_bias is None else grad_bias)


def _batch_norm_backward_body(grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
                              running_mean: Optional[Tensor], running_var: Optional[Tensor],
                              save_mean: Optional[Tensor], save_invstd: Optional[Tensor], train: bool, eps: float,
                              output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_input, grad_weight, grad_bias) of BatchNorm. Training: from the forward's save_mean / save_invstd;
    eval: from running_mean / running_var and eps, which are constants there. grad_input has input's layout
    (channels-first or channels-last packed; any other layout is packed channels-first first)."""
    if not _batch_packed(input):
        input = input.contiguous()
    grad_input = _batch_grad_input(input)
    grad_weight, grad_bias = _batch_norm_parameter_gradients(input, weight, running_mean, output_mask)
    statistics = ((None, None, _statistics(save_mean, input), _statistics(save_invstd, input)) if train
                  else (running_mean, running_var, None, None))
    _BATCH_NORM_BACKWARD.run((input, _same_layout(grad_out, input), weight, *statistics),
                             (grad_input, grad_weight, grad_bias), (float(eps), bool(train)),
                             (True, grad_weight is not None, grad_bias is not None))
    return (grad_input if output_mask[0] else _absent(input),
            _absent(input) if grad_weight is None else grad_weight,
            _absent(input) if grad_bias is None else grad_bias)


batch_norm_backward = torch.library.custom_op("infiniop::batch_norm_backward", _batch_norm_backward_body,
                                               mutates_args=())


def _batch_grad_input(input):
    """A fresh grad_input in the layout the kernel takes for this input."""
    return torch.empty_like(input, memory_format=torch.preserve_format if _batch_packed(input) else torch.contiguous_format)


def _batch_norm_parameter_gradients(input, weight, running_mean, output_mask):
    """Fresh grad_weight and grad_bias of shape (C,) (None where not wanted), in the parameters' dtype."""
    parameter = weight if weight is not None else running_mean
    def fresh(wanted):
        if not wanted:
            return None
        if parameter is not None and parameter.dim() == 1:
            return _fresh_like(parameter)
        return input.new_empty((input.shape[1],), dtype=input.dtype if parameter is None else parameter.dtype)
    return fresh(output_mask[1] and weight is not None), fresh(output_mask[2])


@batch_norm_backward.register_fake
def _(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask):
    grad_weight, grad_bias = _batch_norm_parameter_gradients(input, weight, running_mean, output_mask)
    return (_batch_grad_input(input) if output_mask[0] else _absent(input),
            _absent(input) if grad_weight is None else grad_weight,
            _absent(input) if grad_bias is None else grad_bias)


# ----------------------------------------------------------------------------------------------- forward ops
# PyTorch's kernels (RMSNorm's on the CPU: this library's); each returns the output and what its backward needs,
# and is differentiable through the backward ops above. Gradients are computed only for the inputs that need them
# (ctx.needs_input_grad).

def _f32_parameters(input, *parameters):
    """For F16/BF16 data, the parameters in F32: PyTorch's kernels then take their mixed-precision path, which
    saves the statistics in F32 (with 16-bit parameters LayerNorm saves them in 16 bits on the CPU). The
    conversion is exact, and the output the same (tested). Parameters of any other dtypes pass as they are, so that
    PyTorch's kernel takes or refuses them as torch.nn.functional would (F64 weights on F16 data: refused)."""
    if input.dtype not in _HALF_DTYPES or any(p is not None and p.dtype is not input.dtype for p in parameters):
        return parameters
    return tuple(None if parameter is None else parameter.float() for parameter in parameters)


@torch.library.custom_op("infiniop::rms_norm", mutates_args=())
def rms_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor],
             eps: Optional[float]) -> tuple[Tensor, Tensor]:
    """(output, rstd): RMSNorm's forward, rstd (F32; F64 for F64 data) of shape input.shape[:-k] + (1,) * k. On the
    CPU this library's kernel where it takes the operands (3.7-6x faster than PyTorch's on (8, 512, 1024); see
    docs/performance.md), else PyTorch's fused kernel."""
    return _rms_norm_forward(input, normalized_shape, weight, eps)


def _rms_norm_forward(input, normalized_shape, weight, eps):
    checks.rms_norm(input, normalized_shape, weight, eps)
    if _library_rms_norm_serves(input, weight):
        return _library_rms_norm(input, normalized_shape, weight, eps)
    return _torch_rms_norm(input, normalized_shape, weight, eps)


def _library_rms_norm_serves(input, weight):
    """Whether this library's CPU forward takes these operands as they are: packed, not empty, a weight of the
    data's dtype (or F32 with 16-bit data). Anything else (no weight, other devices) runs PyTorch's."""
    return (input.is_cpu and weight is not None and input.dtype in _KERNEL_DTYPES
            and (weight.dtype is input.dtype or (weight.dtype is torch.float32 and input.dtype in _HALF_DTYPES))
            and input.numel() > 0 and input.is_contiguous() and weight.is_contiguous())


_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _library_rms_norm(input, normalized_shape, weight, eps):
    """(output, rstd) from this library's forward; eps None is the compute dtype's epsilon, as PyTorch's."""
    statistics_dtype = _statistics_dtype(input.dtype)
    if eps is None:
        eps = torch.finfo(statistics_dtype).eps
    leading = _leading(input, normalized_shape)
    output = torch.empty_like(input)
    rstd = _new_statistic(leading, statistics_dtype, input.device)
    _RMS_NORM_FORWARD.run((input, weight), (output, rstd), (float(eps),), (True, True))
    return output, _kept_dims(rstd, len(normalized_shape))


def _torch_rms_norm(input, normalized_shape, weight, eps):
    if weight is not None and weight.dtype != input.dtype and not input.is_cpu:
        return _rms_norm_composite(input, normalized_shape, weight, eps)
    # On the CPU the fused kernel takes mixed dtypes, with the composite's bits (tested) at its speed.
    return torch.ops.aten._fused_rms_norm(input, normalized_shape, weight, eps)


def _rms_norm_composite(input, normalized_shape, weight, eps):
    """What torch.nn.functional.rms_norm runs when the weight's dtype is not the input's (it warns that it cannot
    use the fused kernel, which on CUDA refuses them in torch 2.11): the input in F32 (F64 for F64), one
    rounding at the end (on an H200 with torch 2.11, bit for bit torch's)."""
    compute = torch.float64 if input.dtype == torch.float64 else torch.float32
    upcast = input.to(compute)
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    eps = torch.finfo(compute).eps if eps is None else eps
    rstd = torch.rsqrt(upcast.pow(2).mean(dims, keepdim=True) + eps)
    return (upcast * rstd * weight).to(input.dtype), rstd


@rms_norm.register_fake
def _(input, normalized_shape, weight, eps):
    checks.rms_norm(input, normalized_shape, weight, eps)
    return _torch_rms_norm(input, normalized_shape, weight, eps)  # ATen's fakes; ours gives the same shapes


def _rms_norm_setup(ctx, inputs, output):
    input, normalized_shape, weight, eps = inputs
    # An inference-mode input cannot be saved: a copy is (autograd_nodes.cpp, RMSNormNode).
    ctx.save_for_backward(input.clone() if input.is_inference() else input, output[1], weight)
    ctx.normalized_shape, ctx.eps = normalized_shape, eps


def _rms_norm_backward(ctx, grad_output, _grad_rstd):
    input, rstd, weight = ctx.saved_tensors
    wanted = ctx.needs_input_grad  # (input, normalized_shape, weight, eps)
    grad_input, grad_weight = (_rms_norm_backward_body if _eager(ctx) else rms_norm_backward)(
        grad_output, input, ctx.normalized_shape, rstd, weight, [wanted[0], wanted[2]])
    return grad_input if wanted[0] else None, None, grad_weight if wanted[2] else None, None


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


@torch.library.custom_op("infiniop::layer_norm", mutates_args=())
def layer_norm(input: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor], bias: Optional[Tensor],
               eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(output, mean, rstd): PyTorch's LayerNorm forward, mean and rstd (F32; F64 for F64 data) of shape
    input.shape[:-k] + (1,) * k."""
    return _layer_norm_forward(input, normalized_shape, weight, bias, eps)


def _layer_norm_forward(input, normalized_shape, weight, bias, eps):
    checks.layer_norm(input, normalized_shape, weight, bias, eps)
    if _library_layer_norm_serves(input, normalized_shape, weight, bias):
        return _library_layer_norm(input, normalized_shape, weight, bias, eps)
    if _cuda_mixed_layer_norm(input, weight, bias):  # PyTorch's CUDA kernel would refuse it: ours, packed
        weight, bias = (None if p is None else p.float().contiguous() for p in (weight, bias))
        input = input.contiguous()
        if _library_layer_norm_serves(input, normalized_shape, weight, bias):
            return _library_layer_norm(input, normalized_shape, weight, bias, eps)
    return _torch_layer_norm(input, normalized_shape, weight, bias, eps)


def _cuda_mixed_layer_norm(input, weight, bias):
    """Whether these are CUDA F16/BF16 data with F32 parameters (the other one F32 or of the data's dtype), which
    torch 2.11's CUDA LayerNorm refuses: ours runs them, from a packed copy of strided data and with both parameters
    widened to F32 (exact). Parameters of other dtypes go to PyTorch, which runs or refuses them."""
    if not input.is_cuda or input.dtype not in _HALF_DTYPES:
        return False
    dtypes = {p.dtype for p in (weight, bias) if p is not None}
    return torch.float32 in dtypes and dtypes <= {torch.float32, input.dtype}


def _torch_layer_norm(input, normalized_shape, weight, bias, eps):
    """PyTorch's forward, its statistics F32 (F64 for F64 data) as this library's forward saves them: the CPU kernel
    saves 16-bit ones unless a parameter is F32, so 16-bit parameters are widened first (exact), and without any the
    statistics are converted."""
    if input.is_cpu:  # CUDA's kernel saves F32 statistics either way, and torch 2.11's refuses
        weight, bias = _f32_parameters(input, weight, bias)  # parameters of another dtype than the data's
    output, mean, rstd = torch.native_layer_norm(input, normalized_shape, weight, bias, eps)
    statistics_dtype = _statistics_dtype(input.dtype)
    if mean.dtype is not statistics_dtype:
        mean, rstd = mean.to(statistics_dtype), rstd.to(statistics_dtype)
    return output, mean, rstd


def _library_layer_norm_serves(input, normalized_shape, weight, bias):
    """Whether this library's forward takes these operands as they are and is the one to run: packed data whose
    trailing dims are normalized_shape; parameters of that shape and of the data's dtype or F32 (16-bit data), the
    same for both; at least one of them where several dims are normalized (the library reads the normalized dims
    from their rank). On the CPU from _LIBRARY_LAYER_NORM_MIN_ELEMENTS on (below it PyTorch's is the faster). On
    CUDA only for 16-bit data with F32 parameters, which torch 2.11's CUDA kernel refuses (PyTorch's forward is the
    faster there otherwise: docs/performance.md, the forwards on an H200). Anything else goes to PyTorch's kernel,
    which runs it or raises its own error."""
    if input.is_cuda:
        if input.dtype not in _HALF_DTYPES or not any(p is not None and p.dtype is torch.float32
                                                      for p in (weight, bias)):
            return False
    else:
        minimum = _LIBRARY_LAYER_NORM_MIN_ELEMENTS.get(input.dtype)
        if not input.is_cpu or minimum is None or input.numel() < minimum:
            return False
    if input.numel() == 0 or not input.is_contiguous():
        return False
    normalized = tuple(normalized_shape)
    trailing = tuple(input.shape[input.dim() - len(normalized):]) if len(normalized) <= input.dim() else None
    if not normalized or trailing != normalized:
        return False
    parameters = [p for p in (weight, bias) if p is not None]
    if not parameters:
        return len(normalized) == 1
    first = parameters[0].dtype
    return (all(p.dtype is first and tuple(p.shape) == normalized and p.is_contiguous() for p in parameters)
            and (first is input.dtype or (first is torch.float32 and input.dtype in _HALF_DTYPES)))


# The data dtypes whose CPU forward is this library's, from these sizes on (F64, kept for references, runs
# PyTorch's). Below them PyTorch's forward is the faster. Measured with the eager forward in C++ (autograd_nodes),
# 2026-12-01, the project's 2-core Xeon, one thread, module forward under no_grad (forward + backward), ours /
# PyTorch's: F32 (8, 1024) 1.02 (1.00), (256, 32) 0.83 (0.91), (16, 1024) 0.91 (0.96), (64, 1024) 0.78 (0.98),
# (1, 4096) 1.03 (1.02); BF16 and F16, data-dtype parameters, 0.85-0.92 (0.93-0.99) from 64 elements on and
# 0.57-0.66 (0.77-0.88) at 65536; with F32 parameters 0.90-0.95 (0.97-1.00) at 8192. The Python forward (no
# compiler for the nodes, a tensor subclass, torch.compile) costs about 10 us more either way; it chooses as the C++
# forward does, so both paths give the same bits.
_LIBRARY_LAYER_NORM_MIN_ELEMENTS = {torch.float32: 16384, torch.bfloat16: 0, torch.float16: 0}


def _library_layer_norm(input, normalized_shape, weight, bias, eps):
    """(output, mean, rstd) from this library's forward, the statistics shaped as PyTorch's."""
    leading = _leading(input, normalized_shape)
    statistics_dtype = _statistics_dtype(input.dtype)
    output = torch.empty_like(input)
    mean = _new_statistic(leading, statistics_dtype, input.device)
    rstd = _new_statistic(leading, statistics_dtype, input.device)
    _LAYER_NORM_FORWARD.run((input, weight, bias), (output, mean, rstd), (float(eps),), (True, True, True))
    return output, _kept_dims(mean, len(normalized_shape)), _kept_dims(rstd, len(normalized_shape))


@layer_norm.register_fake
def _(input, normalized_shape, weight, bias, eps):
    checks.layer_norm(input, normalized_shape, weight, bias, eps)
    return _torch_layer_norm(input, normalized_shape, weight, bias, eps)  # ATen's fakes; ours: the same metadata


def _layer_norm_setup(ctx, inputs, output):
    input, normalized_shape, weight, bias, _ = inputs
    ctx.save_for_backward(input, output[1], output[2], weight, bias)
    ctx.normalized_shape = normalized_shape


def _layer_norm_backward(ctx, grad_output, _grad_mean, _grad_rstd):
    input, mean, rstd, weight, bias = ctx.saved_tensors
    wanted = ctx.needs_input_grad  # (input, normalized_shape, weight, bias, eps)
    grad_input, grad_weight, grad_bias = (_layer_norm_backward_body if _eager(ctx) else layer_norm_backward)(
        grad_output, input, ctx.normalized_shape, mean, rstd, weight, bias, [wanted[0], wanted[2], wanted[3]])
    return (grad_input if wanted[0] else None, None, grad_weight if wanted[2] else None,
            grad_bias if wanted[3] else None, None)


layer_norm.register_autograd(_layer_norm_backward, setup_context=_layer_norm_setup)


@torch.library.custom_op("infiniop::batch_norm", mutates_args=())
def batch_norm(input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], running_mean: Optional[Tensor],
               running_var: Optional[Tensor], training: bool, momentum: float,
               eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(output, save_mean, save_invstd, new_running_mean, new_running_var): on the CPU this library's forward where
    it takes the operands (see _library_batch_norm_serves and docs/performance.md), else PyTorch's exactly (with
    16-bit parameters it saves the statistics in 16 bits, and its output and running statistics differ from the
    F32-parameter path's, so the parameters are passed as they are). It does not write the running statistics (an op
    with an autograd formula must be functional): the caller copies the new ones in; they are empty where nothing is
    updated (eval, or no running statistics)."""
    return _batch_norm_forward(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _check_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """torch.nn.functional.batch_norm's checks in its order: the batch size in training, then the arguments."""
    if training:
        checks.batch_size(input, running_mean, running_var, weight, bias, momentum, eps)
    checks.batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _batch_norm_forward(input, weight, bias, running_mean, running_var, training, momentum, eps):
    _check_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    if _library_batch_norm_serves(input, weight, bias, running_mean, running_var):
        if not (training and running_mean is not None):
            return (*_library_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps),
                    _absent(input), _absent(input))
        new_mean, new_var = running_mean.clone(), running_var.clone()  # the op stays functional
        return (*_library_batch_norm(input, weight, bias, new_mean, new_var, training, momentum, eps), new_mean,
                new_var)
    return _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@batch_norm.register_fake
def _(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # ATen's fakes; ours gives the same shapes and dtypes (it serves only F32 statistics where ATen saves F32).
    _check_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """PyTorch's functional forward: the custom op's five outputs."""
    if training and running_mean is not None and running_var is not None:
        return torch.ops.aten._native_batch_norm_legit_functional(input, weight, bias, running_mean, running_var,
                                                                  training, momentum, eps)
    output, save_mean, save_invstd = torch.native_batch_norm(input, weight, bias, running_mean, running_var,
                                                             training, momentum, eps)
    return output, save_mean, save_invstd, _absent(input), _absent(input)


def _library_batch_norm_serves(input, weight, bias, running_mean, running_var):
    """Whether this library's CPU forward takes these operands as they are and saves what PyTorch's would: a
    non-empty input of rank 2..5, channels-first or channels-last packed, whose parameters and running statistics
    (those given, one-dimensional) share the input's dtype, or F32 with 16-bit data; not F16 / BF16 data without F32
    parameters (PyTorch then saves 16-bit statistics). Anything else (other devices) runs PyTorch's. Where it takes
    them it is the faster at every size, with the eager forward in C++ (autograd_nodes): the project's 2-core Xeon,
    one thread, 2026-12-01, module forward under no_grad (forward + backward), ours / PyTorch's: F32 (4, 16) 0.83
    (0.90), (8, 32, 2, 2) 0.83 (0.93), (8, 32, 8, 8) 0.49 (0.73), (8, 32, 16, 16) 0.25 (0.48); BF16 and F16 data with
    F32 parameters 0.72-0.89 (0.85-0.98) from 64 to 16384 elements."""
    if (input.numel() == 0 or not input.is_cpu
            or input.dtype not in _KERNEL_DTYPES or not 2 <= input.dim() <= 5):
        return False
    if (running_mean is None) != (running_var is None):
        return False
    present = [t for t in (weight, bias, running_mean, running_var) if t is not None]
    if input.dtype in _HALF_DTYPES:
        allowed = (torch.float32,)
        if not present:
            return False
    else:
        allowed = (input.dtype,)
    return all(t.dtype in allowed and t.dim() == 1 for t in present) and _batch_packed(input)


def _library_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(output, save_mean, save_invstd) from this library's forward, the running statistics (given in training)
    updated in place as PyTorch updates them; eval saves nothing, as PyTorch's CPU forward (empty statistics)."""
    if training:
        output, save_mean, save_invstd = _BATCH_NORM_FORWARD.run(
            (running_mean, running_var, input, weight, bias), None, (True, float(momentum), float(eps)),
            (True, True, True))
        return output, save_mean, save_invstd
    output, _, _ = _BATCH_NORM_FORWARD.run((running_mean, running_var, input, weight, bias), None,
                                           (False, float(momentum), float(eps)), (True, False, False))
    dtype = _statistics_dtype(input.dtype)  # PyTorch's empty statistics: of this dtype, two tensors (no aliases)
    return output, input.new_empty(0, dtype=dtype), input.new_empty(0, dtype=dtype)


def _batch_norm_forward_in_place(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """The eager Function's forward: torch.native_batch_norm, which updates the running statistics in place as
    torch.nn.functional.batch_norm does (a plain Function may; the custom op must stay functional). A BatchNorm1d
    module's forward of 32x64 took 26-28 us with it, 40-43 with the functional variant and the caller's two copies."""
    _check_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    if _library_batch_norm_serves(input, weight, bias, running_mean, running_var):
        return _library_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return torch.native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


def _batch_norm_setup(ctx, inputs, output):
    input, weight, bias, running_mean, running_var, training, _, eps = inputs
    if training:  # running_mean / running_var are not needed, and may be overwritten before the backward
        ctx.save_for_backward(input, weight, None, None, output[1], output[2])
    else:
        ctx.save_for_backward(input, weight, running_mean, running_var, None, None)
    ctx.training, ctx.eps = training, eps
    ctx.bias_shape = None if bias is None else bias.shape


def _batch_norm_backward(ctx, grad_output, *_grads_of_statistics):
    input, weight, running_mean, running_var, save_mean, save_invstd = ctx.saved_tensors
    wanted = ctx.needs_input_grad  # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    # torch takes a weight and bias of C elements in any shape ((C, 1), say); the kernel takes (C,), and each
    # gradient goes back in its parameter's shape.
    weight_shape = None if weight is None else weight.shape
    if weight is not None and weight.dim() != 1:
        weight = weight.reshape(-1)
    grad_input, grad_weight, grad_bias = (_batch_norm_backward_body if _eager(ctx) else batch_norm_backward)(
        grad_output, input, weight, running_mean, running_var, save_mean, save_invstd, ctx.training, ctx.eps,
        list(wanted[:3]))
    if wanted[1] and len(weight_shape) != 1:
        grad_weight = grad_weight.reshape(weight_shape)
    if wanted[2] and len(ctx.bias_shape) != 1:
        grad_bias = grad_bias.reshape(ctx.bias_shape)
    return (grad_input if wanted[0] else None, grad_weight if wanted[1] else None, grad_bias if wanted[2] else None,
            None, None, None, None, None)


batch_norm.register_autograd(_batch_norm_backward, setup_context=_batch_norm_setup)


# ------------------------------------------------------------------------------------------------- eager path
# Outside torch.compile, infiniop_py.torch.functional runs each forward as a plain autograd Function with the
# same forward (BatchNorm's writes the running statistics in place), setup_context and backward formula as the
# custom op's registration above, whose backward calls the backward op's body directly. Inside a training step
# (LayerNorm module of 2x512x1024, 2 threads, 2026-11-26) the custom op's autograd layer cost a fixed 0.1-0.2 ms
# per forward and the dispatch of the backward op 0.25 ms per backward, enough to make the drop-in modules slower
# than torch's; a Function with a separate setup_context cost 0.1 ms more per forward than this one, which sets
# up inside its forward. torch.compile traces the custom ops, which it needs.

# ------------------------------------------------------------------------------------------- double backward
# Where the engine records the backward (create_graph=True: a gradient penalty, a Hessian-vector product), the eager
# Functions' gradients come from PyTorch's differentiable formulas instead of the kernels, so that they can be
# differentiated again, as stock's are; autograd_nodes.cpp's <op>RecordedGradients compute the same. Error nodes in
# their place (once_differentiable) refused a .backward() through them, but torch.autograd.grad(penalty,
# parameters) does not run a node that leads to none of its inputs: such a penalty's gradient silently lacked the
# norm's second-order terms. All in F32 (F64 for F64 data), each gradient then in its operand's dtype.

def _wide(tensor):
    return tensor.float() if tensor.dtype in _HALF_DTYPES else tensor


def _as_dtype_of(tensor, like):
    return tensor if tensor is None or tensor.dtype is like.dtype else tensor.to(like.dtype)


def _gradient_of(gradient, operand, wanted):
    return _as_dtype_of(gradient, operand) if wanted and operand is not None else None


def _rms_norm_recorded_backward(ctx, grad_output, _grad_rstd):
    """rstd formed again from the input, so that its own derivative is recorded; eps as the forward took it (None:
    PyTorch's default, the compute type's epsilon)."""
    input, _, weight = ctx.saved_tensors
    wanted = ctx.needs_input_grad  # (input, normalized_shape, weight, eps)
    x = _wide(input)
    grad = _as_dtype_of(grad_output, x)
    normalized = tuple(range(input.dim() - len(ctx.normalized_shape), input.dim()))
    eps = torch.finfo(x.dtype).eps if ctx.eps is None else ctx.eps
    rstd = torch.rsqrt(x.square().mean(normalized, keepdim=True) + eps)
    xhat = x * rstd
    grad_xhat = grad if weight is None else grad * _as_dtype_of(weight, x)
    grad_input = rstd * (grad_xhat - xhat * (grad_xhat * xhat).mean(normalized, keepdim=True)) if wanted[0] else None
    grad_weight = None
    if wanted[2] and weight is not None:
        grad_weight = (grad * xhat).sum(tuple(range(normalized[0]))) if normalized[0] else grad * xhat
    return _gradient_of(grad_input, input, wanted[0]), None, _gradient_of(grad_weight, weight, wanted[2]), None


def _layer_norm_recorded_backward(ctx, grad_output, _grad_mean, _grad_rstd):
    """PyTorch's native_layer_norm_backward from the forward's mean and rstd, as its own LayerNorm's backward."""
    input, mean, rstd, weight, bias = ctx.saved_tensors
    wanted = ctx.needs_input_grad  # (input, normalized_shape, weight, bias, eps)
    x = _wide(input)
    kept = tuple(_leading(input, ctx.normalized_shape)) + (1,) * len(ctx.normalized_shape)
    grads = torch.ops.aten.native_layer_norm_backward(
        _as_dtype_of(grad_output, x), x, list(ctx.normalized_shape), _as_dtype_of(mean, x).reshape(kept),
        _as_dtype_of(rstd, x).reshape(kept), _as_dtype_of(weight, x), _as_dtype_of(bias, x),
        [wanted[0], wanted[2] and weight is not None, wanted[3] and bias is not None])
    return (_gradient_of(grads[0], input, wanted[0]), None, _gradient_of(grads[1], weight, wanted[2]),
            _gradient_of(grads[2], bias, wanted[3]), None)


def _batch_norm_recorded_backward(ctx, grad_output, *_grads_of_statistics):
    """PyTorch's native_batch_norm_backward from the statistics the kernel would take, as its own BatchNorm's."""
    input, weight, running_mean, running_var, save_mean, save_invstd = ctx.saved_tensors
    wanted = ctx.needs_input_grad  # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    x = _wide(input)
    flat_weight = None if weight is None else weight.reshape(-1)
    grads = torch.ops.aten.native_batch_norm_backward(
        _as_dtype_of(grad_output, x), x, _as_dtype_of(flat_weight, x), _as_dtype_of(running_mean, x),
        _as_dtype_of(running_var, x), _as_dtype_of(save_mean, x), _as_dtype_of(save_invstd, x), ctx.training,
        ctx.eps, [wanted[0], wanted[1] and weight is not None, wanted[2]])
    parameter = next((t for t in (weight, running_mean, input) if t is not None))
    grad_weight = _gradient_of(grads[1], weight, wanted[1])
    grad_bias = _gradient_of(grads[2], parameter, wanted[2])
    return (_gradient_of(grads[0], input, wanted[0]),
            None if grad_weight is None else grad_weight.reshape(weight.shape),
            None if grad_bias is None else grad_bias.reshape(ctx.bias_shape), None, None, None, None, None)


def _batched(tensor):
    """Whether ``tensor`` is batched by vmap (autograd's legacy one or torch.func's): no plain memory for the
    kernels to read."""
    functorch = torch._C._functorch
    return functorch.is_legacy_batchedtensor(tensor) or functorch.is_batchedtensor(tensor)


def _eager(ctx):
    """Whether ctx is the eager Function's (else the custom op's, which torch.compile may be tracing)."""
    return getattr(ctx, "eager", False)


def _eager_function(name, forward, setup_context, backward, recorded_backward):
    """An autograd Function of forward: backward's kernels, or recorded_backward's differentiable formulas where
    the engine records the backward (double backward)."""
    def forward_and_setup(ctx, *inputs):
        ctx.eager = True
        output = forward(*inputs)
        setup_context(ctx, inputs, output)
        # The saved statistics have no gradient (the formula ignores theirs): untracked, and no zero gradients
        # made for them in the backward. 8-13 us less per forward + backward of a small module.
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        return output
    def backward_or_recorded(ctx, *grads):
        if grads[0] is None:  # the output's gradient is undefined (not materialized): a zero one, so are these
            return (None,) * len(ctx.needs_input_grad)
        # The engine runs a backward with grad mode on only for create_graph=True; is_grads_batched=True runs it
        # under vmap, whose batched gradients the kernels cannot read (PyTorch's ops batch).
        if torch.is_grad_enabled() or _batched(grads[0]):
            return recorded_backward(ctx, *grads)
        return backward(ctx, *grads)
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward_and_setup), "backward": staticmethod(backward_or_recorded)})


FORWARDS = {"rms_norm": _rms_norm_forward, "layer_norm": _layer_norm_forward,
            "batch_norm": _batch_norm_forward_in_place}
"""The eager forwards alone: where nothing is differentiated (no_grad, inference, frozen models) they run without
the Function's bookkeeping, about 5 us less a call."""

EAGER = {
    "rms_norm": _eager_function("RMSNormFunction", FORWARDS["rms_norm"], _rms_norm_setup, _rms_norm_backward,
                                _rms_norm_recorded_backward),
    "layer_norm": _eager_function("LayerNormFunction", FORWARDS["layer_norm"], _layer_norm_setup,
                                  _layer_norm_backward, _layer_norm_recorded_backward),
    "batch_norm": _eager_function("BatchNormFunction", FORWARDS["batch_norm"], _batch_norm_setup,
                                  _batch_norm_backward, _batch_norm_recorded_backward),
}
