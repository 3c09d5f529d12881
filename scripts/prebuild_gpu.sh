#!/usr/bin/env bash
# Builds, here, the libraries a GPU session's scripts/verify_gpu.sh would otherwise build on the lent machine
# (about two of its fifteen minutes): CUDA for sm_90 alone (the H200/H100; about 37 MB, where all targets take 62
# and a device call carries 64 MiB at most), into gpu-lib/ (ignored by git), with a fingerprint of the native
# sources it was built from. verify_gpu.sh takes gpu-lib/ instead of building when the fingerprints agree:
#   bash scripts/prebuild_gpu.sh             (here, with nvcc; minutes on 2 cores)
#   run(command="bash scripts/verify_gpu.sh", carry=[".whl", "gpu-lib"], timeout_s=600)
# A source edited after the prebuild changes the fingerprint, and verify_gpu.sh then builds there as before.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${INFINIOP_PY_BUILD_DIR:-/tmp/infiniop-prebuild-sm90}"
rm -rf infiniop_py/lib gpu-lib
XMAKE_COLORTERM=nocolor INFINIOP_PY_CUDA=1 INFINIOP_PY_CUDA_ARCHS=sm_90 INFINIOP_PY_BUILD_DIR="$build" \
    python3 setup.py -q build_ext --inplace
mkdir -p gpu-lib
cp infiniop_py/lib/libinfiniop.so infiniop_py/lib/libinfinirt.so gpu-lib/
bash scripts/native_fingerprint.sh >gpu-lib/SOURCES
echo "gpu-lib/: $(du -sh gpu-lib | cut -f1), sources $(cat gpu-lib/SOURCES)"
