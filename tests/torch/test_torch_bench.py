"""bench --training (infiniop_py/bench/training.py) on tiny shapes: every model and module is timed with torch's
norms and with replace_norms, and the report says how many norms were replaced; bench --sync-batch-norm
(bench/distributed.py) with its 2 gloo processes on a small batch."""

import json

from _torch_helpers import torch  # noqa: F401  (skips without torch)

from infiniop_py import bench
from infiniop_py.bench import distributed as bench_distributed, training as bench_training


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
                                                      "depthwise conv net (3x BatchNorm2d)")
                           for dtype in ("float32", "bfloat16")}
    assert {r["replaced"] for r in models.values() if r["name"].startswith("transformer")} == {8}
    assert {r["replaced"] for r in models.values() if r["name"].startswith("depthwise")} == {3}
    assert set(modules) == {(name, dtype) for name in ("RMSNorm", "LayerNorm", "BatchNorm2d")
                            for dtype in ("float32", "bfloat16")}
    assert all(r["replaced"] == 1 and r["torch_s"] > 0 and r["ours_s"] > 0 for r in modules.values())
    table = capsys.readouterr().out
    assert "median training-step speedup" in table and "| RMSNorm | bfloat16 | 2x3x16 |" in table


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
