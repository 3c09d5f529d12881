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
                                     layout="channels_first", cases=None)
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
                                     layout="channels_last", cases=None)
    report = module.compare(args)
    assert report["case"] == "batch_norm float16 8x4x7x7 channels_last" and report["same_bits"]
    assert module.format_report(report).splitlines()[0] == ("batch_norm float16 8x4x7x7 channels_last on the GPU, "
                                                            "CUDA graphs of 10 calls")


def test_a_cases_file_is_timed_in_each_process_and_reported_per_case(tmp_path, capsys):
    """--cases: every case in each process (a GPU session pays torch's and CUDA's start once a side), one report a
    case in the file's order, with the same bits from one library run twice."""
    cases = tmp_path / "cases"
    cases.write_text("# two cases\n--op rms_norm --dtype float32 --shape 8x96\n\n"
                     "--op layer_norm --dtype float32 --shape 4x64 --forward\n")
    arguments = ["installed", "installed", "--cases", str(cases), "--processes", "2", "--calls", "3",
                 "--threads", "1", "--json"]
    assert load_script("ab").main(arguments) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [(r["case"], r["forward"]) for r in reports] == [("rms_norm float32 8x96", False),
                                                            ("layer_norm float32 4x64", True)]
    for report in reports:
        assert [len(samples) for samples in report["samples"].values()] == [2, 2]
        assert report["same_bits"] and report["b_over_a_median"] > 0


def test_a_failing_case_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    module = load_script("ab")
    cases = tmp_path / "cases"
    cases.write_text("--op rms_norm --dtype float32 --shape 4x4\n--op batch_norm --dtype float16 --shape 2x3x4\n")

    def child(args):
        if args.op == "batch_norm":
            raise ValueError("no such kernel")
        return {"median_s": 1.0, "min_s": 1.0, "copy_gbs": 1.0, "bits": args.shape}

    monkeypatch.setattr(module, "_child", child)
    args = module.argument_parser().parse_args(["--child", "--cases", str(cases)])
    samples = module._child_cases(args)
    assert samples[0]["median_s"] == 1.0 and samples[1] == {"error": "ValueError: no such kernel"}
    monkeypatch.setattr(module, "_sample", lambda side, args: samples)
    args = module.argument_parser().parse_args(["A", "B", "--cases", str(cases), "--processes", "1"])
    ok, failed = module.compare(args)
    assert ok["case"] == "rms_norm float32 4x4" and ok["b_over_a_median"] == 1.0 and ok["same_bits"]
    assert failed["case"] == "batch_norm float16 2x3x4 channels_first" and failed["error"] == "ValueError: no such kernel"
    assert module.format_report(failed) == ("batch_norm float16 2x3x4 channels_first: failed: "
                                            "ValueError: no such kernel")


@pytest.mark.parametrize("options, message", [
    (["--cases", "FILE", "--op", "rms_norm"], "--cases replaces"),
    (["--op", "rms_norm", "--dtype", "float32"], "are required"),
])
def test_cases_or_one_case_but_not_both(capsys, options, message):
    with pytest.raises(SystemExit):
        load_script("ab").main(["A", "B", *options])
    assert message in capsys.readouterr().err


def test_a_bad_line_of_a_cases_file_fails_before_any_process_starts(tmp_path, monkeypatch, capsys):
    module = load_script("ab")
    cases = tmp_path / "cases"
    cases.write_text("--op rms_norm --dtype float32 --shape 4x4\n--op rms_norm --dtype float8 --shape 4x4\n")
    monkeypatch.setattr(module, "_sample", lambda side, args: pytest.fail("a process started"))
    with pytest.raises(SystemExit):
        module.main(["A", "B", "--cases", str(cases)])
    assert "float8" in capsys.readouterr().err
