"""The Ascend backend against an emulation of the documented CANN contract (tests/ascend_emulation).

The emulation is a test-only host library, built here with the system C++ compiler and found by the
backend through $ASCEND_TOOLKIT_HOME. The backend resolves CANN once per process, so every scenario runs
tests/ascend_emulation/ascend_suite.py in a child process and the tests here check what it reports.
"""

import json
import os
import re
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
NOT_IMPLEMENTED = suite.NOT_IMPLEMENTED


def library_dir():
    configured = os.environ.get("INFINIOP_PY_LIBRARY_DIR")
    candidates = [Path(configured)] if configured else []
    candidates += [HERE.parent / "infiniop_py" / "lib", HERE.parent / "build" / "install" / "lib"]
    for candidate in candidates:
        if (candidate / "libinfiniop.so").exists() and (candidate / "libinfinirt.so").exists():
            return candidate
    pytest.skip("native libraries not built (xmake && xmake install -o build/install)")


def run_suite(env_changes, *case_names):
    """The suite's results in a child process with `env_changes` (nothing else ASCEND_*), on the named cases only
    when any are given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND")}
    env.update(env_changes)
    done = subprocess.run(
        [sys.executable, str(EMULATION / "ascend_suite.py"), str(library_dir()), *case_names],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def emulated_cann(tmp_path_factory):
    """The emulated CANN built once, laid out as installs of several generations (see build.sh); the default
    one, `split`, has current CANN's libopapi_nn.so + libopapi_math.so and no libopapi.so."""
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("no C++ compiler to build the CANN emulation")
    root = tmp_path_factory.mktemp("cann_emulation")
    subprocess.run(["sh", str(EMULATION / "build.sh"), str(root)], check=True)
    return root


def on(emulated_cann, layout="split", **knobs):
    """The environment of a run against one layout of the emulation: two devices unless a knob says otherwise."""
    env = {"ASCEND_TOOLKIT_HOME": str(emulated_cann / layout), "ASCEND_EMULATION_DEVICE_COUNT": "2"}
    env.update({f"ASCEND_EMULATION_{key.upper()}": value for key, value in knobs.items()})
    return env


@pytest.fixture(scope="module")
def mixed(emulated_cann):
    """Results with the emulation's default: every second executor refuses to be made repeatable, as CANN does in
    some modes, so plans mix reused and re-planned calls. Also the client situations and the tiling refusals."""
    return run_suite(on(emulated_cann))


@pytest.fixture(scope="module")
def reused(emulated_cann):
    """Results with executors planned once and re-pointed on each run (CANN's repeatable executors)."""
    return run_suite(on(emulated_cann, no_repeatable="0"))


@pytest.fixture(scope="module")
def replanned(emulated_cann):
    """Results where aclSetAclOpExecutorRepeatable always fails, so the backend plans every call on every run."""
    return run_suite(on(emulated_cann, no_repeatable="1"))


CASES = [(name, expected) for name, _, expected in suite.cases()]


def check_case(results, name, expected):
    result = results[name]
    assert result["status"] == expected, result
    if expected == 0:
        dtype = name.split(":")[-1].split("/")[1]
        assert result["err"] <= TOLERANCE[dtype], result


@pytest.mark.parametrize("name,expected", CASES, ids=[c[0] for c in CASES])
def test_operator_with_mixed_executors(mixed, name, expected):
    check_case(mixed, name, expected)


@pytest.mark.parametrize("name,expected", CASES, ids=[c[0] for c in CASES])
def test_operator_with_reused_executors(reused, name, expected):
    check_case(reused, name, expected)


@pytest.mark.parametrize("name,expected", CASES, ids=[c[0] for c in CASES])
def test_operator_with_replanned_executors(replanned, name, expected):
    check_case(replanned, name, expected)


SITUATIONS = ("default-stream", "new-thread", "other-device")


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("name", suite.CONTEXT_CASES)
def test_operator_in_client_situation(mixed, situation, name):
    """Descriptors created and run from a thread that never selected a device (CANN's first phase needs one), and
    on device 1's buffers while the caller has device 0 selected: the backend selects the handle's device."""
    check_case(mixed, f"{situation}:{name}", 0)


