"""The custom ops under torch.ops.infiniop: torch.library's own checks (schema, fake implementation, autograd
registration, AOT dispatch), gradcheck and gradgradcheck in float64, gradient penalties against stock torch's,
gradients only where needed, the eager path against the custom ops, and the import rule."""

import copy
import subprocess
import sys

import pytest

from _devices import DEVICES
from _torch_helpers import torch

import infiniop_py.torch as ipt
from infiniop_py.torch import ops

F64 = torch.float64


def _f64(shape, generator, requires_grad=True, scale=1.0, shift=0.0):
    values = torch.randn(shape, generator=generator, dtype=F64) * scale + shift
    return values.requires_grad_(requires_grad)


def _cases():
    """(name, op, args) of every custom op on small float64 and float32 tensors."""
    g = torch.Generator().manual_seed(0)
    x, go = _f64((3, 4, 6), g, False), _f64((3, 4, 6), g, False)
    w, b = _f64(6, g, False, 0.5, 1.0), _f64(6, g, False)
    _, rstd = torch.ops.infiniop.rms_norm(x, [6], w, 1e-6)
    _, mean, ln_rstd = torch.ops.infiniop.layer_norm(x, [6], w, b, 1e-5)
    xb, gob = _f64((4, 3, 5), g, False, 2.0), _f64((4, 3, 5), g, False)
    wb, bb, rm, rv = _f64(3, g, False), _f64(3, g, False), _f64(3, g, False), _f64(3, g, False).abs() + 0.5
    _, save_mean, save_invstd, _, _ = torch.ops.infiniop.batch_norm(xb, wb, bb, rm, rv, True, 0.1, 1e-5)
    xf = x.float().requires_grad_()
    # The forwards on leaves that need gradients (their autograd formulas are checked); the backward ops on
    # tensors that need none (they have no autograd formula: double backward is not supported).
    xg, wg, bg, xbg, wbg = (t.detach().clone().requires_grad_() for t in (x, w, b, xb, wb))
    return [
        ("rms_norm", torch.ops.infiniop.rms_norm, (xg, [6], wg, 1e-6)),
        ("rms_norm f32 no weight", torch.ops.infiniop.rms_norm, (xf, [4, 6], None, None)),
        ("layer_norm", torch.ops.infiniop.layer_norm, (xg, [6], wg, bg, 1e-5)),
        ("layer_norm no affine", torch.ops.infiniop.layer_norm, (xf, [6], None, None, 1e-5)),
        # 16-bit data, no parameters: torch's CPU kernel would save 16-bit statistics; the op saves F32 either way
        ("layer_norm bf16 no affine", torch.ops.infiniop.layer_norm,
         (x.bfloat16().requires_grad_(), [6], None, None, 1e-5)),
        ("batch_norm training", torch.ops.infiniop.batch_norm, (xbg, wbg, bb, rm, rv, True, 0.1, 1e-5)),
        ("batch_norm eval", torch.ops.infiniop.batch_norm, (xbg, wbg, None, rm, rv, False, 0.1, 1e-5)),
        ("rms_norm_backward", torch.ops.infiniop.rms_norm_backward, (go, x, [6], rstd.detach(), w, [True, True])),
        ("layer_norm_backward", torch.ops.infiniop.layer_norm_backward,
         (go, x, [6], mean.detach(), ln_rstd.detach(), w, b, [True, False, True])),
        ("batch_norm_backward", torch.ops.infiniop.batch_norm_backward,
         (gob, xb, wb, None, None, save_mean.detach(), save_invstd.detach(), True, 1e-5, [True, True, False])),
        ("batch_norm_backward eval", torch.ops.infiniop.batch_norm_backward,
         (gob, xb, None, rm, rv, None, None, False, 1e-5, [False, False, True])),
    ]


@pytest.mark.parametrize("name, op, args", _cases(), ids=[case[0] for case in _cases()])
def test_opcheck(name, op, args):
    """torch.library.opcheck: the schema, the fake (meta) implementation against the real one, the autograd
    registration and an AOT dispatch, on each op."""
    torch.library.opcheck(op, args)


