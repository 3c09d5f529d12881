"""Under autocast the drop-ins do what torch's norms do. On CUDA torch's autocast runs layer_norm (and, from torch
2.12, rms_norm) in F32: F16/BF16 input and parameters cast to F32, an F32 output, and gradients through the casts.
The CPU's autocast has no such policy, so these tests emulate CUDA's there: they register F32-policy kernels for
aten's layer_norm, native_layer_norm and rms_norm under AutocastCPU, as CUDA's autocast has them, for stock torch
and ours alike. Without a policy (BatchNorm, the CPU as torch ships it) the operands stay as they are; CUDA's own
policy is tested where a GPU is."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the PyTorch integration needs it")

import infiniop_py.torch as ipt  # noqa: E402
from infiniop_py.torch import functional  # noqa: E402
from _foreign_norms import LlamaStyleRMSNorm  # noqa: E402

HALF = (torch.float16, torch.bfloat16)


@pytest.fixture
def cpu_f32_policy():
    """CUDA's autocast policy for the row norms, registered for the CPU's autocast for the test's duration."""
    library = torch.library.Library("aten", "IMPL")
    excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)

    def f32_policy(name):
        op = getattr(torch.ops.aten, name).default

        def kernel(*args):
            with torch._C._ExcludeDispatchKeyGuard(excluded):
                return op(*[a.float() if isinstance(a, torch.Tensor) and a.dtype in HALF else a for a in args])
        library.impl(name, kernel, "AutocastCPU")

    for name in ("layer_norm", "native_layer_norm", "rms_norm"):
        f32_policy(name)
    functional.read_autocast_policies()
    try:
        yield
    finally:
        library._destroy()
        functional.read_autocast_policies()


def _step(module, x, device_type):
    """(output, grad of x, {parameter: grad}) of one forward + backward under BF16 autocast."""
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast(device_type, dtype=torch.bfloat16):
        output = module(x)
    output.backward(torch.linspace(-1.0, 1.0, output.numel(), device=x.device).reshape(output.shape).to(output.dtype))
    return output.detach(), x.grad, {name: p.grad for name, p in module.named_parameters()}


def _close(actual, expected, rtol):
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=rtol * expected.abs().max().item())


def _assert_follows_stock(stock, ours, x, device_type, output_dtype):
    expected, actual = _step(stock, x, device_type), _step(ours, x, device_type)
    assert expected[0].dtype == output_dtype  # the policy (emulated or CUDA's) is what the test means
    assert actual[0].dtype == output_dtype
    _close(actual[0], expected[0], 1e-6)  # the same F32 computation
    # The backwards: in F32 under the policy (torch's, ours), each gradient rounded once to its tensor's dtype. On
    # 16-bit data torch's CPU LayerNorm backward rounds its parameter gradients to the data's precision (ours
    # does not): within that rounding there.
    _close(actual[1], expected[1], 2 ** -7 if x.dtype in HALF else 1e-5)
    for name, grad in expected[2].items():
        _close(actual[2][name], grad, 2 ** -7 if output_dtype in HALF else 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("parameter_dtype", [torch.float32, "data"])
@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_under_a_float32_autocast_policy_norms_run_in_f32_as_torchs(cpu_f32_policy, norm, dtype, parameter_dtype):
    """Before the casts, a replaced LayerNorm's forward gave F32 (torch's kernel under the policy) while its backward
    got the 16-bit input it had saved: a dtype error in every backward."""
    torch.manual_seed(0)
    stock = getattr(torch.nn, norm)(24)
    with torch.no_grad():
        for parameter in stock.parameters():
            parameter.normal_()
    stock = stock.to(dtype if parameter_dtype == "data" else torch.float32)
    ours = copy.deepcopy(stock)
    assert ipt.replace_norms(ours) == 1
    x = (torch.randn(6, 24) * 2 + 0.5).to(dtype)
    _assert_follows_stock(stock, ours, x, "cpu", torch.float32)


def test_batch_norm_and_the_cpus_own_autocast_leave_the_operands_as_they_are():
    torch.manual_seed(1)
    for stock, x in ((torch.nn.LayerNorm(16), torch.randn(4, 16)), (torch.nn.RMSNorm(16), torch.randn(4, 16)),
                     (torch.nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5))):
        ours = copy.deepcopy(stock)
        ipt.replace_norms(ours)
        _assert_follows_stock(stock, ours, x.bfloat16(), "cpu", torch.bfloat16)


def test_a_foreign_rms_norm_keeps_its_own_forward_under_the_policy(cpu_f32_policy):
    """transformers' RMSNorm classes compute with elementwise ops, which the policy leaves alone: the replacement
    gives the dtype their forward gives (the promoted type of data and weight), not torch's rms_norm's F32."""
    torch.manual_seed(2)
    for weight_dtype, output_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)):
        stock = LlamaStyleRMSNorm(16).to(weight_dtype)
        ours = copy.deepcopy(stock)
        assert ipt.replace_norms(ours, rms_norms=[LlamaStyleRMSNorm]) == 1
        x = torch.randn(4, 16).bfloat16()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert stock(x).dtype == output_dtype
            assert ours(x).dtype == output_dtype


@pytest.mark.nvidia
@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_under_cuda_autocast_norms_follow_torchs(norm):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    torch.manual_seed(3)
    stock = getattr(torch.nn, norm)(256).cuda()
    ours = copy.deepcopy(stock)
    ipt.replace_norms(ours)
    x = torch.randn(64, 256, device="cuda").bfloat16()
    policy = torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{norm.lower().replace('norm', '_norm')}",
                                                            "AutocastCUDA")
    _assert_follows_stock(stock, ours, x, "cuda", torch.float32 if policy else torch.bfloat16)
