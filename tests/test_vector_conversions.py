"""The vector conversions of each CPU ISA path agree with the scalar ones bit for bit: BF16 / F16 -> F32 on every
16-bit pattern, and F32 -> BF16 / F16 rounding, NaNs and ties included (tests/native/vector_conversions.cc).
Through the operators the rounding cannot be checked fully: their arithmetic quiets every NaN before it is
rounded, so a path that let a signaling NaN round to infinity would pass every operator test."""

import os
import pathlib
import platform
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "native" / "vector_conversions.cc"
# Each ISA's flags as native/xmake/cpu.lua builds its kernels, and the CPU flags (/proc/cpuinfo) it needs to run.
ISAS = {
    "generic": ([], set()),
    "avx2": (["-march=x86-64-v3"], {"avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"}),
    "avx512": (["-march=x86-64-v4"], {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    "avx512bf16": (["-march=x86-64-v4", "-mavx512bf16"],
                   {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_bf16"}),
}


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((set(line.split(":", 1)[1].split()) for line in cpuinfo if line.startswith("flags")), set())
    except OSError:
        return set()


def test_the_flags_are_those_of_the_build():
    build_script = (ROOT / "native" / "xmake" / "cpu.lua").read_text()
    for isa, (flags, _) in ISAS.items():
        assert f"{isa} = {{" + ", ".join(f'"{flag}"' for flag in flags) + "}" in build_script, isa


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the ISA paths are built on x86-64 only")
@pytest.mark.parametrize("isa", ISAS)
def test_vector_conversions_match_the_scalar_ones(isa, tmp_path):
    flags, needed = ISAS[isa]
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler}) to build tests/native/vector_conversions.cc")
    missing = needed - cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {sorted(missing)} for the {isa} path")
    program = tmp_path / "vector_conversions"
    subprocess.run([compiler, "-std=c++17", "-O2", *flags, f"-DCPU_ISA={isa}", f"-I{ROOT / 'native' / 'src'}",
                    f"-I{ROOT / 'native' / 'include'}", str(SOURCE), "-o", str(program)], check=True)
    result = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-3:] == ["0 widening mismatches in 65536 values per dtype",
                                               "0 narrowing mismatches in 524288 values per dtype",
                                               "0 narrowing mismatches with one infinite or NaN lane among finite ones"
                                               ], result.stdout