def test_gradcheck_rms_norm():
    g = torch.Generator().manual_seed(1)
    x, w = _f64((3, 2, 7), g, scale=2.0, shift=0.5), _f64((2, 7), g)
    assert torch.autograd.gradcheck(lambda x, w: ipt.rms_norm(x, [2, 7], w, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda x: ipt.rms_norm(x, 7), (x,))


def test_gradcheck_layer_norm():
    g = torch.Generator().manual_seed(2)
    x, w, b = _f64((4, 9), g, scale=2.0, shift=1.0), _f64(9, g), _f64(9, g)
    assert torch.autograd.gradcheck(lambda x, w, b: ipt.layer_norm(x, [9], w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x: ipt.layer_norm(x, (4, 9), eps=1e-3), (x,))


def test_gradcheck_batch_norm():
    g = torch.Generator().manual_seed(3)
    x, w, b = _f64((4, 3, 5), g, scale=2.0), _f64(3, g), _f64(3, g)
    running_mean, running_var = _f64(3, g, False), _f64(3, g, False).abs() + 0.5
    assert torch.autograd.gradcheck(
        lambda x, w, b: ipt.batch_norm(x, None, None, w, b, training=True), (x, w, b))
    assert torch.autograd.gradcheck(
        lambda x, w, b: ipt.batch_norm(x, running_mean, running_var, w, b, training=False), (x, w, b))
    channels_last = _f64((2, 3, 4, 5), g).detach().to(memory_format=torch.channels_last).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: ipt.batch_norm(x, None, None, training=True), (channels_last,))


def test_only_needed_gradients_are_computed(python_functions, monkeypatch):
    """The Python Function's backward asks the kernel for the gradients of the inputs that need them, and no others
    (the C++ node's: tests/torch/test_torch_autograd_nodes.py, each gradient only where it is wanted)."""
    asked = []
    real = ipt.ops._layer_norm_kernel
    monkeypatch.setattr(ipt.ops, "_layer_norm_kernel", lambda *args: asked.append(args[-1]) or real(*args))
    x = torch.randn(3, 8)
    weight, bias = torch.randn(8, requires_grad=True), torch.randn(8)
    ipt.layer_norm(x, [8], weight, bias).sum().backward()
    grad_input, grad_weight, grad_bias = asked[-1]
    assert grad_weight is not None and grad_bias is None
    assert weight.grad is not None and bias.grad is None and x.grad is None


def _functional_call(op, x, weight, bias, running):
    if op == "rms_norm":
        return ipt.rms_norm(x, [x.shape[-1]], weight)
    if op == "layer_norm":
        return ipt.layer_norm(x, [x.shape[-1]], weight, bias)
    return ipt.batch_norm(x, *running, weight, bias, training=True)


def _forward_backward(op, dtype):
    """(grad_fn's name, (output, running statistics, gradients of x, weight and bias)) of one functional call."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 4, 10, generator=g).to(dtype).requires_grad_()
    size = 4 if op == "batch_norm" else 10
    weight, bias = (torch.randn(size, generator=g).to(dtype).requires_grad_() for _ in range(2))
    running = (torch.zeros(size, dtype=dtype), torch.ones(size, dtype=dtype))
    output = _functional_call(op, x, weight, bias, running)
    output.backward(torch.randn(output.shape, generator=g).to(dtype))
    gradients = (x.grad, weight.grad) if op == "rms_norm" else (x.grad, weight.grad, bias.grad)  # RMSNorm: no bias
    return type(output.grad_fn).__name__, (output, *running, *gradients)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("op", ("rms_norm", "layer_norm", "batch_norm"))
def test_the_eager_path_gives_the_custom_ops_bits(op, dtype, monkeypatch):
    """Outside torch.compile the functionals run plain autograd Functions (ops.EAGER, which cost less per call);
    where torch.compile traces they run the custom ops. Both give the same outputs, running statistics and
    gradients, bit for bit."""
    eager_name, eager = _forward_backward(op, dtype)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    custom_op_name, custom_op = _forward_backward(op, dtype)
    assert "Function" in eager_name and f"infiniop_{op}" in custom_op_name, (eager_name, custom_op_name)
    assert len(eager) == len(custom_op)
    for a, b in zip(eager, custom_op):
        assert a is not None and torch.equal(a, b)


@pytest.mark.parametrize("op", ("rms_norm", "layer_norm", "batch_norm"))
def test_without_anything_to_differentiate_the_forward_runs_alone_with_the_same_bits(op, monkeypatch):
    """Under no_grad, or where no operand requires grad, the functionals run the eager forward without its
    Function (ops.FORWARDS): the same output and running statistics, and nothing recorded."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(6, 4, 10, generator=g)
    size = 4 if op == "batch_norm" else 10
    weight, bias = (torch.randn(size, generator=g).requires_grad_() for _ in range(2))

    def call(x, weight, bias):
        running = (torch.zeros(size), torch.ones(size))
        return _functional_call(op, x, weight, bias, running), running

    recorded, recorded_running = call(x, weight, bias)
    assert recorded.grad_fn is not None
    applied = []
    monkeypatch.setattr(ops.EAGER[op], "apply", lambda *args: applied.append(args))
    with torch.no_grad():
        unrecorded, unrecorded_running = call(x.requires_grad_(), weight, bias)
    frozen, frozen_running = call(x.detach(), weight.detach(), bias.detach())
    assert applied == []
    for output, running in ((unrecorded, unrecorded_running), (frozen, frozen_running)):
        assert output.grad_fn is None
        assert torch.equal(output, recorded.detach())
        assert all(torch.equal(a, b) for a, b in zip(running, recorded_running))


def _second_order_cases():
    """(name, function, float64 inputs) for gradgradcheck: every form the eager backwards take."""
    g = torch.Generator().manual_seed(6)
    x, w = _f64((3, 2, 7), g, scale=2.0, shift=0.5), _f64((2, 7), g)
    xl, wl, bl = _f64((4, 9), g, scale=2.0, shift=1.0), _f64(9, g), _f64(9, g)
    xb, wb, bb = _f64((4, 3, 5), g, scale=2.0), _f64(3, g), _f64(3, g)
    running_mean, running_var = _f64(3, g, False), _f64(3, g, False).abs() + 0.5
    channels_last = _f64((2, 3, 4, 5), g).detach().to(memory_format=torch.channels_last).requires_grad_()
    return [
        ("rms_norm", lambda x, w: ipt.rms_norm(x, [2, 7], w, 1e-6), (x, w)),
        ("rms_norm default eps", lambda x: ipt.rms_norm(x, 7), (x,)),
        ("layer_norm", lambda x, w, b: ipt.layer_norm(x, [9], w, b), (xl, wl, bl)),
        ("layer_norm no affine", lambda x: ipt.layer_norm(x, (4, 9), eps=1e-3), (xl,)),
        ("batch_norm training", lambda x, w, b: ipt.batch_norm(x, None, None, w, b, training=True), (xb, wb, bb)),
        ("batch_norm eval", lambda x, w, b: ipt.batch_norm(x, running_mean, running_var, w, b, training=False),
         (xb, wb, bb)),
        ("batch_norm channels_last", lambda x: ipt.batch_norm(x, None, None, training=True), (channels_last,)),
    ]


# The grad_fn of an eager output of ours: a C++ node (autograd_nodes.cpp) or a Python Function (ops.EAGER).
_OUR_GRAD_FNS = {"InfiniopRMSNormBackward", "InfiniopLayerNormBackward", "InfiniopBatchNormBackward",
                 "RMSNormFunctionBackward", "LayerNormFunctionBackward", "BatchNormFunctionBackward"}


@pytest.mark.parametrize("path", ("nodes", "python functions"))
@pytest.mark.parametrize("name, function, inputs", _second_order_cases(), ids=[c[0] for c in _second_order_cases()])
def test_gradgradcheck(name, function, inputs, path, request):
    """Double backward (create_graph=True) differentiates the backward again, checked against finite differences
    in float64, through the C++ nodes and through the Python Functions."""
    if path == "python functions":
        request.getfixturevalue("python_functions")
    assert function(*inputs).grad_fn.name() in _OUR_GRAD_FNS
    assert torch.autograd.gradgradcheck(function, inputs)


def _penalized_gradient(norm, dtype, parameter_dtype, device="cpu"):
    """The gradient of a gradient penalty (the squared gradient of a Linear-norm-Linear model's output with respect
    to its input) with respect to the first Linear's weight, taken with torch.autograd.grad(inputs=...): the call
    that skips any node which leads to none of its inputs. All in float64 but the norm's input, output and
    parameters."""
    g = torch.Generator().manual_seed(7)
    features = 3 if isinstance(norm, torch.nn.BatchNorm1d) else 12
    first = torch.nn.Linear(10, features, dtype=torch.float64)
    last = torch.nn.Linear(features, 1, dtype=torch.float64)
    with torch.no_grad():
        for parameter in (*first.parameters(), *last.parameters()):
            parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=torch.float64))
        for parameter in norm.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=g) + 0.5)
    for module in (first, norm, last):
        module.to(device)
    norm.to(parameter_dtype)
    x = torch.randn(16, 10, generator=g, dtype=torch.float64).to(device).requires_grad_()
    output = last(norm(first(x).to(dtype)).double()).square().sum()
    (grad_x,) = torch.autograd.grad(output, x, create_graph=True)
    (grad_weight,) = torch.autograd.grad(grad_x.square().sum(), first.weight)
    return grad_weight.cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path", ("nodes", "python functions"))
