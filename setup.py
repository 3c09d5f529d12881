"""Build hook: compile the native libraries with xmake and bundle them as infiniop_py/lib/ (and their C headers as
infiniop_py/include/).

It is a build_ext command, so `pip install .` (into the wheel) and `pip install -e .` (into the
source tree) both run it. Everything is built in a temporary folder that is removed afterwards: a build leaves
no build/ tree in the source folder (it was 100-260 MB). Environment:
  INFINIOP_PY_CUDA        1: build the NVIDIA backend; 0: don't; unset: build it when nvcc is on PATH.
  INFINIOP_PY_CUDA_ARCHS  its targets, e.g. "sm_90" (default "sm_80,sm_90,compute_90": xmake's nv-arch option).
  INFINIOP_PY_BUILD_DIR   a folder to keep xmake's build in instead, so that the next build of the same sources
                          recompiles only what changed (seconds rather than minutes).
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARY_STEMS = ("infinirt", "infiniop")


class BinaryDistribution(Distribution):
    """No Python extension, but the bundled libraries make the wheel platform-specific."""

    def has_ext_modules(self):
        return True


def _build_cuda():
    setting = os.environ.get("INFINIOP_PY_CUDA", "")
    if setting not in ("", "0", "1"):
        sys.exit(f"INFINIOP_PY_CUDA must be 0, 1 or unset, not {setting!r}")
    nvcc = shutil.which("nvcc")
    build = setting == "1" or (setting == "" and nvcc is not None)
    if build:
        print(f"infiniop-py: compiling the CUDA backend too (nvcc: {nvcc}; minutes more; INFINIOP_PY_CUDA=0 skips it)",
              flush=True)
    else:
        reason = "INFINIOP_PY_CUDA=0" if setting == "0" else "no nvcc on PATH"
        print(f"infiniop-py: CPU and Ascend backends only ({reason}; INFINIOP_PY_CUDA=1 requires CUDA)", flush=True)
    return build


def _xmake():
    """The xmake of the build environment (the xmake-wheel build requirement), else PATH's."""
    beside_python = os.path.join(sysconfig.get_path("scripts"), "xmake")
    found = beside_python if os.path.isfile(beside_python) else shutil.which("xmake")
    if found is None:
        sys.exit("xmake not found: install the xmake-wheel package (a build requirement)")
    return found


def _shared_library_files(directory):
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    files = [os.path.join(directory, name) for name in names
             if any(name.startswith(f"lib{stem}.") for stem in LIBRARY_STEMS)]
    if not files:
        sys.exit(f"xmake install left no libinfinirt / libinfiniop in {directory}")
    return files


class BuildNative(build_ext):
    """xmake f / xmake / xmake install, then copy the shared libraries next to the package."""

    def run(self):
        kept = os.environ.get("INFINIOP_PY_BUILD_DIR", "")
        build_dir = os.path.abspath(kept or os.path.join(self.build_temp, "xmake"))
        install_dir = os.path.join(build_dir, "install")
        environment = dict(os.environ, XMAKE_CONFIGDIR=os.path.join(build_dir, "config"))
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            environment["XMAKE_ROOT"] = "y"
        configure = [_xmake(), "f", "-c", "-y", "-o", build_dir, "--cpu=y", "--omp=y"]
        if _build_cuda():
            configure.append("--nv-gpu=y")
            if os.environ.get("INFINIOP_PY_CUDA_ARCHS"):
                configure.append(f"--nv-arch={os.environ['INFINIOP_PY_CUDA_ARCHS']}")
        started = time.monotonic()
        for command in (configure, [_xmake(), "-y"], [_xmake(), "install", "-y", "-o", install_dir]):
            print(" ".join(command), flush=True)
            if subprocess.run(command, cwd=ROOT, env=environment).returncode != 0:
                hint = " (set INFINIOP_PY_CUDA=0 for a CPU-only build)" if "--nv-gpu=y" in configure else ""
                sys.exit(f"failed: {' '.join(command)}{hint}")
        print(f"infiniop-py: native build done in {time.monotonic() - started:.0f} s", flush=True)
        in_source = self.inplace or getattr(self, "editable_mode", False)
        target_dir = os.path.join(ROOT if in_source else self.build_lib, "infiniop_py", "lib")
        os.makedirs(target_dir, exist_ok=True)
        self._outputs = []
        for library in _shared_library_files(os.path.join(install_dir, "lib")):
            target = os.path.join(target_dir, os.path.basename(library))
            shutil.copy2(library, target)
            self._outputs.append(target)
        # The C headers too, so that C users of a pip install compile against them (infiniop_py.include_dir()).
        include_dir = os.path.join(os.path.dirname(target_dir), "include")
        shutil.rmtree(include_dir, ignore_errors=True)
        shutil.copytree(os.path.join(install_dir, "include"), include_dir)
        for directory, _, names in os.walk(include_dir):
            self._outputs += [os.path.join(directory, name) for name in names]

    def get_outputs(self):
        return list(getattr(self, "_outputs", []))


# setuptools' build folder (build_temp holds xmake's build, build_lib the wheel's files) is a temporary one, not
# ./build; a --build-base given on the command line still wins.
with tempfile.TemporaryDirectory(prefix="infiniop-py-build-") as build_base:
    setup(distclass=BinaryDistribution, cmdclass={"build_ext": BuildNative}, options={"build": {"build_base": build_base}})
