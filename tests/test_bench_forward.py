"""`bench --forward` (infiniop_py/bench/forward.py): each case's three implementations compute the same forward on
the same arrays (so the times compare like with like), oneDNN's forward primitive gives the float64 forward of
its inputs, and the command line and table say what was timed."""

import argparse

import numpy as np
import pytest

import infiniop_py as ip
from infiniop_py.bench import cpu, forward, onednn
from test_bench_onednn import onednn_ready  # noqa: F401  (a fixture)


def test_each_forward_case_runs_ours_and_torch_on_the_same_arrays():
    torch = pytest.importorskip("torch")
    for op in forward.OPS:
        with ip.Handle("cpu") as handle:
            case, operator, ours, theirs, _ = forward.build_case(op, "float32", (5, 48), handle,
                                                                 np.random.default_rng(1))
            with operator:
                ours()
                expected = theirs()
        y = case.outputs[0]
        expected = expected[0] if isinstance(expected, tuple) else expected
        assert isinstance(expected, torch.Tensor)
        np.testing.assert_allclose(y, expected.numpy(), rtol=2e-5, atol=2e-5, err_msg=op)


def test_a_forward_case_of_an_op_without_a_forward_names_it():
    with ip.Handle("cpu") as handle, pytest.raises(ValueError, match="op: no forward benchmark of 'softmax'"):
        forward.build_case("softmax", "float32", (2, 8), handle, np.random.default_rng(0))


@pytest.mark.parametrize("kind,shape", [("layer_norm", (6, 40)), ("batch_norm", (4, 5, 9))])
def test_onednn_forward_gives_the_float64_forward_of_its_inputs(onednn_ready, kind, shape):  # noqa: F811
    rng = np.random.default_rng(2)
    channels = shape[1] if kind == "batch_norm" else shape[-1]
    x = cpu.aligned((3 + rng.standard_normal(shape)).astype(np.float32))
    weight, bias = rng.standard_normal(channels), rng.standard_normal(channels)
    reference = forward._onednn_forward(True, kind, "float32", shape, 1e-5, x, weight, bias)
    assert callable(reference), reference
    reference()
    src, dst, mean, variance, scale, shift = reference._arrays
    x64 = src.astype(np.float64)
    axes = (0, 2) if kind == "batch_norm" else (-1,)
    expected_mean, expected_var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
    channel = (lambda v: v[None, :, None]) if kind == "batch_norm" else (lambda v: v)
    expected = (x64 - expected_mean) / np.sqrt(expected_var + 1e-5) * channel(scale) + channel(shift)
    np.testing.assert_allclose(dst, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean, expected_mean.ravel(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(variance, expected_var.ravel(), rtol=1e-4, atol=1e-5)
    reference.close()


def test_forward_reports_say_forward_and_count_one_read_and_one_write(monkeypatch):
    monkeypatch.setattr(cpu, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(cpu, "ROW_SHAPES", [(4, 64)])
    monkeypatch.setattr(cpu, "_torch", lambda: None)
    monkeypatch.setattr(forward, "_torch", lambda: None)
    monkeypatch.setattr(cpu, "python_overheads", lambda repeats: dict.fromkeys(
        ("functional", "operator"), dict.fromkeys(("rms_norm",), 1e-6)))
    monkeypatch.setattr(cpu, "interleaved_medians", lambda runs, repeats: [0.01, 0.002][:len(runs)])
    args = argparse.Namespace(device="cpu", ops=["rms_norm"], dtypes=["float32"], repeats=1, quick=True, visits=1,
                              shapes="table", onednn=False, forward=True)
    report = cpu.run(args)
    (result,) = report["results"]
    assert report["direction"] == result["direction"] == "forward"
    assert result["ours_bandwidth"] == 2 * 4 * 64 * 4 / 0.002  # x read and y written
    assert "| rms_norm forward | float32 | 4x64 |" in cpu.format_table(report)


def test_forward_cli_refuses_what_it_cannot_time(capsys, monkeypatch):
    from infiniop_py import bench
    from infiniop_py.bench import nvidia

    def no_gpu(device_id):
        raise nvidia.Unavailable("no GPU in this test")

    monkeypatch.setattr(nvidia, "require_cuda", no_gpu)  # the GPU forwards go to nvidia.run, which needs one
    assert bench.main(["--forward", "--device", "nvidia"]) == 2
    assert "cannot benchmark nvidia:0: no GPU in this test" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--forward", "--ops", "rms_norm", "softmax"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # LayerNorm's from-input form is a backward form only
        bench.main(["--forward", "--ops", "rms_norm", "layer_norm_from_input"])
    assert "no forward of layer_norm_from_input (forwards: rms_norm, layer_norm, batch_norm)" in capsys.readouterr().err


def test_onednn_forward_reference_refuses_non_f32_statistics(onednn_ready):  # noqa: F811
    x = cpu.aligned(np.ones((2, 8), np.float32))
    with pytest.raises(ValueError, match="mean must be a contiguous float32 array"):
        onednn.ForwardReference("layer_norm", "float32", (2, 8), 1e-5, x, np.empty_like(x), np.empty(2, np.float64),
                                np.empty(2, np.float32), np.ones(8, np.float32), np.zeros(8, np.float32))