@pytest.mark.parametrize("dtype, parameter_dtype", [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                                    (torch.bfloat16, torch.float32)], ids=str)
@pytest.mark.parametrize("stock", (torch.nn.RMSNorm, torch.nn.LayerNorm, torch.nn.BatchNorm1d),
                         ids=lambda c: c.__name__)
def test_a_gradient_penalty_through_our_norms_is_torchs(stock, dtype, parameter_dtype, path, device, request):
    """Before, the backward's gradients came from error nodes (once_differentiable): torch.autograd.grad(penalty,
    parameters) never ran them, and the penalty's gradient silently lacked the norm's second-order terms (1.00x
    apart, LayerNorm(1024), 2026-12-07). Ours against the same model with torch's norm, on the same weights:
    float64 to rounding, F32 and BF16 (F32 parameters) within their dtype's rounding of the norm's output. Torch's
    on the CPU, ours on each device (CUDA: torch 2.11's LayerNorm refuses BF16 data with F32 parameters there)."""
    if path == "python functions":
        request.getfixturevalue("python_functions")
    features = 3 if stock is torch.nn.BatchNorm1d else 12
    theirs = _penalized_gradient(stock(features, dtype=torch.float64), dtype, parameter_dtype)
    norm = stock(features, dtype=torch.float64)
    replaced = torch.nn.Sequential(norm)
    assert ipt.replace_norms(replaced) == 1
    ours = _penalized_gradient(replaced[0], dtype, parameter_dtype, {"cpu": "cpu", "nvidia": "cuda"}[device])
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype]
    assert (ours - theirs).norm() <= tolerance * theirs.norm()