def test_the_callers_device_stays_selected(mixed):
    """Working on device 1 for a handle there, the backend gives the caller back the device it had selected (0):
    libinfinirt, which shares CANN's per-thread device, must keep finding it."""
    assert mixed["other-device:devices-seen"] == [0]


@pytest.mark.parametrize("op", ["rms", "ln", "bn", "rms-fwd", "ln-fwd", "bn-fwd"])
def test_a_shape_the_kernel_cannot_tile_is_bad_tensor_shape(mixed, op):
    """561002 (ACLNN_ERR_INNER_TILING_ERROR) is how the real operators refuse shapes: BAD_TENSOR_SHAPE (11)."""
    assert mixed[f"tiling:{op}"] == 11


# BatchNorm forwards writing save_invstd, which aclnnBatchNorm's saveInvstd gives differently by product.
SAVED_INVSTD = ("bn-fwd/F32/training", "bn-fwd/F16/f32-parameters", "bn-fwd/BF16/channels-last",
                "bn-fwd/F32/strided-vectors", "bn-fwd/F32/no-batch")


def test_batch_norm_forward_on_ascend_950(emulated_cann):
    """On Ascend 950 aclnnBatchNorm's saveInvstd is 1/sqrt(var + eps) itself (elsewhere the batch variance): the
    backend tells the two apart by aclrtGetSocName, and save_invstd comes out the same."""
    results = run_suite(on(emulated_cann, soc="Ascend950PR_9579"), *SAVED_INVSTD)
    for name in SAVED_INVSTD:
        check_case(results, name, 0)


def test_a_soc_the_document_does_not_name_refuses_only_save_invstd(emulated_cann):
    """aclrtGetSocName answering NULL: what saveInvstd holds is unknown, so only a descriptor that would compute
    save_invstd is NOT_IMPLEMENTED (2); eval, training without it, and no samples (a fill) work (the backward's
    rule: test_a_soc_the_document_does_not_name_refuses_the_training_backward)."""
    working = ("bn-fwd/F32/eval", "bn-fwd/F32/training-no-saves", "bn-fwd/F32/no-batch", "bn-ex/F32/eval")
    results = run_suite(on(emulated_cann, soc=""), *SAVED_INVSTD, *working)
    for name in SAVED_INVSTD:
        check_case(results, name, 0 if name in working else 2)
    for name in working:
        check_case(results, name, 0)


# BatchNorm backwards in training, whose aclnnBatchNormBackward reads saveInvstd differently by product: the batch
# statistics computed by the backend (seed form, Ex without saved ones) and the caller's save_invstd (Ex saved).
TRAINING_BACKWARD = ("bn/F32/(4, 6, 9)", "bn/BF16/(1, 5, 33)", "bn-strided/F16", "bn-ex/F32/eps",
                     "bn-ex/F16/no-weight", "bn-ex/F32/channels-last", "bn-ex/F32/saved", "bn-ex/F32/saved-eps",
                     "bn-ex/BF16/saved-eps", "bn-ex/F16/f32-parameters")
# Backwards that read no saveInvstd: eval (the running statistics), and no samples (fills only).
BACKWARD_WITHOUT_SAVED = ("bn-ex/F32/eval", "bn-ex/F16/f32-parameters-eval", "bn-no-batch/F32",
                          "bn-ex/F32/no-batch-no-grad-weight")


@pytest.mark.parametrize("soc", ["Ascend910B1", "Ascend910_9392", "Ascend910A", "Ascend310P3", "Ascend950PR_9579"])
def test_batch_norm_backward_reads_what_the_soc_saves(emulated_cann, soc):
    """aclnnBatchNormBackward reads saveInvstd as the biased batch variance on Atlas training, inference, A2 and A3
    SoCs (its A2/A3 path feeds BNTrainingUpdateGrad / BNTrainingReduceGrad) and as 1/sqrt(var + eps) on Ascend 950:
    the backend passes each what it reads, and the gradients match the float64 references on every one."""
    results = run_suite(on(emulated_cann, soc=soc), *TRAINING_BACKWARD, *BACKWARD_WITHOUT_SAVED)
    for name in TRAINING_BACKWARD + BACKWARD_WITHOUT_SAVED:
        check_case(results, name, 0)


