"""replace_norms(model, rms_norms=[...]): RMSNorm modules written outside torch.nn (transformers' Llama and Gemma
families) swapped in place for this library's backward, checked first, and kept where they compute anything else."""

import copy
import io
import warnings

import pytest

from _foreign_norms import NOT_RMS_NORMS, GemmaStyleRMSNorm, LlamaStyleRMSNorm
from _torch_helpers import bound, count_library_backwards, error, torch

import infiniop_py.torch as ipt

STYLES = {LlamaStyleRMSNorm: 0.0, GemmaStyleRMSNorm: 1.0}  # class: the offset of its weight


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def _with_weight(module, dtype, generator):
    """``module`` in ``dtype`` with a random weight around its initial value (1 for Llama's, 0 for Gemma's)."""
    module = module.to(dtype)
    with torch.no_grad():
        start = 1.0 - STYLES[type(module)]
        module.weight.copy_((torch.randn(module.weight.shape, generator=generator, dtype=torch.float64) * 0.5
                             + start).to(dtype))
    return module


def _replaced(module, classes=tuple(STYLES)):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing kept
        assert ipt.replace_norms(module, rms_norms=classes) >= 1
    return module


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.llama = LlamaStyleRMSNorm(8)
        self.gemma = GemmaStyleRMSNorm(8)
        self.torch = torch.nn.RMSNorm(8)
        with torch.device("meta"):
            self.meta = LlamaStyleRMSNorm(8)  # checked on CPU probes: its data is not needed

    def forward(self, x):
        return self.torch(self.gemma(self.llama(x)))


def test_replaces_both_families_in_place_and_trains_through_the_library(monkeypatch):
    model = _Stack()
    parameters_before = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    names_before = list(model.state_dict())
    assert ipt.replace_norms(model, rms_norms=[LlamaStyleRMSNorm, GemmaStyleRMSNorm]) == 4
    for name, family in (("llama", LlamaStyleRMSNorm), ("gemma", GemmaStyleRMSNorm), ("meta", LlamaStyleRMSNorm)):
        module = getattr(model, name)
        assert type(module) is not family and isinstance(module, family), name
        assert type(module).__name__ == family.__name__ and repr(module) == repr(family(8)), name
    assert type(model.torch) is ipt.RMSNorm
    assert all(a is b for a, b in zip(model.parameters(), parameters_before, strict=True))
    assert list(model.state_dict()) == names_before
    assert ipt.replace_norms(model, rms_norms=[LlamaStyleRMSNorm, GemmaStyleRMSNorm]) == 0  # already ours

    calls = count_library_backwards(monkeypatch)
    weights_before = [model.llama.weight.detach().clone(), model.gemma.weight.detach().clone()]
    x, target = torch.randn(3, 8, generator=_seeded(1)), torch.randn(3, 8, generator=_seeded(2))
    (model(x) * target).sum().backward()  # not a sum of squares: an RMSNorm makes that a constant
    assert len(calls) == 3, "every norm's backward ran through the library"
    optimizer.step()
    assert not torch.equal(model.llama.weight, weights_before[0])
    assert not torch.equal(model.gemma.weight, weights_before[1])


