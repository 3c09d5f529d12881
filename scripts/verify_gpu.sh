#!/usr/bin/env bash
# Verify the CUDA backend on a machine with an NVIDIA GPU in one command, from the repository root:
#   bash scripts/verify_gpu.sh [REPORT]        (REPORT defaults to gpu-report.txt)
# It builds the package with the CUDA backend required (INFINIOP_PY_CUDA=1) into a fresh virtual environment,
# runs the suite with its GPU variants (the NCCL SyncBatchNorm too where there are two GPUs), `infiniop-py smoke --device nvidia` and `infiniop-py bench --device nvidia --json`, and writes what each
# printed, its exit status and the device into REPORT (the bench JSON beside it). Exit status: 0 when every step
# passed. torch must be installable with CUDA (pip's default torch wheels are).
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

python3 -m venv "$scratch/venv" && . "$scratch/venv/bin/activate" || { echo "no venv" >>"$report"; exit 1; }
step build env INFINIOP_PY_CUDA=1 pip install -e ".[test,torch]" || { echo "build failed: see $report"; exit 1; }
# The whole suite: its GPU variants are the `device` parameter's nvidia cases, the nvidia-marked tests and the
# test_nvidia_*.py modules (which skip at module level without a device); -rs lists any skip with its reason.
step suite python -m pytest tests -q -p no:cacheprovider -rs
step smoke infiniop-py smoke --device nvidia
step bench infiniop-py bench --device nvidia --json "$bench_json"
echo "report: $report (bench numbers: $bench_json); status $status"
exit "$status"
