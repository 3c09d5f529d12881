"""bench --training (infiniop_py/bench/training.py) on tiny shapes: every model and module is timed with torch's
norms and with replace_norms, and the report says how many norms were replaced; bench --sync-batch-norm
(bench/distributed.py) with its 2 gloo processes on a small batch; and that the training bench's malloc setting
keeps freed memory where it says it does; bench --host-overhead (bench/host_overhead.py): a row per op, layout,
dtype and mode, no synchronization inside a timed batch, and --device nvidia refused where there is no GPU."""

import json
import resource
import subprocess
import sys

import pytest

from _torch_helpers import torch  # noqa: F401  (skips without torch)

from infiniop_py import bench
from infiniop_py.bench import distributed as bench_distributed, host_overhead as bench_host_overhead, \
    training as bench_training


def test_training_benchmark_reports_every_model_and_module(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_training, "BATCH_TOKENS", (2, 3))
    monkeypatch.setattr(bench_training, "WIDTH", 16)
    monkeypatch.setattr(bench_training, "IMAGES", (2, 4, 5, 5))
    path = tmp_path / "training.json"
    assert bench.main(["--training", "--repeats", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    models = {(r["name"], r["dtype"]): r for r in report["models"]}
    modules = {(r["name"], r["dtype"]): r for r in report["modules"]}
    assert set(models) == {(name, dtype) for name in ("transformer MLP (4x LayerNorm + RMSNorm)",
                                                      "Llama-style MLP (5x LlamaRMSNorm)",
                                                      "depthwise conv net (3x BatchNorm2d)")
                           for dtype in ("float32", "bfloat16")}
    assert {r["replaced"] for r in models.values() if r["name"].startswith("transformer")} == {8}
    assert {r["replaced"] for r in models.values() if r["name"].startswith("Llama")} == {5}
    assert {r["replaced"] for r in models.values() if r["name"].startswith("depthwise")} == {3}
    assert set(modules) == {(name, dtype) for name in ("RMSNorm", "LlamaRMSNorm (transformers' forward)",
                                                       "LayerNorm", "BatchNorm2d")
                            for dtype in ("float32", "bfloat16")}
    assert all(r["replaced"] == 1 and r["torch_s"] > 0 and r["ours_s"] > 0 for r in modules.values())
    # BF16 modules run on BF16 input (autocast would leave a norm's F32 input as it is); models get theirs from
    # the layers autocast runs in BF16.
    assert {(r["dtype"], r["input_dtype"]) for r in modules.values()} == {("float32", "float32"),
                                                                          ("bfloat16", "bfloat16")}
    assert {r["input_dtype"] for r in models.values()} == {"float32"}
    table = capsys.readouterr().out
    assert "median training-step speedup" in table and "| RMSNorm | bfloat16 | 2x3x16 |" in table
    malloc = "keeps freed memory (mallopt)" if report["keeps_freed_memory"] else "the C library's defaults"
    assert f"malloc: {malloc}" in table


# In a fresh process (the setting is process-wide): the page faults of touching 64 MiB from malloc a second time,
# after free. glibc serves 64 MiB from a fresh mmap each time by default (its dynamic threshold stops at 32 MiB),
# so every page faults again; kept, the second block is the first one's memory.
_SECOND_TOUCH_FAULTS = """
import ctypes, resource, sys
from infiniop_py.bench import training
kept = training.keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
size = 64 << 20
for touch in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(block)
print(kept, faults)
"""


def _second_touch_faults(mode):
    result = subprocess.run([sys.executable, "-c", _SECOND_TOUCH_FAULTS, mode], capture_output=True, text=True,
                            timeout=120, check=True)
    kept, faults = result.stdout.split()
    return kept, int(faults)


def test_keep_freed_memory_stops_the_page_faults_of_reused_blocks():
    kept, faults_kept = _second_touch_faults("keep")
    if kept != "True":
        pytest.skip("this process's malloc is not glibc's own (another C library, or a sanitizer's): nothing to set")
    _, faults_default = _second_touch_faults("default")
    pages = (64 << 20) // resource.getpagesize()
    assert faults_default > pages // 2, "glibc's default should map 64 MiB afresh"
    assert faults_kept < pages // 100


def test_sync_batch_norm_benchmark_times_each_step_on_two_processes(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_distributed, "IMAGES", (4, 3, 5, 5))
    path = tmp_path / "sync.json"
    assert bench.main(["--sync-batch-norm", "--repeats", "2", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["world_size"] == 2 and report["shard"] == [2, 3, 5, 5]
    assert [step["name"] for step in report["steps"]] == [
        "torch BatchNorm2d, alone", "infiniop BatchNorm2d, alone", "infiniop SyncBatchNorm, 2 processes"]
    assert all(step["seconds"] > 0 for step in report["steps"])
    assert "| infiniop SyncBatchNorm, 2 processes |" in capsys.readouterr().out


def test_a_channels_last_model_is_timed_in_channels_last(monkeypatch):
    """The ResNet-50 row's path (on GPUs, where torchvision imports) on a tiny CNN on the CPU: model and input in
    channels_last, under BF16 autocast, its BatchNorms replaced."""
    monkeypatch.setattr(bench_training, "MIN_SECONDS", 0.0)
    formats = []

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.norm = torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            formats.append(x.is_contiguous(memory_format=torch.channels_last) and x.dim() == 4)
            return self.norm(self.conv(x))

    result = bench_training._compare(torch, Net, (2, 3, 6, 6), "bfloat16", 1, torch.device("cpu"), module=False,
                                     channels_last=True)
    assert result["replaced"] == 1 and result["torch_s"] > 0 and result["ours_s"] > 0
    assert formats and all(formats)


def test_host_overhead_benchmark_reports_every_op_layout_and_dtype(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench_host_overhead, "CALLS", 2)
    path = tmp_path / "host.json"
    assert bench.main(["--host-overhead", "--repeats", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    rows = {(r["mode"], r["op"], r["layout"], r["dtype"]): r for r in report["results"]}
    layouts = [("RMSNorm", "rows"), ("LayerNorm", "rows")] + [
        (f"BatchNorm{rank}d", layout) for rank in (1, 2, 3) for layout in ("channels-first", "channels-last")]
    assert set(rows) == {(mode, op, layout, dtype)
                         for mode in ("forward", "forward (no_grad)", "forward+backward", "functional",
                                      "functional (DeviceArray)")
                         for op, layout in layouts for dtype in ("float32", "bfloat16")}
    assert len(report["results"]) == len(rows)
    assert all(r["stock_s"] > 0 and r["ours_s"] > 0 and r["ratio"] == r["ours_s"] / r["stock_s"]
               for r in rows.values())
    assert report["device"] == "cpu" and report["calls_per_round"] == 2
    table = capsys.readouterr().out
    assert "| functional | BatchNorm2d | bfloat16 | channels-last | 2x4x2x2 |" in table
    assert f"torch {report['torch_version']}" in table and "ours/stock" in table


def test_host_overhead_synchronizes_only_between_timed_batches():
    """On CUDA a call's host time is until it returns: no synchronization inside a batch of timed calls."""
    events = []
    runs = [lambda: events.append("stock"), lambda: events.append("ours")]
    medians = bench_host_overhead.host_medians(runs, rounds=2, calls=3, synchronize=lambda: events.append("sync"))
    assert len(medians) == 2
    batch = ["sync", "{}", "sync", "{}", "{}", "{}"]  # the untimed call, then the timed ones
    rounds = [[event.format(side) for side in order for event in batch]
              for order in (("stock", "ours"), ("ours", "stock"))]
    assert events == rounds[0] + rounds[1]


def test_host_overhead_on_nvidia_without_a_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the benchmark would run")
    assert bench.main(["--host-overhead", "--device", "cuda", "--repeats", "1"]) == 2
    captured = capsys.readouterr()
    assert "cannot benchmark nvidia:0" in captured.err and captured.out == ""


def test_host_overhead_times_this_librarys_path_at_every_size(monkeypatch):
    """The drop-ins give tiny CPU tensors to torch's own norms end to end (functional._TORCH_BELOW): the benchmark
    sets those sizes aside while it runs, and puts them back after."""
    from infiniop_py.torch import functional

    sizes = {("layer_norm", torch.float32): 1 << 20}
    monkeypatch.setattr(functional, "_TORCH_BELOW", sizes)
    seen = []
    monkeypatch.setattr(bench_host_overhead, "_run", lambda *args: seen.append(dict(functional._TORCH_BELOW)))
    bench_host_overhead.run(repeats=1)
    assert seen == [{}] and functional._TORCH_BELOW is sizes


def test_the_training_table_has_graph_columns_where_steps_were_replayed_from_graphs():
    """The CUDA report's graph columns (its timing needs a GPU: tests/torch/test_torch_cuda_graphs.py): a row per
    case with both speedups, a dash and the reason where a step could not be captured, and the models' median."""
    def row(name, speedup, **graph):
        return {"name": name, "dtype": "bfloat16", "shape": [2, 3], "torch_s": speedup * 1e-3, "ours_s": 1e-3,
                "speedup": speedup, **graph}
    report = {"machine": "a GPU", "device": "cuda:0", "threads": 1, "torch_version": "2.x",
              "keeps_freed_memory": False, "modules": [],
              "models": [row("net A", 0.5, torch_graph_s=3e-3, ours_graph_s=2e-3, graph_speedup=1.5),
                         row("net B", 0.7, graph_error="operation not permitted when stream is capturing")]}
    table = bench_training.format_table(report)
    assert "| model | dtype | shape | torch ms | ours ms | speedup | torch graph ms | ours graph ms | graph speedup |" \
        in table
    assert "| net A | bfloat16 | 2x3 | 0.50 | 1.00 | 0.50x | 3.00 | 2.00 | 1.50x |" in table
    assert "| net B | bfloat16 | 2x3 | 0.70 | 1.00 | 0.70x | - | - | - |" in table
    assert "not captured: net B bfloat16: operation not permitted" in table
    assert "median training-step speedup in CUDA graphs: 1.50x" in table
    del report["models"][0]["graph_speedup"], report["models"][1]["graph_error"]
    assert "graph" not in bench_training.format_table(report)  # the CPU's report: no graph columns
