"""The CPU kernels exist once per ISA (AVX-512 with BF16 conversions, AVX-512, AVX2, generic) and the best the
CPU has is used. Run the numeric suites again with each lower ISA forced, so every path is checked on any x86-64
machine (asking for more than the CPU has gives what it has)."""

import os
import pathlib
import platform
import subprocess
import sys

import pytest

TESTS = pathlib.Path(__file__).parent
NUMERIC_SUITES = ["test_memory_paths.py", "test_rms_norm_backward.py", "test_layer_norm_backward.py", "test_batch_norm_backward.py",
                  "test_batch_norm_backward_ex.py", "test_non_finite.py"]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA variants are built on x86-64 only")
@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_numeric_suites_pass_on_each_isa(isa):
    env = dict(os.environ, INFINIOP_CPU_ISA=isa)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(str(TESTS / name) for name in NUMERIC_SUITES)],
        env=env, cwd=TESTS.parent, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1]
