"""The benchmark's oneDNN column (infiniop_py/bench/onednn.py) times the same computation as ours: its
LayerNorm and BatchNorm backward, bound to the benchmark's buffers, give the float64 gradients of those inputs. The test extra installs
oneDNN wherever its wheels exist (Linux x86-64); there the column must build, elsewhere it is left out."""

import argparse
import platform
import sys

import numpy as np
import pytest

from infiniop_py.bench import cpu as bench, onednn

HAS_WHEELS = sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.fixture(scope="module")
def onednn_ready():
    usable, why = onednn.available()
    if not usable and not HAS_WHEELS:
        pytest.skip(f"oneDNN's PyPI wheels are Linux x86-64 only: {why}")
    assert usable, why  # the test extra installs it here
    return why


@pytest.mark.parametrize("op,shape", [("layer_norm", (6, 40)), ("layer_norm_from_input", (3, 72)),
                                      ("batch_norm", (4, 5, 9))])
def test_onednn_gives_our_gradients_on_the_same_buffers(onednn_ready, op, shape):
    import infiniop_py as ip

    with ip.Handle("cpu") as handle:
        _, operator, ours, _, reference = bench.build_case(op, "float32", shape, handle,
                                                             np.random.default_rng(0), with_onednn=True)
        with operator:
            assert callable(reference), reference
            ours()
            reference()
    src, diff_dst, mean, variance, scale, diff_src, diff_scale, diff_shift = reference._arrays
    # float64 gradients of the same rounded inputs, as oneDNN's formulas define them
    x, dy, w = (a.astype(np.float64) for a in (src, diff_dst, scale))
    axes = (0, 2) if op == "batch_norm" else (-1,)
    expand = (lambda v: v[None, :, None]) if op == "batch_norm" else (lambda v: v[:, None])
    invstd = 1 / np.sqrt(variance.astype(np.float64) + (0.0 if op == "batch_norm" else 1e-5))
    xhat = (x - expand(mean.astype(np.float64))) * expand(invstd)
    if op == "batch_norm":
        count = shape[0] * shape[2]
        gb, gw = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
        dx = expand(w * invstd) * (dy - expand(gb) / count - xhat * expand(gw) / count)
    else:
        gb, gw = dy.sum(axis=0), (dy * xhat).sum(axis=0)
        g = dy * w
        dx = expand(invstd) * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(diff_src, dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(diff_scale, gw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(diff_shift, gb, rtol=1e-4, atol=1e-4)


def test_report_has_the_onednn_column_or_says_why_not(monkeypatch, onednn_ready):
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(bench, "BATCH_SHAPES", [(2, 3, 8)])
    monkeypatch.setattr(bench, "_torch", lambda: None)
    monkeypatch.setattr(bench, "python_overheads", lambda repeats: dict.fromkeys(
        ("functional", "operator"), dict.fromkeys(("rms_norm", "layer_norm", "batch_norm"), 1e-6)))
    args = argparse.Namespace(device="cpu", ops=["rms_norm", "batch_norm"], dtypes=["float32"], repeats=2,
                              quick=True, visits=1, shapes="table", onednn=True)
    monkeypatch.setattr(bench, "ROW_SHAPES", [(2, 64)])
    report = bench.run(args)
    assert report["onednn"] == onednn_ready and report["onednn_unavailable"] is None
    by_op = {r["op"]: r for r in report["results"]}
    assert by_op["batch_norm"]["onednn_s"] > 0 and by_op["rms_norm"]["onednn_s"] is None
    # ours is timed as a bare C call too where oneDNN's (a bare C call) is timed, and only there
    assert by_op["batch_norm"]["ours_native_s"] > 0 and by_op["rms_norm"]["ours_native_s"] is None
    table = bench.format_table(report)
    assert "| oneDNN ms | vs oneDNN |" in table and "median speedup over oneDNN" in table
    assert "| ours ms | ours C ms |" in table

    args.onednn = False
    report = bench.run(args)
    assert report["onednn"] is None and "no oneDNN column: --no-onednn" in bench.format_table(report)


def test_unavailable_onednn_says_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setattr(onednn, "_roots", lambda: [tmp_path])
    monkeypatch.setattr(onednn, "library", onednn.library.__wrapped__)  # not the cached build
    usable, why = onednn.available()
    assert not usable and "pip install 'infiniop-py[onednn]'" in why and str(tmp_path) in why
