#!/usr/bin/env bash
# Prepares, here, everything a session lent a GPU carries to it, in one command (20-30 minutes on 2 cores), so
# that its fifteen minutes of device time go to one call of scripts/verify_gpu.sh:
#   - .whl/: the wheels the lent machine lacks and cannot download (cffi, pycparser, xmake-wheel, liger-kernel);
#   - gpu-lib/: this checkout's libraries for sm_90 (scripts/prebuild_gpu.sh, which builds them in infiniop_py/lib:
#     an editable install here then loads those);
#   - gpu-ab/: a build per `variant` line of scripts/gpu_ab_pending (scripts/prebuild_gpu_ab.sh), and its `case`
#     lines as gpu-ab/CASES (scripts/gpu_ab.sh).
# Then, with the device tool:
#   run(command="bash scripts/verify_gpu.sh", carry=[".whl", "gpu-lib", "gpu-ab"], timeout_s=600)
# (or, where the A/Bs decide what the rest should time, the steps of the open issues' kernels first:
#   run(command="VERIFY_GPU_STEPS='tests host-overhead ab bench-forward' VERIFY_GPU_BUDGET_S=570 bash
#       scripts/verify_gpu.sh", carry=[".whl", "gpu-lib", "gpu-ab"], timeout_s=595)). All three are
# ignored by git; together they stay well under the 64 MiB a call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -d .whl ]]; then
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl cffi==2.1.1 pycparser==3.12 xmake-wheel==3.0.0 liger-kernel==0.8.5
fi
bash scripts/prebuild_gpu.sh
rm -rf gpu-ab
mkdir -p gpu-ab
while read -r kind rest; do
    case "$kind" in
    variant) read -r name revision <<<"$rest" && bash scripts/prebuild_gpu_ab.sh "$name" "$revision" ;;
    case) echo "$rest" >>gpu-ab/CASES ;;
    '' | '#'*) ;;
    *) echo "scripts/gpu_ab_pending: unknown line: $kind $rest" >&2; exit 2 ;;
    esac
done <scripts/gpu_ab_pending
[[ -f gpu-ab/base.tar.xz ]] || { echo "scripts/gpu_ab_pending names no base: gpu-ab/ is left empty" >&2; rm -rf gpu-ab; }
du -sh .whl gpu-lib gpu-ab 2>/dev/null
