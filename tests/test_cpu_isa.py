"""The CPU kernels exist once per ISA (AVX-512 with BF16 conversions, AVX-512, AVX2, generic) and the best the
CPU has is used. Run the numeric suites again with each lower ISA forced, so every path is checked on any x86-64
machine (asking for more than the CPU has gives what it has)."""

import os
import pathlib
import platform
import subprocess
import sys

import pytest

from _helpers import run_python_with_isa

TESTS = pathlib.Path(__file__).parent
NUMERIC_SUITES = ["test_memory_paths.py", "test_rms_norm_backward.py", "test_layer_norm_backward.py", "test_batch_norm_backward.py",
                  "test_batch_norm_backward_ex.py", "test_non_finite.py"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA variants are built on x86-64 only")
@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_numeric_suites_pass_on_each_isa(isa):
    env = dict(os.environ, INFINIOP_CPU_ISA=isa)
    # The ISA picks CPU kernels only: the NVIDIA variants (a GPU's, or the CUDA emulation's in .ci/sanitize, 5-7
    # minutes a run under ASan) would run three more times for nothing.
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not nvidia",
         *(str(TESTS / name) for name in NUMERIC_SUITES)],
        env=env, cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1]


_ISA_PROBE = """
import hashlib, numpy as np, infiniop_py as ip
rng = np.random.default_rng(3)
x, grad_y, w = (rng.standard_normal(shape, dtype=np.float32) for shape in ((64, 1000), (64, 1000), (1000,)))
print(hashlib.sha256(b"".join(np.ascontiguousarray(o).tobytes() for o in ip.rms_norm_backward(grad_y, x, w))).hexdigest())
"""


def _probe(isa):
    return run_python_with_isa(_ISA_PROBE, isa)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA variants are built on x86-64 only")
def test_an_unknown_or_empty_isa_name_keeps_the_best_kernels():
    best, quiet = _probe(None)
    generic, _ = _probe("generic")
    if generic == best:
        pytest.skip("this CPU's best kernels give the probe the generic kernels' bits: nothing to tell apart")
    misspelt, warning = _probe("AVX2")
    assert misspelt == best  # not the generic kernels, which a misspelt name used to select
    assert "INFINIOP_CPU_ISA=AVX2 is not avx512bf16, avx512, avx2 or generic" in warning
    empty, no_warning = _probe("")
    assert empty == best
    assert "INFINIOP_CPU_ISA" not in no_warning + quiet


def _expected_best_isa():
    """The best ISA of this CPU from its /proc/cpuinfo flags (the library's rule, written out independently)."""
    with open("/proc/cpuinfo") as cpuinfo:
        flags = next(line for line in cpuinfo if line.startswith("flags")).split(":", 1)[1].split()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags):
        return "avx512bf16" if "avx512_bf16" in flags else "avx512"
    if {"avx2", "fma", "f16c"} <= set(flags):
        return "avx2"
    return "generic"


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo") or platform.machine() not in ("x86_64", "AMD64"),
                    reason="the ISA variants are built on x86-64 only; the expected ISA is read from /proc/cpuinfo")
def test_cpu_isa_reports_the_isa_the_kernels_run_with():
    order = ["generic", "avx2", "avx512", "avx512bf16"]
    best = _expected_best_isa()

    def reported(isa):
        return run_python_with_isa("import infiniop_py as ip; print(ip.cpu_isa())", isa)[0]

    assert reported(None) == best
    assert reported("AVX2") == best  # misspelt: ignored
    for isa in order:  # asking for more than the CPU has gives what it has
        assert reported(isa) == order[min(order.index(isa), order.index(best))]


def test_cpu_isa_query_rejects_a_null_name():
    from infiniop_py._ffi import ffi, libraries
    from infiniop_py.errors import NullPointerError

    assert libraries().op.infiniopGetCpuIsaEx(ffi.NULL) == NullPointerError.status
