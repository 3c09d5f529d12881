#!/usr/bin/env bash
# Verify the CUDA backend on a machine with an NVIDIA GPU in one command, from the repository root:
#   bash scripts/verify_gpu.sh [REPORT]        (REPORT defaults to gpu-report.txt)
# It builds the package with the CUDA backend required (INFINIOP_PY_CUDA=1) into a fresh virtual environment,
# runs the suite with its GPU variants (the NCCL SyncBatchNorm too where there are two GPUs), `smoke --device
# nvidia` (again under compute-sanitizer's memcheck where that is installed) and `bench --device nvidia --json`,
# and writes what each printed, its exit status and the device into REPORT (the bench JSON beside it). Exit
# status: 0 when every step passed. torch must be installable with CUDA (pip's default torch wheels are).
# On a GPU machine that cannot install packages, build the libraries elsewhere (`xmake f -c --nv-gpu=y && xmake
# && xmake install -o DIR`) and set INFINIOP_PY_LIBRARY_DIR=DIR/lib: the steps then run this source tree with
# the python3 found, which needs cffi, numpy, ml_dtypes, torch, pytest and hypothesis.
set -uo pipefail
cd "$(dirname "$0")/.."
report="$(realpath -m "${1:-gpu-report.txt}")"
bench_json="${report%.*}-bench.json"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
status=0

step() {  # step NAME COMMAND...: run it, append its output and status to the report
    local name="$1"; shift
    echo "== $name: $*" | tee -a "$report"
    "$@" >"$scratch/out" 2>&1
    local code=$?
    tail -n 200 "$scratch/out" >>"$report"
    echo "== $name: exit $code" | tee -a "$report"
    [ "$code" = 0 ] || status=1
    return "$code"
}

: >"$report"
{
    echo "infiniop-py GPU verification, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi: not found"
    nvcc --version 2>&1 | tail -n 1 || echo "nvcc: not found"
} >>"$report"

if [ -n "${INFINIOP_PY_LIBRARY_DIR:-}" ]; then  # libraries built elsewhere: this tree, this python3
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    step packages python3 -c "import cffi, numpy, ml_dtypes, torch, pytest, hypothesis" || exit 1
else
    python3 -m venv "$scratch/venv" && . "$scratch/venv/bin/activate" || { echo "no venv" >>"$report"; exit 1; }
    step build env INFINIOP_PY_CUDA=1 pip install -e ".[test,torch]" || { echo "build failed: see $report"; exit 1; }
fi
# The whole suite: its GPU variants are the `device` parameter's nvidia cases, the nvidia-marked tests and the
# test_nvidia_*.py modules (which skip at module level without a device); -rfEs lists every failure, error and
# skip (with its reason) at the end, which the report keeps.
step suite python3 -m pytest tests -q -p no:cacheprovider -rfEs
step smoke python3 -m infiniop_py smoke --device nvidia
if command -v compute-sanitizer >/dev/null; then
    step memcheck compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m infiniop_py smoke --device nvidia
fi
step bench python3 -m infiniop_py bench --device nvidia --json "$bench_json"
echo "report: $report (bench numbers: $bench_json); status $status"
exit "$status"
