"""The Ascend backend against an emulation of the documented CANN contract (tests/ascend_emulation).

The emulation is a test-only host library, built here with the system C++ compiler and found by the
backend through $ASCEND_TOOLKIT_HOME. The backend resolves CANN once per process, so every scenario runs
tests/ascend_emulation/ascend_suite.py in a child process and the tests here check what it reports.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
EMULATION = HERE / "ascend_emulation"
sys.path.insert(0, str(EMULATION))
import ascend_suite as suite  # noqa: E402

TOLERANCE = suite.TOLERANCE


def library_dir():
    configured = os.environ.get("INFINIOP_PY_LIBRARY_DIR")
    candidates = [Path(configured)] if configured else []
    candidates += [HERE.parent / "infiniop_py" / "lib", HERE.parent / "build" / "install" / "lib"]
    for candidate in candidates:
        if (candidate / "libinfiniop.so").exists() and (candidate / "libinfinirt.so").exists():
            return candidate
    pytest.skip("native libraries not built (xmake && xmake install -o build/install)")


def run_suite(env_changes):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND")}
    env.update(env_changes)
    done = subprocess.run(
        [sys.executable, str(EMULATION / "ascend_suite.py"), str(library_dir())],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def emulated_cann(tmp_path_factory):
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler to build the CANN emulation")
    root = tmp_path_factory.mktemp("cann_emulation")
    subprocess.run(["sh", str(EMULATION / "build.sh"), str(root)], check=True)
    return root


@pytest.fixture(scope="module")
def reused(emulated_cann):
    """Results with executors planned once and re-pointed on each run (CANN's repeatable executors)."""
    return run_suite({"ASCEND_TOOLKIT_HOME": str(emulated_cann)})


@pytest.fixture(scope="module")
def replanned(emulated_cann):
    """Results where aclSetAclOpExecutorRepeatable fails, so the backend plans every call on every run."""
    return run_suite({"ASCEND_TOOLKIT_HOME": str(emulated_cann), "ASCEND_EMULATION_NO_REPEATABLE": "1"})


CASES = [(name, expected) for name, _, expected in suite.cases()]


def check_case(results, name, expected):
    result = results[name]
    assert result["status"] == expected, result
    if expected == 0:
        dtype = name.split("/")[1]
        assert result["err"] <= TOLERANCE[dtype], result


@pytest.mark.parametrize("name,expected", CASES, ids=[c[0] for c in CASES])
def test_operator_with_reused_executors(reused, name, expected):
    check_case(reused, name, expected)


@pytest.mark.parametrize("name,expected", CASES, ids=[c[0] for c in CASES])
def test_operator_with_replanned_executors(replanned, name, expected):
    check_case(replanned, name, expected)


def test_runtime(reused):
    assert reused["device_count"] == [0, 1]
    assert reused["set_device_out_of_range"] == 6  # DEVICE_NOT_FOUND
    assert reused["set_device"] == 0
    runtime = reused["runtime"]
    assert runtime.pop("roundtrip") and runtime.pop("zeroed")
    assert all(status == 0 for status in runtime.values()), runtime


def test_without_cann_no_device_and_a_reason(tmp_path):
    """No CANN: zero devices, DEVICE_NOT_FOUND (6) on set device, and the probe names the missing library."""
    empty = tmp_path / "no_cann"
    (empty / "lib64").mkdir(parents=True)
    results = run_suite({"ASCEND_TOOLKIT_HOME": str(empty), "LD_LIBRARY_PATH": ""})
    assert results["device_count"] == [0, 0]
    assert results["set_device"] == 6

    probe = subprocess.run(
        [sys.executable, "-c", "from infiniop_py._ascend import missing_cann_reason; print(missing_cann_reason())"],
        env={**os.environ, "ASCEND_TOOLKIT_HOME": str(empty), "LD_LIBRARY_PATH": "",
             "PYTHONPATH": str(HERE.parent)},
        capture_output=True, text=True, check=True,
    )
    assert "libascendcl.so" in probe.stdout and str(empty / "lib64" / "libascendcl.so") in probe.stdout


def test_cann_without_devices_counts_zero(emulated_cann):
    """CANN loads but reports no NPU: the count is 0 and not an error; selecting a device is DEVICE_NOT_FOUND (6)."""
    results = run_suite({"ASCEND_TOOLKIT_HOME": str(emulated_cann), "ASCEND_EMULATION_DEVICE_COUNT": "0"})
    assert results["device_count"] == [0, 0]
    assert results["set_device"] == 6


def test_probe_finds_the_emulation(emulated_cann):
    probe = subprocess.run(
        [sys.executable, "-c", "from infiniop_py._ascend import missing_cann_reason; print(missing_cann_reason())"],
        env={**os.environ, "ASCEND_TOOLKIT_HOME": str(emulated_cann), "PYTHONPATH": str(HERE.parent)},
        capture_output=True, text=True, check=True,
    )
    assert probe.stdout.strip() == "None"
