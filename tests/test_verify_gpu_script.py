"""scripts/verify_gpu.sh takes carried prebuilt libraries (gpu-lib/, scripts/prebuild_gpu.sh) instead of building,
only where they were built from the same native sources and load; checked on a copy of the repository, with no
GPU step selected (VERIFY_GPU_STEPS names none), so that it runs anywhere in seconds."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import infiniop_py
from _scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tracked_copy(target):
    """The repository's tracked files, as a device machine gets them (no .git, no build outputs)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in listed.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    return target


def _fingerprint(tree):
    return subprocess.run(["bash", "scripts/native_fingerprint.sh"], cwd=tree, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def tree_with_gpu_lib(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("copies the repository's tracked files: needs git and a checkout")
    tree = _tracked_copy(tmp_path / "repo")
    gpu_lib = tree / "gpu-lib"
    gpu_lib.mkdir()
    library_dir = pathlib.Path(infiniop_py.library_path()).parent  # this process's libraries stand in for sm_90's
    subprocess.run(["tar", "-C", str(library_dir), "-cJf", str(gpu_lib / "libraries.tar.xz"), "libinfiniop.so",
                    "libinfinirt.so"], check=True)  # packed as scripts/prebuild_gpu.sh packs them
    (gpu_lib / "SOURCES").write_text(_fingerprint(tree) + "\n")
    return tree


def _verify(tree):
    env = {key: value for key, value in os.environ.items() if key not in ("INFINIOP_PY_LIBRARY_DIR", "OUT")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # its python3: this one
    env["VERIFY_GPU_STEPS"] = "none"
    done = subprocess.run(["bash", "scripts/verify_gpu.sh", str(tree / "report")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    return done, (tree / "report" / "report.txt").read_text()


def test_fingerprint_follows_every_native_source(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("copies the repository's tracked files: needs git and a checkout")
    tree = _tracked_copy(tmp_path / "repo")
    before = _fingerprint(tree)
    assert before == _fingerprint(tree)
    header = tree / "native" / "include" / "infinirt.h"
    header.write_text(header.read_text() + "\n")
    assert _fingerprint(tree) != before


def test_prebuilt_libraries_of_the_same_sources_replace_the_build(tree_with_gpu_lib):
    done, report = _verify(tree_with_gpu_lib)
    assert "== build: gpu-lib/ prebuilt from these sources (sm_90), loaded" in report, report[-3000:]
    assert "setup.py" not in report  # no build ran
    assert (tree_with_gpu_lib / "infiniop_py" / "lib" / "libinfiniop.so").is_file()


def test_prebuilt_libraries_of_other_sources_are_not_taken(tree_with_gpu_lib):
    source = tree_with_gpu_lib / "native" / "src" / "runtime" / "infinirt.cc"
    source.write_text(source.read_text() + "\n// edited after the prebuild\n")
    (tree_with_gpu_lib / "setup.py").unlink()  # so that the build it falls back to fails at once

    done, report = _verify(tree_with_gpu_lib)

    assert "gpu-lib/ is stale or does not load here: building" in report, report[-3000:]
    assert "== build (limit 240 s)" in report and done.returncode == 1
    assert not (tree_with_gpu_lib / "infiniop_py" / "lib").exists()


def test_gpu_ab_unpacks_each_build_and_reports_every_case(tmp_path):
    """scripts/gpu_ab.sh with a base and one variant packed as scripts/prebuild_gpu_ab.sh packs them: it names each
    build's revision and runs scripts/ab.py --device nvidia per case of gpu-ab/CASES; without a GPU each case fails,
    saying why, and the script exits non-zero with an empty ab.json."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("copies the repository's tracked files: needs git and a checkout")
    tree = _tracked_copy(tmp_path / "repo")
    library_dir = pathlib.Path(infiniop_py.library_path()).parent
    (tree / "gpu-ab").mkdir()
    for name in ("base", "variant"):
        staged = tmp_path / name
        staged.mkdir()
        for library in ("libinfiniop.so", "libinfinirt.so"):
            shutil.copy2(library_dir / library, staged / library)
        (staged / "REVISION").write_text(f"0000000 the {name} build\n")
        subprocess.run(["tar", "-C", str(staged), "-cJf", str(tree / "gpu-ab" / f"{name}.tar.xz"), "libinfiniop.so",
                        "libinfinirt.so", "REVISION"], check=True)
    (tree / "gpu-ab" / "CASES").write_text("# a case for every variant, one for this variant, one for another\n"
                                           "--op batch_norm --dtype float16 --shape 4x8x7x7\n"
                                           "[other,variant] --op rms_norm --dtype bfloat16 --shape 8x96\n"
                                           "[other] --op layer_norm --dtype bfloat16 --shape 8x96\n")
    env = {key: value for key, value in os.environ.items() if key not in ("INFINIOP_PY_LIBRARY_DIR", "OUT")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run(["bash", "scripts/gpu_ab.sh", str(tree / "report")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    report = (tree / "report" / "ab.txt").read_text()
    assert "base: 0000000 the base build" in report and "variant: 0000000 the variant build" in report
    assert "== variant against base: --op batch_norm --dtype float16 --shape 4x8x7x7" in report
    assert "== variant against base: --op rms_norm --dtype bfloat16 --shape 8x96" in report
    assert "layer_norm" not in report
    torch_has_cuda = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                                    capture_output=True).returncode == 0
    if not torch_has_cuda:
        assert done.returncode == 1 and "cannot use CUDA" in report and "failed" in report
        assert (tree / "report" / "ab.json").read_text().strip() == "[]"


def test_pending_gpu_ab_names_builds_of_main_and_cases_ab_accepts():
    """scripts/gpu_ab_pending, what scripts/prepare_gpu_session.sh builds for a session lent a GPU: a base, every
    variant a commit of this branch's history, every case's variants declared and its options accepted by
    scripts/ab.py, so that a stale or mistyped line fails here rather than in a GPU session's few minutes."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("resolves the listed revisions: needs git and a checkout")
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        pytest.skip("resolves the listed revisions: needs the whole history, and this clone is shallow")
    parser = load_script("ab").argument_parser()
    variants, cases = {}, []
    for line in (ROOT / "scripts" / "gpu_ab_pending").read_text().splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind == "variant":
            name, revision = rest.split()
            variants[name] = revision
        elif kind == "case":
            cases.append(rest)
        else:
            assert kind == "" or kind.startswith("#"), f"unknown line: {line!r}"
    assert "base" in variants and len(variants) >= 2, "a base and at least one variant to time against it"
    for name, revision in variants.items():
        ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", revision, "HEAD"], cwd=ROOT,
                                  capture_output=True)
        assert ancestor.returncode == 0, f"variant {name}: {revision} is not a commit of HEAD's history"
    assert cases, "no case to time"
    for case in cases:
        match = re.fullmatch(r"\[([^]]*)\]\s*(.*)", case)
        names, options = (match.group(1).split(","), match.group(2)) if match else (list(variants), case)
        assert set(names) <= set(variants) - {"base"}, f"case {case!r} names an undeclared variant"
        parser.parse_args(["a", "b", "--device", "nvidia", *options.split()])  # exits (SystemExit) on a bad option
