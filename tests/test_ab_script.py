"""scripts/ab.py times two builds (or ISA paths) of the library on one case in alternating processes and says
whether their gradients have the same bits."""

import json

import pytest

from _scripts import load_script


@pytest.mark.parametrize("op, forward", [("rms_norm", False), ("layer_norm", True)])
def test_one_library_against_itself(capsys, op, forward):
    arguments = ["installed", "installed", "--op", op, "--dtype", "float32", "--shape", "8x96",
                 "--processes", "2", "--calls", "3", "--threads", "1", "--after-copy", "--json"]
    assert load_script("ab").main(arguments + ["--forward"] * forward) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["case"] == f"{op} float32 8x96" and report["after_copy"] is True and report["forward"] is forward
    assert report["sides"] == {"A": "installed", "B": "installed"} and list(report["samples"]) == ["A", "B"]
    for samples in report["samples"].values():
        assert len(samples) == 2
        for sample in samples:
            assert 0 < sample["min_s"] <= sample["median_s"] and sample["copy_gbs"] > 0
    assert report["b_over_a_median"] > 0 and report["b_over_a_min"] > 0
    assert report["same_bits"], report["samples"]  # one library, the same seeded data: the same outputs


def test_the_summary_and_different_bits(monkeypatch):
    module = load_script("ab")
    times = {"A": [2.0, 4.0, 3.0], "B": [1.0, 3.0, 1.5]}
    order = []

    def sample(side, args):
        order.append(side)
        return {"median_s": times[side][order.count(side) - 1], "min_s": 0.5,
                "copy_gbs": 40.0 + len(order), "bits": "same" if side == "A" else "other"}

    monkeypatch.setattr(module, "_sample", sample)
    args = module.argparse.Namespace(a="A", b="B", processes=3, op="rms_norm", dtype="float32", shape="4x4",
                                     threads=2, after_copy=False, forward=False, device="cpu",
                                     layout="channels_first")
    report = module.compare(args)
    assert order == ["A", "B", "B", "A", "A", "B"]  # ABBA...: neither side always runs first
    assert report["b_over_a_median"] == pytest.approx(1.5 / 3.0)
    assert report["b_over_a_min"] == pytest.approx(1.0 / 2.0)
    assert report["copy_gbs"] == [41.0, 46.0]
    assert not report["same_bits"]
    assert "DIFFERENT BITS" in module.format_report(report)


def test_a_directory_without_the_library_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no libinfiniop.so"):
        load_script("ab")._environment(f"{tmp_path}:avx2", 2)


def test_a_gpu_report_names_the_layout_and_its_timing(monkeypatch):
    module = load_script("ab")
    monkeypatch.setattr(module, "_sample", lambda side, args: {"median_s": 1e-5, "min_s": 1e-5, "copy_gbs": 4000.0,
                                                               "bits": "same"})
    args = module.argparse.Namespace(a="A", b="B", processes=1, op="batch_norm", dtype="float16", shape="8x4x7x7",
                                     threads=2, after_copy=False, forward=False, device="nvidia",
                                     layout="channels_last")
    report = module.compare(args)
    assert report["case"] == "batch_norm float16 8x4x7x7 channels_last" and report["same_bits"]
    assert module.format_report(report).splitlines()[0] == ("batch_norm float16 8x4x7x7 channels_last on the GPU, "
                                                            "CUDA graphs of 10 calls")