@pytest.mark.parametrize("family", list(STYLES), ids=lambda family: family.__name__)
@pytest.mark.parametrize("dtype, weight_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                                 (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                                 (torch.float32, torch.bfloat16)])
def test_replacement_computes_what_the_original_does(family, dtype, weight_dtype):
    """The output has the original's dtype and its values within the data's rounding of them; the gradients are
    within the dtypes' bounds of a float64 reference of the same RMSNorm (weight or 1 + weight) on the same
    rounded values."""
    generator = _seeded(5)
    original = _with_weight(family(48, eps=1e-5), weight_dtype, generator)
    ours = _replaced(copy.deepcopy(original))
    x = ((torch.randn(6, 48, generator=generator, dtype=torch.float64) * 2 + 0.5).to(dtype)).requires_grad_()
    expected = original(x)
    output = ours(x)
    assert output.dtype == expected.dtype
    assert error(output, expected) <= bound(dtype)  # both round to the data's precision
    grad_output = torch.randn(output.shape, generator=generator, dtype=torch.float64).to(output.dtype)
    grad_x, grad_weight = torch.autograd.grad(output, (x, ours.weight), grad_output)
    assert grad_x.dtype == dtype and grad_weight.dtype == weight_dtype

    x64 = x.detach().double().requires_grad_()
    weight64 = ours.weight.detach().double().requires_grad_()
    reference = torch.nn.functional.rms_norm(x64, [48], weight64 + STYLES[family], 1e-5)
    reference_x, reference_weight = torch.autograd.grad(reference, (x64, weight64), grad_output.double())
    with torch.no_grad():  # the size of the terms that cancel in each gradient (see _torch_helpers.error)
        rstd = x64.square().mean(-1).add(1e-5).rsqrt()
        x_scale = float((grad_output.double() * (weight64 + STYLES[family])).abs().max() * rstd.max())
        weight_scale = float((grad_output.double() * x64 * rstd[:, None]).abs().sum(0).max())
    assert error(grad_x, reference_x, x_scale) <= bound(dtype), "grad_input"
    assert error(grad_weight, reference_weight, weight_scale) <= max(bound(dtype), bound(weight_dtype)), "weight"


def test_epsilon_is_read_on_every_call():
    norm = _replaced(LlamaStyleRMSNorm(16))
    x = torch.randn(4, 16) * 0.1
    norm.variance_epsilon = 0.5
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, [16], norm.weight, 0.5))


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("inf"), float("nan")])
def test_an_epsilon_the_kernels_do_not_take_runs_the_class_own_forward(eps):
    """A negative or non-finite epsilon: the class's own forward computes what it computes (ours raised
    BadParamError, 2026-12-08); 0 is the kernels'."""
    theirs = _with_weight(LlamaStyleRMSNorm(16), torch.float32, _seeded(30))
    ours = _replaced(copy.deepcopy(theirs))
    theirs.variance_epsilon = ours.variance_epsilon = eps
    x = torch.randn(40, 16, generator=_seeded(31))
    torch.testing.assert_close(ours(x), theirs(x), equal_nan=True)


def test_modules_that_compute_something_else_are_kept_with_one_warning():
    model = torch.nn.ModuleDict({cls.__name__: cls(8) for cls in NOT_RMS_NORMS})
    model["llama"] = LlamaStyleRMSNorm(8)
    calls = []
    model["llama"].register_forward_hook(lambda *args: calls.append(args))
    weights_before = {name: module.weight for name, module in model.items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert ipt.replace_norms(model, rms_norms=[*NOT_RMS_NORMS, LlamaStyleRMSNorm]) == 1
    assert len(caught) == 1
    message = str(caught[0].message)
    for cls, reason in NOT_RMS_NORMS.items():
        assert type(model[cls.__name__]) is cls
        assert f"{cls.__name__} (" in message and reason in message, (cls.__name__, message)
    # The probes ran the classes' forwards alone (no hooks), and every module kept its own weight.
    assert calls == [] and type(model["llama"]) is not LlamaStyleRMSNorm
    assert all(module.weight is weights_before[name] for name, module in model.items())


def test_replaced_modules_pickle_and_copy():
    generator = _seeded(9)
    model = torch.nn.Sequential(_with_weight(LlamaStyleRMSNorm(8), torch.float32, generator),
                                _with_weight(GemmaStyleRMSNorm(8), torch.float32, generator))
    _replaced(model)
    x = torch.randn(2, 8, generator=generator)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
        assert [type(module) for module in other] == [type(module) for module in model]
        assert torch.equal(other(x), model(x))


def test_rms_norms_takes_classes():
    assert ipt.replace_norms(LlamaStyleRMSNorm(4), rms_norms=LlamaStyleRMSNorm) == 1  # one class alone
    for wrong, message in (([3], "rms_norms: 3 is not a torch.nn.Module class"),
                           ([[LlamaStyleRMSNorm]], r"rms_norms: \[<class .*\] is not a torch.nn.Module class"),
                           (None, "rms_norms: a torch.nn.Module class or an iterable of them, not None")):
        with pytest.raises(TypeError, match=message):
            ipt.replace_norms(LlamaStyleRMSNorm(4), rms_norms=wrong)