@pytest.mark.parametrize("soc", ["", "Ascend310B1"])
def test_a_soc_the_document_does_not_name_refuses_the_training_backward(emulated_cann, soc):
    """On a SoC that is none of those (or unnamed: NULL), what saveInvstd must hold is unknown: a training backward
    is NOT_IMPLEMENTED (2) at create; eval and no samples still work."""
    results = run_suite(on(emulated_cann, soc=soc), *TRAINING_BACKWARD, *BACKWARD_WITHOUT_SAVED)
    for name in TRAINING_BACKWARD:
        check_case(results, name, NOT_IMPLEMENTED)
    for name in BACKWARD_WITHOUT_SAVED:
        check_case(results, name, 0)


def test_runtime(mixed):
    assert mixed["device_count"] == [0, 2]
    assert mixed["set_device_out_of_range"] == 6  # DEVICE_NOT_FOUND
    assert mixed["set_device"] == 0
    runtime = mixed["runtime"]
    # copied: infinirtFree waited for the copy queued from the block it freed; copied_before_destroy:
    # infinirtStreamDestroy synchronized the copy still queued on it (CANN refuses an unsynchronized stream).
    assert runtime.pop("roundtrip") and runtime.pop("zeroed") and runtime.pop("copied")
    assert runtime.pop("copied_before_destroy")
    assert runtime.pop("event_ordered")  # stream b waited for the event that stream a recorded
    assert all(status == 0 for status in runtime.values()), runtime


# One case per operator needing only the norm operators, then one per elementwise operator the plans add.
# (On the default emulated SoC, an Atlas A2 one, the BatchNorm backward passes batch statistics straight in, and
# turns a saved save_invstd back into the variance with aclnnDiv / aclnnAdds.)
NORM_ONLY = ("rms-ex/F32/eps", "ln-ex/F32/from-input", "bn/F32/(4, 6, 9)", "bn-ex/F32/eps", "rms-fwd/F16/rstd",
             "ln-fwd/F32/ex", "bn-fwd/F32/eval", "bn-fwd/F32/training-no-saves")
NEEDING_ELEMENTWISE = ("rms/F16/(3, 5, 64)", "ln/F32/(3, 5, 64)", "bn-ex/F32/saved", "ln-fwd/F32/seed",
                       "bn-fwd/F32/training", "bn-fwd/F16/eval")


@pytest.mark.parametrize("layout", ["legacy", "train", "shadowed"])
def test_operator_libraries_of_every_generation(emulated_cann, layout):
    """Each aclnn operator is taken from the first operator library that has it: one legacy libopapi.so, older
    CANN's libaclnn_ops_train.so + libaclnn_math.so, and current CANN's split libraries ahead of a stale
    libopapi.so whose every operator fails."""
    results = run_suite(on(emulated_cann, layout), *NORM_ONLY, *NEEDING_ELEMENTWISE)
    for name in NORM_ONLY + NEEDING_ELEMENTWISE:
        check_case(results, name, 0)


