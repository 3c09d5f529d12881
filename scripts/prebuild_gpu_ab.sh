#!/usr/bin/env bash
# Packs, here, a build of the libraries for a GPU session's A/B of kernel changes (issue 53: measure a change in the
# library itself, against the build before it, before keeping it): git revision REV (default HEAD) built for sm_90
# alone, as scripts/prebuild_gpu.sh builds, into gpu-ab/NAME.tar.xz (ignored by git; about 4 MB, where the libraries
# take 37: several builds fit one device call's 64 MiB). The revisions are built in one worktree,
# /tmp/infiniop-ab-tree, with one build folder, so a second revision recompiles only the files it changes.
#   bash scripts/prebuild_gpu_ab.sh base main         (the baseline: its name must be "base")
#   bash scripts/prebuild_gpu_ab.sh fused-bn bn-fused  (each variant: a branch or commit)
#   run(command="VERIFY_GPU_STEPS=ab bash scripts/verify_gpu.sh", carry=[".whl", "gpu-lib", "gpu-ab"], timeout_s=360)
# scripts/gpu_ab.sh, the `ab` step there, times each variant against base on the cases of gpu-ab/CASES.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 NAME [REV]" >&2; exit 2; }
name="$1"
revision="$(git rev-parse --verify "${2:-HEAD}^{commit}")"
tree=/tmp/infiniop-ab-tree
build="${INFINIOP_PY_BUILD_DIR:-/tmp/infiniop-ab-build}"
if [[ -d "$tree" ]]; then
    git -C "$tree" checkout -q --detach "$revision"
else
    git worktree add -q --detach "$tree" "$revision"
fi
(
    cd "$tree"
    rm -rf infiniop_py/lib
    XMAKE_COLORTERM=nocolor INFINIOP_PY_CUDA=1 INFINIOP_PY_CUDA_ARCHS=sm_90 INFINIOP_PY_BUILD_DIR="$build" \
        python3 setup.py -q build_ext --inplace
)
mkdir -p gpu-ab
git log -1 --format="%h %s" "$revision" >"$tree/infiniop_py/lib/REVISION"
tar -C "$tree/infiniop_py/lib" -cJf "gpu-ab/$name.tar.xz" libinfiniop.so libinfinirt.so REVISION
echo "gpu-ab/$name.tar.xz: $(du -h "gpu-ab/$name.tar.xz" | cut -f1), $(cat "$tree/infiniop_py/lib/REVISION")"
