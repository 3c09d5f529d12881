"""Training with the drop-in norms: at each of 20 steps of training small models after replace_norms, the losses,
gradients and running statistics are torch's, under autocast too; torch.compile(fullgraph=True) traces them
whole, forward and backward; and activation checkpointing recomputes them."""

import copy

import pytest

from _foreign_norms import GemmaStyleRMSNorm, LlamaStyleRMSNorm
from _torch_helpers import count_library_backwards, cpp_library_forwards, error, torch

import infiniop_py.torch as ipt

STEPS = 20


class TransformerBlock(torch.nn.Module):
    """Pre-norm attention and MLP, LayerNorm and RMSNorm."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.attention_norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp_norm = torch.nn.RMSNorm(width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))
        self.final_norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        normed = self.attention_norm(x)
        x = x + self.attention(normed, normed, normed, need_weights=False)[0]
        x = x + self.mlp(self.mlp_norm(x))
        return self.head(self.final_norm(x).mean(1))


class ConvNet(torch.nn.Module):
    """Conv + BatchNorm2d stages and a BatchNorm1d head; the layers before a BatchNorm have no bias (it would
    have no effect)."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(16, 16, bias=False), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                        torch.nn.Linear(16, 10))

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


def _data(model_class, steps, generator):
    shape = (8, 6, 32) if model_class is TransformerBlock else (8, 3, 12, 12)
    return [(torch.randn(shape, generator=generator), torch.randint(0, 10, (8,), generator=generator))
            for _ in range(steps)]


def _loss_and_gradients(model, inputs, labels, autocast):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    return loss.item()


# ConvNet under autocast: its BatchNorms' BF16 forward is this library's, within half an ulp of exact as torch's (of
# the terms' size) but not bit for bit, so a BF16 output may be an ulp off torch's and the BF16 gradients after it
# more (the head's BatchNorm1d normalizes 8 samples to values of 2-3): the bound is BF16's epsilon.
@pytest.mark.parametrize("model_class, autocast, bound", [
    (TransformerBlock, False, 1e-5), (ConvNet, False, 1e-5),
    (TransformerBlock, True, 2e-3), (ConvNet, True, torch.finfo(torch.bfloat16).eps),
], ids=["transformer-f32", "convnet-f32", "transformer-autocast-bf16", "convnet-autocast-bf16"])
def test_training_follows_torch(model_class, autocast, bound, monkeypatch):
    """STEPS steps of SGD with momentum along torch's own run: at each, the model with the library's norms,
    given torch's weights and running statistics, gives torch's loss, gradients and new running statistics.

    Step by step, not two runs side by side: these models are chaotic enough that rounding alone moves a
    20-step run by 1e-4 to 3e-2 (F32 against F64, or torch's F32 on one thread against two), so two runs
    agree closely only where ours rounds bit for bit as torch's build does on that machine. (SGD, not Adam,
    which would turn the rounding noise of gradients that are zero in exact arithmetic, e.g. attention's key
    bias, into full steps of either sign.)"""
    torch.manual_seed(0)
    theirs = model_class()
    ours = copy.deepcopy(theirs)
    assert ipt.replace_norms(ours) == 3
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    calls = count_library_backwards(monkeypatch)
    losses = []
    for step, (inputs, labels) in enumerate(_data(model_class, STEPS, torch.Generator().manual_seed(1))):
        ours.load_state_dict(theirs.state_dict())
        actual = _loss_and_gradients(ours, inputs, labels, autocast)
        expected = _loss_and_gradients(theirs, inputs, labels, autocast)
        assert abs(actual - expected) <= bound * abs(expected), f"step {step}: loss {actual} against {expected}"
        for (name, a), (_, e) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            assert error(a.grad, e.grad, scale=1.0) <= bound, f"step {step}: gradient of {name}"
        for (name, a), (_, e) in zip(ours.named_buffers(), theirs.named_buffers(), strict=True):
            if e.is_floating_point():
                assert error(a, e, scale=1.0) <= bound, f"step {step}: {name}"
            else:
                assert torch.equal(a, e), f"step {step}: {name}"
        optimizer.step()
        losses.append(expected)
    assert len(calls) == STEPS * 3, "every norm's backward ran through the library"
    assert losses[-1] < losses[0]  # it trains at all


class AllNorms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.batch_norm = ipt.BatchNorm2d(6)
        self.layer_norm = ipt.LayerNorm(6)
        self.rms_norm = ipt.RMSNorm(6)
        # Norms of the two transformers families, replaced (replace_norms(rms_norms=...)): forwards of their own.
        self.llama = LlamaStyleRMSNorm(6)
        self.gemma = GemmaStyleRMSNorm(6)
        torch.nn.init.normal_(self.llama.weight, 1.0, 0.5)  # else the loss, a mean square, would not depend on them
        torch.nn.init.normal_(self.gemma.weight, 0.0, 0.5)
        assert ipt.replace_norms(self, rms_norms=[LlamaStyleRMSNorm, GemmaStyleRMSNorm]) == 2

    def forward(self, x):
        x = self.batch_norm(self.conv(x)).relu()
        x = x.flatten(2).transpose(1, 2)  # (N, positions, channels)
        return self.gemma(self.llama(self.rms_norm(self.layer_norm(x)))).square().mean()