def test_a_missing_operator_disables_only_the_operators_needing_it(emulated_cann):
    """libopapi_math.so absent: the device and the plans of norm operators alone still work; the others are
    NOT_IMPLEMENTED (2), and infiniop_py names the missing aclnn operators and the libraries searched."""
    layout = emulated_cann / "nn-only"
    results = run_suite(on(emulated_cann, "nn-only"), *NORM_ONLY, *NEEDING_ELEMENTWISE)
    assert results["device_count"] == [0, 2]
    for name in NORM_ONLY:
        check_case(results, name, 0)
    for name in NEEDING_ELEMENTWISE:
        check_case(results, name, 2)

    script = (
        "import infiniop_py as ip\n"
        "handle = ip.Handle('ascend')\n"
        "rows, vector = ((4, 8), 'float32'), ((8,), 'float32')\n"
        "try:\n"
        "    ip.LayerNormBackward(handle, rows, vector, vector, rows, vector, rows, ((4,), 'float32'))\n"
        "except ip.NotImplementedStatusError as error:\n"
        "    print('refused:', error)\n"
    )
    env = {**os.environ, **on(emulated_cann, "nn-only"), "LD_LIBRARY_PATH": "", "PYTHONPATH": str(HERE.parent),
           "INFINIOP_PY_LIBRARY_DIR": str(library_dir())}
    probe = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    message = probe.stdout
    assert "refused:" in message and "NOT_IMPLEMENTED" in message, message
    for name in ("aclnnCast", "aclnnAdds", "aclnnRsqrt", "aclnnDiv"):
        assert name in message, message
    assert "aclnnRmsNorm," not in message and "aclnnLayerNormBackward" not in message, message
    assert str(layout / "lib64" / "libopapi_nn.so") in message and "libopapi.so (not loaded" in message, message
    assert "libaclnn_math.so (not loaded" in message, message


def test_smoke_passes_every_op_and_dtype_on_ascend(emulated_cann):
    """`infiniop-py smoke --device ascend` against the emulation: every backward and forward in F32, F16 and BF16
    passes (none is n/a)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ASCEND")}
    env.update(on(emulated_cann), PYTHONPATH=str(HERE.parent), INFINIOP_PY_LIBRARY_DIR=str(library_dir()))
    done = subprocess.run([sys.executable, "-m", "infiniop_py", "smoke", "--device", "ascend"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    ops = {"rms_norm_backward", "layer_norm_backward", "batch_norm_backward", "rms_norm", "layer_norm", "batch_norm"}
    rows = [line.split() for line in done.stdout.splitlines() if line.split()[:1] and line.split()[0] in ops]
    assert len(rows) == 18 and all("PASS" in row for row in rows), done.stdout


def test_python_searches_as_the_loader_does():
    """infiniop_py._ascend repeats loader.cc's search to name what is missing: the same operators and roots."""
    from infiniop_py import _ascend

    loader = (HERE.parent / "native" / "src" / "devices" / "ascend" / "loader.cc").read_text()
    assert tuple(re.findall(r"^\s*OPERATOR\((aclnn\w+)\);", loader, re.M)) == _ascend.OPERATORS
    roots = re.findall(r'under\("(\w+)", \{([^}]*)\}\)', loader)
    assert [(variable, tuple(re.findall(r'"([^"]+)"', subdirs))) for variable, subdirs in roots] == [
        ("ASCEND_TOOLKIT_HOME", ("lib64", "lib")), ("ASCEND_HOME_PATH", ("lib64", "lib")),
        ("ASCEND_HOME", ("lib64", "lib", "ascend-toolkit/latest/lib64"))]
    os_root = {"ASCEND_TOOLKIT_HOME": "/t", "ASCEND_HOME_PATH": "/p", "ASCEND_HOME": "/h"}
    saved = {key: os.environ.get(key) for key in os_root}
    os.environ.update(os_root)
    try:
        assert _ascend.search_directories() == ["/t/lib64", "/t/lib", "/p/lib64", "/p/lib", "/h/lib64", "/h/lib",
                                                "/h/ascend-toolkit/latest/lib64"]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
    results = run_suite(on(emulated_cann, device_count="0"))
    assert results["device_count"] == [0, 0]
    assert results["set_device"] == 6


def test_probe_finds_the_emulation(emulated_cann):
    """Nothing missing: no reason for either a missing device or a missing operator."""
    script = ("from infiniop_py._ascend import missing_cann_reason, missing_operators_reason\n"
              "print(missing_cann_reason(), missing_operators_reason())")
    probe = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **on(emulated_cann), "PYTHONPATH": str(HERE.parent)},
        capture_output=True, text=True, check=True,
    )
    assert probe.stdout.strip() == "None None"
