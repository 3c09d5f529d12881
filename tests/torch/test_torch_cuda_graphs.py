"""CUDA graphs and torch.compile on CUDA with the replaced norms (issue 52): a whole training step (forward,
backward, optimizer) captured with torch.cuda.graph replays to eager mode's losses and parameters, and
torch.compile(mode="reduce-overhead", fullgraph=True) gives eager mode's gradients. These need a GPU and skip
without one, saying why; their CPU counterparts (torch.compile with fullgraph=True, the cached path that
makes no per-call allocation or validation) run everywhere: test_torch_training.py and test_torch_fast_path.py."""

import copy

import pytest

from _torch_helpers import torch

import infiniop_py.torch as ipt

pytestmark = pytest.mark.nvidia


@pytest.fixture(autouse=True)
def _exact_convolutions():
    """cuDNN's convolutions in F32 without TF32 and with deterministic algorithms: eager and compiled runs may
    otherwise pick algorithms whose conv.weight gradients differ by TF32's rounding (~1e-3), beyond the bounds below
    (one run of four on an H200, 2026-11-30)."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False):
        yield


class _Net(torch.nn.Module):
    """A small CNN and a transformer-style tail: the three norms, BatchNorm in channels-last."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.batch_norm = torch.nn.BatchNorm2d(8)
        self.linear = torch.nn.Linear(8 * 8 * 8, 64)
        self.layer_norm = torch.nn.LayerNorm(64)
        self.rms_norm = torch.nn.RMSNorm(64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.batch_norm(self.conv(x)))
        x = self.layer_norm(self.linear(x.flatten(1)))
        return self.head(torch.nn.functional.gelu(self.rms_norm(x)))


def _assert_close(got, want, name):
    """Within these bounds, the message naming the tensor and keeping torch's account of the mismatch."""
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=lambda message: f"{name}: {message}")


def _models():
    torch.manual_seed(0)
    eager = _Net().cuda().to(memory_format=torch.channels_last)
    assert ipt.replace_norms(eager) == 3
    return eager, copy.deepcopy(eager)


def _batches(count):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 3, 8, 8, generator=generator).cuda().to(memory_format=torch.channels_last),
             torch.randint(0, 10, (16,), generator=generator).cuda()) for _ in range(count)]


def _step(model, optimizer, x, labels):
    loss = torch.nn.functional.cross_entropy(model(x), labels)
    loss.backward()
    optimizer.step()
    return loss


def test_a_whole_training_step_replays_from_a_cuda_graph_to_eager_results():
    eager, graphed = _models()
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.05, momentum=0.9)
    graph_optimizer = torch.optim.SGD(graphed.parameters(), lr=0.05, momentum=0.9)
    batches = _batches(6)
    static_x, static_labels = (t.clone() for t in batches[0])
    # Warm up on a side stream (torch's recipe): the layouts' first, checked calls happen here, not in capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, labels in batches[:3]:
            for model, optimizer in ((eager, eager_optimizer), (graphed, graph_optimizer)):
                optimizer.zero_grad(set_to_none=False)
                _step(model, optimizer, x, labels)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    graph_optimizer.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_loss = _step(graphed, graph_optimizer, static_x, static_labels)
    # Capture ran nothing: take the graph's state from before it (the optimizer stepped only on the side stream).
    for x, labels in batches[3:]:
        static_x.copy_(x)
        static_labels.copy_(labels)
        for parameter in graphed.parameters():
            parameter.grad.zero_()
        graph.replay()
        eager_optimizer.zero_grad(set_to_none=False)
        expected = _step(eager, eager_optimizer, x, labels)
        torch.cuda.synchronize()
        torch.testing.assert_close(static_loss, expected, rtol=1e-5, atol=1e-6)
        for (name, got), (_, want) in zip(graphed.named_parameters(), eager.named_parameters()):
            _assert_close(got.grad, want.grad, name)
            _assert_close(got, want, name)
        for (name, got), (_, want) in zip(graphed.named_buffers(), eager.named_buffers()):
            _assert_close(got, want, name)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_on_cuda_gives_eager_gradients(mode):
    eager, compiled_model = _models()
    compiled = torch.compile(compiled_model, mode=mode, fullgraph=True)
    for x, labels in _batches(3):
        for model in (eager, compiled_model):
            model.zero_grad(set_to_none=True)
        expected = torch.nn.functional.cross_entropy(eager(x), labels)
        expected.backward()
        actual = torch.nn.functional.cross_entropy(compiled(x), labels)
        actual.backward()
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
        for (name, got), (_, want) in zip(compiled_model.named_parameters(), eager.named_parameters()):
            _assert_close(got.grad, want.grad, name)


def test_the_training_bench_times_each_step_replayed_from_a_cuda_graph(monkeypatch, tmp_path):
    """bench --training on CUDA (tiny shapes): every row gets its graph columns, and a graphed step's replay gives
    the eager step's gradients (its gradients are written afresh at each replay, not accumulated)."""
    import json

    from infiniop_py import bench
    from infiniop_py.bench import training as bench_training

    eager, graphed = _models()
    x = _batches(1)[0][0].requires_grad_()
    replay = bench_training._graphed_step(torch, graphed, x, autocast=False)
    for _ in range(2):
        replay()
    bench_training._training_step(torch, eager, x.detach().clone().requires_grad_(), autocast=False)()
    for (name, got), (_, want) in zip(graphed.named_parameters(), eager.named_parameters()):
        _assert_close(got.grad, want.grad, name)

    monkeypatch.setattr(bench_training, "BATCH_TOKENS", (2, 3))
    monkeypatch.setattr(bench_training, "WIDTH", 16)
    monkeypatch.setattr(bench_training, "IMAGES", (2, 4, 5, 5))
    monkeypatch.setattr(bench_training, "RESNET_IMAGES", (2, 3, 32, 32))
    monkeypatch.setattr(bench_training, "MIN_SECONDS", 0.0)
    path = tmp_path / "training.json"
    assert bench.main(["--training", "--device", "nvidia", "--repeats", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    rows = report["models"] + report["modules"]
    assert rows and all(r.get("graph_error") is None and r["torch_graph_s"] > 0 and r["ours_graph_s"] > 0
                        and r["graph_speedup"] == r["torch_graph_s"] / r["ours_graph_s"] for r in rows)
