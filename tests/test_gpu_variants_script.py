"""Issue 53's kernel A/B program, scripts/gpu_variants/row_backward_variants.cu, run by scripts/gpu_variants.sh on a
GPU. Here: where nvcc is, the script builds it against the libraries with no warning and no register spill, and
without a GPU the program says so and exits 2. Everywhere (g++ 12 or later): its kernels and checks run on the CPU
through tests/native/cuda_on_cpu.h, on small shapes that reach every variant, tail and cluster size, and pass; and
that emulation catches the races the kernels avoid (a shared slot or a cp.async buffer read at the wrong time)."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

import infiniop_py

from _devices import nvidia_unusable_reason

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "scripts" / "gpu_variants" / "row_backward_variants.cu"


def without_preload():
    """The environment without LD_PRELOAD: the sanitizer stage preloads ASan, under which nvcc crashes."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc on PATH: the variants program is CUDA C++, built only where nvcc is")
    out = tmp_path_factory.mktemp("variants")
    program = out / "bin" / "row_backward_variants"
    env = dict(without_preload(), INFINIOP_PY_LIBRARY_DIR=os.path.dirname(infiniop_py.library_path()),
               GPU_VARIANTS_PROGRAM=str(program))
    result = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_variants.sh"), "--build-only", str(out)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return program, (out / "variants.txt").read_text(), pathlib.Path(str(program) + ".log").read_text()


def test_it_compiles_with_no_warning_and_no_spill(built):
    _, summary, log = built
    # Under the sanitizer stage the library links ASan, and the linker warns about ASan's own tmpnam: not ours.
    warnings = [line for line in log.splitlines() if "warning" in line.lower() and "libasan" not in line]
    assert not warnings, log
    kernels = re.findall(r"^void (\w+)<.*?(\d+) regs, .*?(\d+)/(\d+) B spilled$", summary, re.M)
    assert {"warpRowsKernel", "rowsKernel", "sumPartialsKernel"} <= {name for name, *_ in kernels}, summary
    assert all(stores == loads == "0" for *_, stores, loads in kernels), summary


def test_it_refuses_bad_arguments(built):
    program, *_ = built
    for arguments in ([], ["out", "--rounds"], ["out", "--colour", "red"]):
        result = subprocess.run([str(program), *arguments], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "usage:" in result.stderr, arguments


def test_without_a_gpu_it_says_so(built, tmp_path):
    if nvidia_unusable_reason() is None or os.path.exists("/dev/nvidiactl"):
        pytest.skip("a GPU is here: the program would run the whole experiment (scripts/gpu_variants.sh does)")
    program, *_ = built
    result = subprocess.run([str(program), str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no CUDA device" in result.stderr, result.stdout + result.stderr
    assert not (tmp_path / "out").exists()


def for_the_cpu(source):
    """The .cu as C++ for cuda_on_cpu.h: launches become calls, shared memory thread-local to a CTA's OS thread."""
    for header in ("cooperative_groups", "cuda_bf16", "cuda_fp16", "cuda_pipeline_primitives", "cuda_runtime"):
        source = source.replace(f"#include <{header}.h>\n", "")
    source = source.replace("extern __shared__ __align__(16) uint16_t w_s[];",
                            "uint16_t *w_s = emu::dynamicShared<uint16_t>();")
    assert "extern __shared__" not in source, "a dynamic shared array the emulation does not know"
    source = source.replace("__shared__", "static thread_local")
    source, launches = re.subn(r"([\w:]+(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\(", r"emu::launch(\1, \2, ", source, flags=re.S)
    assert launches >= 5, "the launches were not found"
    return '#include "cuda_on_cpu.h"\n' + source


def build_on_cpu(source, directory):
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        pytest.skip(f"no C++ compiler ({compiler}) for the CPU emulation")
    program = directory / "variants_on_cpu"
    (directory / "variants_on_cpu.cc").write_text(for_the_cpu(source))
    subprocess.run([compiler, "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
                    "-Wno-unused-parameter", f"-I{ROOT / 'tests' / 'native'}", f"-I{ROOT / 'native' / 'include'}",
                    str(directory / "variants_on_cpu.cc"), "-o", str(program), "-lpthread"],
                   check=True, timeout=600, env=without_preload())
    return program


def run_on_cpu(program, directory, *arguments):
    result = subprocess.run([str(program), str(directory / "out"), "--rounds", "0", *arguments], capture_output=True,
                            text=True, timeout=600, env=without_preload())
    table = result.stdout.split("\nshape       type library")[0]  # the rows, not the summary after them
    rows = [line.split() for line in table.splitlines() if re.match(r"\d+x\d+ +(bf16|f16) ", line)]
    return result, {(row[0], row[1], row[2]): row for row in rows}


def test_every_variant_passes_on_the_cpu(tmp_path):
    program = build_on_cpu(SOURCE.read_text(), tmp_path)
    # D 1024: warp32 and every cta; D 1001: element-wise loads (D % 8 != 0); D 96: warp16, a 32-thread CTA.
    result, rows = run_on_cpu(program, tmp_path, "--shapes", "24x1024,13x1001,9x96")
    assert result.returncode == 0, result.stdout + result.stderr
    for dtype in ("bf16", "f16"):
        assert {impl for shape, d, impl in rows if (shape, d) == ("24x1024", dtype)} == {
            "copy", "library", "warp32", "cta8", "cta8p", "cta8a2", "cta8a4", "cta16", "cta16p"}
        assert {impl for shape, d, impl in rows if (shape, d) == ("9x96", dtype)} >= {"warp16", "cta8"}
    # Clusters of 2, 8 and 4 CTAs; D 20000 leaves the last CTAs of each cluster a partial or no slice.
    result, rows = run_on_cpu(program, tmp_path, "--shapes", "5x8192,3x20000", "--impls", "library,clu",
                              "--dtypes", "bf16")
    assert result.returncode == 0, result.stdout + result.stderr
    assert {impl for *_, impl in rows} == {"copy", "library", "clu2x512", "clu8x512", "clu4x1024"}, rows


# Two races the emulation must show: one shared slot for every row's sums (no double buffer), and a row read from
# the cp.async ring one wait too early.
RACES = {
    "cta8": {"slots[parity][warp] = part": "slots[0][warp] = part",
             "total = slots[parity][lane]": "total = slots[0][lane]"},
    "cta8a2": {"__pipeline_wait_prior(kAhead - 1);": "__pipeline_wait_prior(kAhead);"},
}


@pytest.mark.parametrize("impl", RACES)
def test_the_emulation_catches_a_race(impl, tmp_path):
    source = SOURCE.read_text()
    for old, new in RACES[impl].items():
        assert old in source
        source = source.replace(old, new)
    result, rows = run_on_cpu(build_on_cpu(source, tmp_path), tmp_path, "--shapes", "24x1024", "--impls", impl,
                              "--dtypes", "bf16")
    assert result.returncode == 1 and rows[("24x1024", "bf16", impl)][10] == "FAIL", result.stdout
