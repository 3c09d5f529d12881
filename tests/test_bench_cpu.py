"""The CPU benchmark's timing (infiniop_py/bench/cpu.py): the copy, our op and torch's op are timed in interleaved rounds,
and each case's fractions are taken against the copy of its own rounds, so a memory bandwidth that drifts during a
run on a shared machine does not drift the fractions."""

import argparse
import collections
import platform
import statistics
import types

import numpy as np
import pytest

import infiniop_py
from infiniop_py.bench import cpu as bench, timing
from _helpers import run_python_with_isa


class FakeClock:
    """A perf_counter that only moves when a fake run says how long it took."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def fake_runs(clock, log, durations):
    """name -> a call that logs its name and advances the clock by its next duration."""
    def make(name):
        remaining = iter(durations[name])

        def run():
            log.append(name)
            clock.now += next(remaining)
        return run
    return [make(name) for name in durations]


def test_rounds_time_each_in_turn_right_after_untimed_calls_of_itself(monkeypatch):
    clock, log = FakeClock(), []
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    # Each round calls each UNTIMED_CALLS times and then once, timed; the untimed calls must not count (9 s here).
    untimed = [9.0] * timing.UNTIMED_CALLS
    durations = {"copy": untimed + [0.030] + untimed + [0.010] + untimed + [0.020],
                 "ours": untimed + [0.001] + untimed + [0.003] + untimed + [0.002],
                 "torch": untimed + [0.005] + untimed + [0.004] + untimed + [0.006]}

    medians = timing.interleaved_medians(fake_runs(clock, log, durations), repeats=3, min_seconds=0)

    names, calls = list(durations), timing.UNTIMED_CALLS + 1
    assert timing.UNTIMED_CALLS >= 2  # one was not enough to get past the copy's dirty lines (timing.py says)
    assert log == [names[index] for order in timing.balanced_orders(3)[:3] for index in order for _ in range(calls)]
    assert medians == [pytest.approx(0.020), pytest.approx(0.002), pytest.approx(0.005)]


@pytest.mark.parametrize("count", range(1, 8))
def test_balanced_orders_put_each_run_right_after_each_other_equally_often(count):
    orders = timing.balanced_orders(count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    followers = collections.Counter((a, b) for order in orders for a, b in zip(order, order[1:]))
    assert set(followers) == {(a, b) for a in range(count) for b in range(count) if a != b}
    assert len(set(followers.values())) <= 1, followers


def test_no_run_comes_right_after_the_same_run_in_every_round(monkeypatch):
    """The fixed order copy, ours, torch put ours behind the copy in every round."""
    clock, log = FakeClock(), []
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    durations = {name: [0.001] * 100 for name in ("copy", "ours", "torch", "onednn")}
    timing.interleaved_medians(fake_runs(clock, log, durations), repeats=8, min_seconds=0)
    calls = log[::timing.UNTIMED_CALLS + 1]  # one entry per run's turn
    behind_copy = collections.Counter(b for a, b in zip(calls, calls[1:]) if a == "copy")
    assert sorted(behind_copy) == ["onednn", "ours", "torch"] and max(behind_copy.values()) < 8, behind_copy


def test_rounds_go_on_until_each_has_run_min_seconds_and_stop_at_twenty_times_repeats(monkeypatch):
    clock, log = FakeClock(), []
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    durations = {"copy": [0.010] * 200, "ours": [0.001] * 200}

    timing.interleaved_medians(fake_runs(clock, log, durations), repeats=2, min_seconds=0.0055)
    # ours, the faster, sets the count: 6 timed rounds of 1 ms reach 5.5 ms.
    turn = timing.UNTIMED_CALLS + 1
    assert log == (["copy"] * turn + ["ours"] * turn + ["ours"] * turn + ["copy"] * turn) * 3

    log.clear()
    timing.interleaved_medians(fake_runs(clock, log, durations), repeats=2, min_seconds=10)
    assert len(log) == 2 * turn * 40 and log.count("ours") == turn * 40


def test_run_sets_each_case_against_its_own_copy(monkeypatch):
    torch = pytest.importorskip("torch", reason="the report's torch columns need torch")
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch.get_num_threads()))  # run() sets torch's threads from it
    monkeypatch.setattr(bench, "ROW_SHAPES", [(4, 64), (2, 128), (8, 32)])
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(bench, "python_overheads", lambda repeats: dict.fromkeys(  # timed elsewhere; slow here
        ("functional", "operator"), dict.fromkeys(("rms_norm", "layer_norm", "batch_norm"), 1e-6)))
    args = argparse.Namespace(device="cpu", ops=["rms_norm"], dtypes=["float32"], repeats=3, quick=False, visits=2,
                              shapes="table", onednn=False)

    report = bench.run(args)

    results = report["results"]
    assert [r["shape"] for r in results] == [[4, 64], [2, 128], [8, 32]]
    assert all(r["copy_bandwidth"] > 0 and r["ours_bandwidth"] > 0 and r["torch_bandwidth"] > 0 for r in results)
    assert all(len(r["visits"]) == 2 for r in results)
    assert report["copy_bandwidth"] == statistics.median(r["copy_bandwidth"] for r in results)
    assert report["copy_method"] == ("torch copy of 1 MiB, interleaved with each case; median over 2 visits, "
                                     "then over cases")

    table = bench.format_table(report)
    rows = [line for line in table.splitlines() if line.startswith("| rms_norm")]
    assert len(rows) == len(results)
    for row, r in zip(rows, results):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[7:] == [f"{r['ours_bandwidth'] / r['copy_bandwidth']:.2f}",
                             f"{r['torch_bandwidth'] / r['copy_bandwidth']:.2f}", f"{r['copy_bandwidth'] / 1e9:.1f}"]


def test_visits_go_over_all_cases_in_turn_on_fresh_data_and_report_medians(monkeypatch):
    monkeypatch.setattr(bench, "ROW_SHAPES", [(4, 64), (2, 128)])
    monkeypatch.setattr(bench, "COPY_BYTES", 1 << 20)
    monkeypatch.setattr(bench, "_torch", lambda: None)  # the copy and ours only
    monkeypatch.setattr(bench, "python_overheads", lambda repeats: dict.fromkeys(
        ("functional", "operator"), dict.fromkeys(("rms_norm", "layer_norm", "batch_norm"), 1e-6)))
    built, timed = [], []
    real_build = bench.build_case

    def build_case(op, dtype, shape, handle, rng, with_onednn):
        case = real_build(op, dtype, shape, handle, rng, with_onednn)
        built.append((shape, case[0].random((2,)).tobytes()))  # the case's data comes from rng
        return case
    # Scripted medians per call, (copy_s, ours_s), in the order the calls come: visit-major.
    # Medians differ from means and from the best visit here.
    scripted = iter([(0.010, 0.004), (0.010, 0.001), (0.040, 0.002), (0.020, 0.009), (0.020, 0.009), (0.010, 0.002)])

    def medians(runs, repeats):
        timed.append(len(runs))
        return list(next(scripted))
    monkeypatch.setattr(bench, "build_case", build_case)
    monkeypatch.setattr(bench, "interleaved_medians", medians)
    args = argparse.Namespace(device="cpu", ops=["rms_norm"], dtypes=["float32"], repeats=3, quick=False, visits=3,
                              shapes="table", onednn=False)

    report = bench.run(args)

    assert [shape for shape, _ in built] == [(4, 64), (2, 128)] * 3  # every case once per visit, in turn
    assert timed == [2] * 6  # the copy and ours, timed together in each visit
    assert built[0][1] == built[2][1] == built[4][1] and built[0][1] != built[1][1]  # same data per case
    first, second = report["results"]
    assert first["ours_s"] == 0.004 and first["copy_bandwidth"] == 2 * (1 << 20) / 0.020  # medians of 3 visits
    assert second["ours_s"] == 0.002 and second["copy_bandwidth"] == 2 * (1 << 20) / 0.010
    assert first["ours_bandwidth"] == 3 * 4 * 64 * 4 / 0.004 and first["torch_s"] is None
    assert [v["ours_s"] for v in first["visits"]] == [0.004, 0.002, 0.009] and report["visits"] == 3


def test_cpu_report_table_uses_each_case_copy():
    results = [
        {"op": "rms_norm", "dtype": "float32", "shape": [4096, 4096], "ours_s": 6e-3, "torch_s": 1.5e-1,
         "ours_bandwidth": 30e9, "torch_bandwidth": 1.2e9, "copy_bandwidth": 40e9},
        {"op": "layer_norm", "dtype": "bfloat16", "shape": [1, 1048576], "ours_s": 1e-3, "torch_s": None,
         "ours_bandwidth": 6e9, "torch_bandwidth": None, "copy_bandwidth": 60e9},
    ]
    report = {"machine": "CPU under test", "threads": 2, "copy_bandwidth": 50e9, "copy_method": "copy method",
              "torch_version": "2.13.0", "functional_overhead_s": 3e-6,
              "functional_overheads_s": {"rms_norm": 3e-6}, "operator_overheads_s": {"rms_norm": 4.25e-6},
              "results": results}

    lines = bench.format_table(report).splitlines()

    assert lines[0] == "machine: CPU under test; threads: 2; torch 2.13.0" and lines[1] == "copy bandwidth (copy method): 50.0 GB/s"
    header = lines.index("| op | dtype | shape | ours ms | torch ms | speedup | ours GB/s | ours/copy | torch/copy "
                         "| copy GB/s |")
    assert lines[header + 1] == "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[header + 2:header + 4]]
    assert rows == [
        ["rms_norm", "float32", "4096x4096", "6.000", "150.000", "25.00x", "30.0", "0.75", "0.03", "40.0"],
        ["layer_norm", "bfloat16", "1x1048576", "1.000", "-", "-", "6.0", "0.10", "-", "60.0"],
    ]
    assert lines[-2:] == ["functional API Python overhead per cached call: rms_norm 3.0 us",
                          "operator object Python overhead per call: rms_norm 4.2 us"]


def test_peers_are_set_against_our_bare_call_and_torch_against_the_operator_call():
    row = {"dtype": "float32", "ours_bandwidth": 6e9, "torch_bandwidth": 2e9, "copy_bandwidth": 10e9}
    results = [
        {**row, "op": "layer_norm", "shape": [8, 64], "ours_s": 2e-3, "ours_native_s": 1e-3, "torch_s": 3e-3,
         "onednn_s": 1.5e-3},
        {**row, "op": "rms_norm", "shape": [8, 64], "ours_s": 2e-3, "ours_native_s": None, "torch_s": 4e-3,
         "onednn_s": None},
    ]
    report = {"machine": "CPU under test", "threads": 2, "copy_bandwidth": 10e9, "torch_version": "2.13.0",
              "onednn": "oneDNN 3.2.0", "functional_overhead_s": None, "results": results}

    lines = bench.format_table(report).splitlines()

    header = next(i for i, line in enumerate(lines) if line.startswith("| op |"))
    columns = [cell.strip() for cell in lines[header].strip("|").split("|")]
    rows = [dict(zip(columns, (cell.strip() for cell in line.strip("|").split("|"))))
            for line in lines[header + 2:header + 4]]
    assert columns[3:5] == ["ours ms", "ours C ms"]
    assert [r["ours C ms"] for r in rows] == ["1.000", "-"]
    assert [r["speedup"] for r in rows] == ["1.50x", "2.00x"]  # torch's time over the operator call's
    assert [r["vs oneDNN"] for r in rows] == ["1.50x", "-"]  # oneDNN's time over the bare call's
    assert [r["vs best"] for r in rows] == ["1.50x", "2.00x"]
    assert "median speedup over oneDNN: 1.50x; slowest case: 1.50x" in lines
    assert any(line.startswith("ours ms and vs torch: the operator object's call") for line in lines)


def test_python_overheads_time_both_ways_of_calling_each_op(monkeypatch):
    calls = []
    real_median = bench.median_seconds

    def counted_median(run, repeats, min_seconds):
        calls.append(run)
        return real_median(run, 3, 0.0)

    monkeypatch.setattr(bench, "median_seconds", counted_median)
    overheads = bench.python_overheads(repeats=3, rounds=2, ops=("rms_norm", "batch_norm"))
    assert set(overheads) == {"functional", "operator"}
    assert all(set(by_op) == {"rms_norm", "batch_norm"} for by_op in overheads.values())
    assert all(isinstance(seconds, float) and abs(seconds) < 1.0 for by_op in overheads.values()
               for seconds in by_op.values())
    assert len(calls) == 2 * 2 * 2 * 2  # rounds x ops x ways x (the call, then the native call)


def _machine_line(isa_variable):
    """bench's machine line in a new process (the library picks its ISA once per process)."""
    return run_python_with_isa("from infiniop_py.bench import timing; print(timing.machine_description())",
                               isa_variable)[0]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA variants are built on x86-64 only")
