"""scripts/torch_crossings.py times a module step, ours against torch.nn's, per op, dtype, thread count and size,
and names the size from which ours is the faster (functional._TORCH_BELOW's crossings)."""

from _scripts import load_script
from _torch_helpers import torch  # noqa: F401  (skips without torch)

from infiniop_py.torch import functional


def test_crossing_is_where_ours_stays_at_least_as_fast():
    crossing = load_script("torch_crossings").crossing
    sizes = (1, 2, 4, 8)
    assert crossing([0.5, 1.2, 0.9, 1.1], sizes) == 8
    assert crossing([0.5, 1.0, 1.3, 2.0], sizes) == 2
    assert crossing([1.1, 1.2, 1.3, 1.4], sizes) == 1
    assert crossing([1.1, 1.2, 1.3, 0.9], sizes) is None


def test_every_op_and_dtype_gets_a_row(monkeypatch, capsys):
    script = load_script("torch_crossings")
    monkeypatch.setattr(script, "SIZES", (2048, 4096))
    monkeypatch.setattr(functional, "_TORCH_BELOW", functional._TORCH_BELOW)  # restored after the script's {}
    assert script.main(["--threads", "1", "--rounds", "2", "--calls", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row[:3] for row in rows[1:]] == [[f" {op} ", f" {dtype} ", " 1 "]
                                            for op in ("layer_norm", "batch_norm")
                                            for dtype in ("float32", "bfloat16", "float16")]
    for row in rows[1:]:
        speedups = [float(cell.strip().rstrip("x")) for cell in row[3:5]]
        assert all(s > 0 for s in speedups)
        assert row[5].strip() in ("2048", "4096", "-")