@pytest.mark.parametrize("path", ("nodes", "python functions"))
@pytest.mark.parametrize("stock", (torch.nn.RMSNorm, torch.nn.LayerNorm, torch.nn.BatchNorm1d),
                         ids=lambda c: c.__name__)
def test_batched_gradients_are_torchs(stock, path, request):
    """torch.autograd.grad(..., is_grads_batched=True) runs the backward under vmap, whose batched gradients the
    kernels cannot read ('Cannot access data pointer of Tensor that doesn't have storage', 2026-12-07): there the
    backwards take PyTorch's formulas, which batch."""
    if path == "python functions":
        request.getfixturevalue("python_functions")
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(16, 12, generator=generator)
    grads = torch.randn(3, 16, 12, generator=generator)
    theirs = stock(12)
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.5)
    replaced = torch.nn.Sequential(copy.deepcopy(theirs))
    assert ipt.replace_norms(replaced) == 1
    results = []
    for module in (replaced[0], theirs):
        leaf = x.clone().requires_grad_()
        results.append(torch.autograd.grad(module(leaf), (leaf, module.weight), grads, is_grads_batched=True))
    for actual, expected in zip(*results):
        torch.testing.assert_close(actual, expected)


def test_the_base_package_does_not_import_torch_nor_ours_torch_dynamo():
    code = ("import sys, numpy as np, infiniop_py\n"
            "infiniop_py.rms_norm_backward(*(np.ones((2, 4), np.float32),) * 2, np.ones(4, np.float32))\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "import infiniop_py.torch\n"
            "assert 'torch' in sys.modules and hasattr(sys.modules['torch'].ops.infiniop, 'rms_norm_backward')\n"
            # torch.compile's machinery (800 modules) loads where a model compiles, not with ours (a decorator did)
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_functional_signatures_are_torchs():
    import inspect
    for name in ("rms_norm", "layer_norm", "batch_norm"):
        ours = inspect.signature(getattr(ipt, name))
        theirs = inspect.signature(getattr(torch.nn.functional, name))
        assert list(ours.parameters) == list(theirs.parameters), name
        assert [p.default for p in ours.parameters.values()] == [p.default for p in theirs.parameters.values()], name


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("shape, normalized, eps", [((6, 40, 96), [96], None), ((3, 5, 7, 33), [7, 33], 1e-5)])
def test_rms_norm_composite_is_torchs_mixed_dtype_forward(dtype, shape, normalized, eps):
    """The forward the custom op runs off the CPU for 16-bit data with F32 weights: torch.nn.functional.rms_norm's
    own (its composite path, which the CPU takes too) bit for bit, and the fused kernel's rstd."""
    from infiniop_py.torch import ops

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype)
    w = torch.randn(normalized, generator=g)
    output, rstd = ops._rms_norm_composite(x, normalized, w, eps)
    assert output.dtype == dtype and torch.equal(output, torch.nn.functional.rms_norm(x, normalized, w, eps))
    fused_rstd = torch.ops.aten._fused_rms_norm(x, normalized, w, eps)[1]
    assert rstd.dtype == fused_rstd.dtype and rstd.shape == fused_rstd.shape
    torch.testing.assert_close(rstd, fused_rstd, rtol=2e-7, atol=0)


def test_batch_packed_agrees_with_its_definition_on_every_permuted_layout():
    """ops._batch_packed (torch's channels-last checks for ranks 4 and 5) against its definition, channels-first
    contiguous or contiguous with C moved last, on every dim order of shapes with size-1 dims (whose strides both
    rules ignore), ranks 3 to 5."""
    import itertools

    from infiniop_py.torch import ops

    checked = 0
    for shape in [(2, 3, 1), (1, 2, 3), *itertools.product((1, 2), (1, 3), (1, 2), (2, 3)),
                  *itertools.product((1, 2), (1, 3), (1, 2), (2,), (1, 3))]:
        for order in itertools.permutations(range(len(shape))):
            inverse = sorted(range(len(order)), key=order.__getitem__)
            tensor = torch.empty([shape[dim] for dim in order]).permute(inverse)  # memory in `order`'s order
            assert tuple(tensor.shape) == shape
            definition = tensor.is_contiguous() or tensor.movedim(1, -1).is_contiguous()
            assert ops._batch_packed(tensor) == definition, (shape, tensor.stride())
            checked += definition
    assert checked > 0