def test_compile_fullgraph_forward_and_backward_equal_eager(monkeypatch):
    """torch.compile(fullgraph=True) traces the forward and backward with no graph break; the compiled step runs
    the library's backward kernels and gives eager's loss, gradients and running statistics. With the sizes as
    shipped (functional._TORCH_BELOW, which the choice of torch's norms for small CPU inputs reads): eager mode
    gives these tiny LayerNorm and BatchNorm inputs to torch's norms, the compiled step traces ours."""
    monkeypatch.undo()  # conftest's sizes of {}: the shipped ones here
    from infiniop_py.torch import functional
    assert functional._TORCH_BELOW
    torch.manual_seed(0)
    eager = AllNorms()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    calls = []
    real = ipt.ops._layer_norm_kernel
    monkeypatch.setattr(ipt.ops, "_layer_norm_kernel", lambda *args: calls.append(1) or real(*args))
    library_calls = count_library_backwards(monkeypatch)
    for step in range(2):
        x = torch.randn(4, 3, 9, 9)
        expected = eager(x)
        expected.backward()
        actual = compiled(x)
        actual.backward()
        torch.testing.assert_close(actual, expected)
        for (name, a), (_, e) in zip(compiled_model.named_parameters(), eager.named_parameters()):
            torch.testing.assert_close(a.grad, e.grad, msg=name)
        for (name, a), (_, e) in zip(compiled_model.named_buffers(), eager.named_buffers()):
            torch.testing.assert_close(a, e, msg=name)
    assert len(calls) == 2  # compiled only (eager: torch's LayerNorm), two steps
    assert library_calls.count("rms_norm_backward") == 12  # and three RMSNorms in each


@pytest.mark.parametrize("channels_last", [False, True])
def test_compiled_batch_norm_on_this_librarys_forward_equals_eager(channels_last, monkeypatch):
    """A BatchNorm large enough for this library's CPU forward, compiled (fullgraph: the functional custom op,
    which returns new running statistics) and eager (the Function, which updates them in place): the same output,
    gradients and running statistics over two training steps and an eval one, and the library's forward ran."""
    torch.manual_seed(1)
    eager = torch.nn.Sequential(ipt.BatchNorm2d(8), torch.nn.Tanh())
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    calls = []
    real = ipt.ops._library_batch_norm
    monkeypatch.setattr(ipt.ops, "_library_batch_norm", lambda *args: calls.append(1) or real(*args))
    cpp_forwards = cpp_library_forwards()[2]  # the eager forward runs in C++ where the autograd nodes are built
    for step in range(3):
        if step == 2:
            eager.eval(), compiled_model.eval()
        x = torch.randn(4, 8, 32, 32) * 3 + 1
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        expected = eager(x).square().mean()
        actual = compiled(x).square().mean()
        torch.testing.assert_close(actual, expected)
        if step < 2:
            expected.backward()
            actual.backward()
        for (name, a), (_, e) in zip(compiled_model.named_parameters(), eager.named_parameters()):
            torch.testing.assert_close(a.grad, e.grad, msg=name)
        for (name, a), (_, e) in zip(compiled_model.named_buffers(), eager.named_buffers()):
            torch.testing.assert_close(a, e, msg=name)
    assert len(calls) + cpp_library_forwards()[2] - cpp_forwards >= 6  # eager and compiled, each step


@pytest.mark.parametrize("reentrant", [False, True])
def test_activation_checkpointing_gives_torchs_gradients(reentrant, monkeypatch):
    """torch.utils.checkpoint (transformers' gradient checkpointing) recomputes each block's forward in the
    backward: the saved tensors of the replaced norms come back through it, their backward runs the library's
    kernels, and the gradients are torch's without checkpointing."""
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    torch.manual_seed(0)
    theirs = TransformerBlock()
    ours = copy.deepcopy(theirs)
    assert ipt.replace_norms(ours) == 3
    calls = count_library_backwards(monkeypatch)
    inputs, labels = _data(TransformerBlock, 1, torch.Generator().manual_seed(3))[0]
    expected = _loss_and_gradients(theirs, inputs, labels, autocast=False)

    class Checkpointed(torch.nn.Module):
        def forward(self, x):
            # Recomputed whole: stopping early ends the recomputation with a C++ exception, which the sanitizer
            # stage's preloaded ASan runtime cannot intercept.
            with set_checkpoint_early_stop(False):
                return checkpoint(ours, x, use_reentrant=reentrant)

    actual = _loss_and_gradients(Checkpointed(), inputs.requires_grad_(reentrant), labels, autocast=False)
    assert calls.count("rms_norm_backward") == 1
    assert abs(actual - expected) <= 1e-6 * abs(expected)
    for (name, a), (_, e) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
        assert error(a.grad, e.grad, scale=1.0) <= 1e-5, name
