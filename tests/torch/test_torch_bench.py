"""bench --training (infiniop_py/bench_training.py) on tiny shapes: every model and module is timed with torch's
norms and with replace_norms, and the report says how many norms were replaced."""

import json

from _torch_helpers import torch  # noqa: F401  (skips without torch)

from infiniop_py import bench, bench_training


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
