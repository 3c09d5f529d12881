#!/usr/bin/env bash
# Builds, here, the libraries a GPU session's scripts/verify_gpu.sh would otherwise build on the lent machine
# (about two of its fifteen minutes): CUDA for sm_90 alone (the H200/H100), packed with xz into
# gpu-lib/libraries.tar.xz (ignored by git; about 4 MB, where the libraries take 38 and a device call carries
# 64 MiB at most, A/B builds included), with a fingerprint of the native sources it was built from.
# verify_gpu.sh takes gpu-lib/ instead of building when the fingerprints agree:
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
tar -C infiniop_py/lib -cJf gpu-lib/libraries.tar.xz libinfiniop.so libinfinirt.so
bash scripts/native_fingerprint.sh >gpu-lib/SOURCES
echo "gpu-lib/: $(du -sh gpu-lib | cut -f1), sources $(cat gpu-lib/SOURCES)"
