"""`python -m infiniop_py smoke`: a PASS row per op and dtype, and a one-line reason for a missing device."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import infiniop_py

from _helpers import OPS

OP_NAMES = tuple(case.name for case in OPS) + ("rms_norm", "layer_norm", "batch_norm")  # backwards, forwards

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_cli(*arguments):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-m", "infiniop_py", *arguments], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_smoke_passes_every_op_and_dtype():
    result = run_cli("smoke")

    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] and line.split()[0] in OP_NAMES]
    assert {(row[0], row[1]) for row in rows} == {(op, dtype) for op in OP_NAMES
                                                  for dtype in ("float32", "float16", "bfloat16")}
    assert len(rows) == 18 and all("PASS" in row for row in rows), result.stdout
    # The first line says which kernels ran: the ISA changes the CPU's speed severalfold.
    assert f"(CPU kernels {infiniop_py.cpu_isa()})" in result.stdout.splitlines()[0], result.stdout


def test_smoke_lists_a_forward_the_device_lacks_and_still_passes(monkeypatch, capsys):
    """An operator the library or device lacks (an InfiniCore install without the Ex functions, a CANN install
    without an aclnn operator): its rows say n/a, and the run passes on what the device has."""
    from infiniop_py import cli, errors

    class Missing(infiniop_py.RMSNorm):
        def __init__(self, handle, **arrays):
            raise errors.NotImplementedStatusError("RMSNorm: NOT_IMPLEMENTED")

    rms_norm_case = next(case for case in cli.CASES if case[0] == "rms_norm")
    monkeypatch.setattr(cli, "CASES", (rms_norm_case, ("rms_norm_missing", Missing) + rms_norm_case[2:]))
    assert cli.smoke("cpu", 0, 0) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("rms_norm")]
    assert [row[0] for row in rows] == ["rms_norm"] * 3 + ["rms_norm_missing"] * 3
    assert all("PASS" in row for row in rows[:3]) and all(row[-2:] == ["n/a", "-"] for row in rows[3:]), rows


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    process = subprocess.Popen([sys.executable, "-m", "infiniop_py", "smoke"], env=env, cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before the first line: as `infiniop-py smoke | head -0` would
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1
    assert b"Traceback" not in stderr and b"Exception ignored" not in stderr, stderr.decode()


def nvidia_gpu_present():
    """Whether --device nvidia has a device here: a GPU, or the CPU emulation of CUDA (.ci/sanitize)."""
    from _devices import EMULATED_CUDA
    return shutil.which("nvidia-smi") is not None or os.path.exists("/dev/nvidia0") or EMULATED_CUDA


def test_smoke_on_a_missing_device_gives_one_line_and_fails():
    if nvidia_gpu_present():
        pytest.skip("an NVIDIA device is present (a GPU or the CPU emulation of CUDA): --device nvidia is not a "
                    "missing device here")
    result = run_cli("smoke", "--device", "nvidia")

    assert result.returncode == 2
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and "nvidia" in lines[0], lines


def test_smoke_takes_cuda_and_any_case_for_nvidia():
    """--device cuda is --device nvidia (issue 55): the same output, which names nvidia."""
    if nvidia_gpu_present():
        pytest.skip("an NVIDIA device is present (a GPU or the CPU emulation of CUDA): smoke --device cuda would "
                    "run the whole check")
    expected = run_cli("smoke", "--device", "nvidia")
    for alias in ("cuda", "CUDA", "NVIDIA"):
        result = run_cli("smoke", "--device", alias)
        assert (result.returncode, result.stdout, result.stderr) == (expected.returncode, expected.stdout,
                                                                     expected.stderr), alias
    assert expected.returncode == 2 and "device nvidia:0 is not available" in expected.stdout, expected.stdout
    unknown = run_cli("smoke", "--device", "gpu")
    assert unknown.returncode == 2 and "invalid choice: 'gpu'" in unknown.stderr, unknown.stderr


def test_bench_takes_cuda_for_nvidia():
    from _devices import nvidia_unusable_reason

    if nvidia_unusable_reason() is None:
        pytest.skip("an NVIDIA GPU is usable here: bench --device cuda would run")
    result = run_cli("bench", "--device", "cuda")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("infiniop-py bench: cannot benchmark nvidia:0: "), result.stderr


def test_gpu_bench_without_a_usable_gpu_fails_fast_and_says_why():
    from _devices import nvidia_unusable_reason

    if nvidia_unusable_reason() is None:
        pytest.skip("an NVIDIA GPU is usable here: bench --device nvidia would run")
    result = run_cli("bench", "--device", "nvidia")

    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "nvidia" in lines[0] and ": " in lines[0].split("nvidia:0", 1)[1], lines
    assert result.stdout == ""


def test_help_gives_one_clean_line_per_command():
    result = run_cli("--help")
    assert result.returncode == 0
    assert "``" not in result.stdout and "smoke" in result.stdout and "bench" in result.stdout
    described = [line.split(None, 1) for line in result.stdout.splitlines() if line.startswith("    ")]
    assert {words[0] for words in described} == {"smoke", "bench"}
    smoke_help = run_cli("smoke", "--help").stdout
    assert "{cpu,nvidia,ascend}" in smoke_help  # only the backends this project builds
    assert "cuda: nvidia" in smoke_help  # and the alias it takes


def test_bench_plot_without_matplotlib_fails_before_timing(monkeypatch):
    import builtins

    from infiniop_py import bench

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.setattr(bench.cpu, "run", lambda args: pytest.fail("timed before checking for matplotlib"))
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--plot", "out.png"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("command, option, value, minimum", [
    ("smoke", "--device-id", "-1", 0), ("smoke", "--seed", "-2", 0), ("bench", "--device-id", "-1", 0),
    ("bench", "--repeats", "0", 1), ("bench", "--visits", "0", 1), ("bench", "--repeats", "-3", 1)])
def test_counts_below_their_minimum_are_refused_naming_the_option(monkeypatch, capsys, command, option, value,
                                                                   minimum):
    """bench --visits 0 raised ZeroDivisionError after the timing; negative repeats ran with a hidden minimum; a
    negative seed gave numpy's traceback (2026-12-08)."""
    from infiniop_py import bench, cli
    monkeypatch.setattr(bench.cpu, "run", lambda args: pytest.fail("timed before checking its arguments"))
    monkeypatch.setattr(cli, "smoke", lambda *args: pytest.fail("ran before checking its arguments"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, option, value])
    assert exit_info.value.code == 2
    assert f"argument {option}: must be at least {minimum}, not {value}" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_bench_output_that_cannot_be_written_fails_before_timing(monkeypatch, capsys, tmp_path, option):
    """--json to a missing folder raised FileNotFoundError after minutes of timing (2026-12-08)."""
    from infiniop_py import bench
    monkeypatch.setattr(bench.cpu, "run", lambda args: pytest.fail("timed before checking the output path"))
    for path in (tmp_path / "missing" / "out.png", tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            bench.main([option, str(path)])
        assert exit_info.value.code == 2
        assert f"{option}: cannot write {path}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # the check leaves nothing behind