def test_the_machine_line_names_the_isa_the_cpu_kernels_ran_with():
    best = _machine_line(None)
    assert best.endswith(f", CPU kernels {infiniop_py.cpu_isa()}")
    description = best.rsplit(", CPU kernels ", 1)[0]
    assert _machine_line("generic") == description + ", CPU kernels generic (INFINIOP_CPU_ISA=generic)"
    # A misspelt name is ignored by the library, so the line keeps the best ISA and shows what was asked.
    assert _machine_line("AVX2") == best + " (INFINIOP_CPU_ISA=AVX2)"


def test_plot_draws_every_reference_that_was_timed(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    drawn = {}
    real_savefig = plt.Figure.savefig

    def savefig(figure, path, **kwargs):  # keep what the plot put on its axes
        axes = figure.axes[0]
        drawn["legend"] = [text.get_text() for text in axes.get_legend().get_texts()]
        drawn["notes"] = [child.get_text() for child in axes.texts]
        return real_savefig(figure, path, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", savefig)
    results = [
        {"op": "layer_norm", "dtype": "float32", "shape": [8, 64], "ours_s": 1e-3, "torch_s": 3e-3,
         "onednn_s": 2e-3, "ours_bandwidth": 6e9, "torch_bandwidth": 2e9, "copy_bandwidth": 10e9},
        {"op": "rms_norm", "dtype": "float32", "shape": [8, 64], "ours_s": 1e-3, "torch_s": 5e-3,
         "onednn_s": None, "ours_bandwidth": 6e9, "torch_bandwidth": 1.2e9, "copy_bandwidth": 10e9},
    ]
    report = {"machine": "CPU under test", "threads": 2, "copy_bandwidth": 10e9, "torch_version": "2.13.0",
              "onednn": "oneDNN 3.2.0", "results": results}
    path = tmp_path / "plot.png"
    bench.plot(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert drawn["legend"] == ["infiniop-py", "torch 2.13.0", "oneDNN 3.2.0"]
    assert drawn["notes"] == ["3.0x", "5.0x"]  # the speedup over torch above each case


@pytest.mark.parametrize("name", bench.SHAPE_SETS)
def test_each_shape_set_gives_row_ops_its_rows_and_batch_norm_its_batches(name):
    rows, batches = bench.shapes_of(name)
    planned = list(bench.cases(["rms_norm", "layer_norm_from_input", "batch_norm"], ["float32", "bfloat16"], False,
                               name))
    expected = [(op, dtype, shape) for op, shapes in (("rms_norm", rows), ("layer_norm_from_input", rows),
                                                       ("batch_norm", batches))
                for dtype in ("float32", "bfloat16") for shape in shapes]
    assert planned == expected
    quick = list(bench.cases(["rms_norm", "batch_norm"], ["float32"], True, name))
    assert quick == [("rms_norm", "float32", rows[0]), ("batch_norm", "float32", batches[0])]


@pytest.mark.parametrize("shape", [(4, 5, 9), (3, 4, 5, 6), (2, 3, 2, 3, 4)])
def test_a_batch_norm_case_of_any_rank_gives_torchs_gradients(shape):
    # The running statistics are per channel (axis 1) whatever the rank, as ab.py's 4-D cases need.
    pytest.importorskip("torch")
    with infiniop_py.Handle("cpu") as handle:
        case, operator, ours, theirs, _ = bench.build_case("batch_norm", "float32", shape, handle,
                                                           np.random.default_rng(3))
        with operator:
            ours()
            expected = theirs()
    for got, want in zip(case.outputs, expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
