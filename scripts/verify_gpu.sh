#!/usr/bin/env bash
# Verify the CUDA backend on a machine with an NVIDIA GPU in one command, from the repository root:
#   bash scripts/verify_gpu.sh [DIR]      (DIR: where the report goes; $OUT where that is set, else gpu-report/)
# In order, each under its own time limit and all within VERIFY_GPU_BUDGET_S (default 555 s; a step that would
# start with under 10 s left is skipped, so one hang cannot eat the rest). VERIFY_GPU_STEPS="variants ncu" (names
# of the steps below, space- or comma-separated) runs only those after install, build and versions, which always run:
#   install  the wheels of .whl/ (if any) into /tmp/site, for a machine that cannot download;
#   build    the libraries in place with the CUDA backend required (setup.py build_ext --inplace,
#            INFINIOP_PY_CUDA=1; xmake's build kept in /tmp/infiniop-build), unless gpu-lib/ was carried
#            (scripts/prebuild_gpu.sh: built here beforehand from the same sources) and loads;
#   autograd-nodes  the PyTorch path's C++ autograd nodes compiled against the machine's torch (and whether);
#   tests    the NVIDIA subset: every nvidia-marked test (the `device` parameter's nvidia cases, the
#            test_nvidia_*.py modules, CUDA graphs and torch.compile, the bench's GPU peers), 8 processes (4 on
#            fewer than 16 CPUs) where pytest-xdist is installed, 90 s at most a test where pytest-timeout is;
#   host-overhead, training: `bench --host-overhead` and `bench --training` on the GPU, each with --json;
#   bench-rows, bench-batch-norm: `bench --device nvidia --json` for RMSNorm/LayerNorm (beside Liger-Kernel where
#            it imports) and for BatchNorm (beside cuDNN), two runs so that a slow one cannot lose both tables;
#   ab       scripts/gpu_ab.sh, where gpu-ab/ was carried (scripts/prebuild_gpu_ab.sh): kernel changes timed in the
#            library against the build before them (DIR/ab.txt, ab.json);
#   variants scripts/gpu_variants.sh: issue 53's A/B of the RMSNorm backward row kernel, the library's against
#            candidate designs and a copy, checked and timed (compiled in the background while the tests run);
#   bench-forward  `bench --device nvidia --forward --json` (BF16 and F32): issue 54's forwards against torch's,
#            Liger-Kernel's and cuDNN's; with the time left;
#   memcheck, racecheck, initcheck: `smoke --device nvidia` under each compute-sanitizer tool (the smoke
#            run is the documented subset: the whole NVIDIA suite under a sanitizer takes far longer);
#   ncu      Nsight Compute's speed-of-light, occupancy and launch sections of our RMSNorm and LayerNorm backward
#            kernels, BF16 8192x8192 (the worst case of issue 53);
#   backend-memcheck  tests/test_nvidia_backend.py under memcheck, with what time is left.
# DIR/report.txt gets each step's command, whole output, exit status and seconds; DIR/bench_rows.json,
# bench_batch_norm.json, host_overhead.json, training.json, bench_forward.json and variants.csv the numbers
# (variants.txt: the kernels' registers and the variants' table). Exit status 0 when every step passed.
# Needs: nvcc, a C++17 compiler, and a python3 with torch (CUDA), numpy, ml_dtypes, setuptools, pytest and
# hypothesis; cffi and xmake-wheel (pip install cffi xmake-wheel, or carried in .whl/); liger-kernel optional.
#
# On this workplace's lent NVIDIA H200 (Python 3.12; torch, nvcc and compute-sanitizer are there, cffi,
# pycparser, xmake-wheel and liger-kernel are not, and nothing can be downloaded there), run here first
#   XMAKE_ROOT=y bash scripts/prepare_gpu_session.sh
# which does steps 1 and 2 and the A/B builds:
#   1. the wheels into .whl/ (ignored by .gitignore; their pinned versions are in that script alone);
#   2. scripts/prebuild_gpu.sh: the libraries for sm_90, packed in gpu-lib/ (the device then skips its two-minute
#      build);
#   3. one device call, carrying the A/B builds of gpu-ab/ too (scripts/prebuild_gpu_ab.sh; all of it about
#      35 MB of the 64 MiB a call carries):
#        run(command="bash scripts/verify_gpu.sh", carry=[".whl", "gpu-lib", "gpu-ab"], timeout_s=600).
#      Its reply ends with the summary of every step; report.txt and the JSON files come back from $OUT. A
#      session's 15 minutes of device time cover the machine's start and about one such call: the steps are in
#      the order of the open issues (host time and training, then the kernels' tables and A/Bs, the forwards,
#      the sanitizers), and the budget skips what is left. With device time to spare, name the skipped ones:
#        run(command="VERIFY_GPU_STEPS='memcheck racecheck initcheck' bash scripts/verify_gpu.sh",
#            carry=[".whl", "gpu-lib"], timeout_s=300).
set -uo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-${OUT:-gpu-report}}")"
mkdir -p "$out"
report="$out/report.txt"
deadline=$((SECONDS + ${VERIFY_GPU_BUDGET_S:-555}))
status=0
summary=()
export PYTHONUNBUFFERED=1

selected() {  # selected NAME: whether VERIFY_GPU_STEPS (unset: every step) names it
    [[ -z "${VERIFY_GPU_STEPS:-}" || " ${VERIFY_GPU_STEPS//,/ } " == *" $1 "* ]]
}

step() {  # step NAME LIMIT_S COMMAND...: run it under timeout (LIMIT_S or the time left), its output into the report
    local name="$1" limit="$2"
    shift 2
    case "$name" in install | build | versions) ;; *) selected "$name" || return 0 ;; esac
    local left=$((deadline - SECONDS))
    ((limit > left)) && limit=$left
    if ((limit < 10)); then
        echo "== $name: skipped, ${left} s left" | tee -a "$report"
        summary+=("$(printf '%-17s skipped (out of time)' "$name")")
        status=1
        return 1
    fi
    echo "== $name (limit ${limit} s): $*" | tee -a "$report"
    local started=$SECONDS lines
    lines=$(wc -l <"$report")
    timeout -k 10 "$limit" "$@" >>"$report" 2>&1
    local code=$?
    tail -n +"$((lines + 1))" "$report" | tail -n 2  # the step's last lines, for a reply that shows only stdout
    local verdict="exit $code"
    ((code == 124 || code == 137)) && verdict="timed out after ${limit} s"
    echo "== $name: $verdict, $((SECONDS - started)) s" | tee -a "$report"
    summary+=("$(printf '%-17s %-26s %4d s' "$name" "$verdict" $((SECONDS - started)))")
    ((code == 0)) || status=1
    return "$code"
}

{
    echo "infiniop-py GPU verification, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 \
        || echo "nvidia-smi: not found"
    nvcc --version 2>&1 | tail -n 1 || echo "nvcc: not found"
    compute-sanitizer --version 2>&1 | tail -n 1 || echo "compute-sanitizer: not found"
    echo "$(nproc) CPUs; $(python3 --version 2>&1)"
} >"$report" 2>&1
cat "$report"

if compgen -G ".whl/*.whl" >/dev/null; then
    step install 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# gpu-lib/ (scripts/prebuild_gpu.sh, carried): the libraries built elsewhere from these very sources, taken where
# they load here (another image's system libraries may refuse them); else the build below.
prebuilt_loads() {
    [[ -f gpu-lib/SOURCES && "$(cat gpu-lib/SOURCES)" == "$(bash scripts/native_fingerprint.sh)" ]] || return 1
    mkdir -p infiniop_py/lib && tar -C infiniop_py/lib -xJf gpu-lib/libraries.tar.xz libinfiniop.so libinfinirt.so &&
        python3 -c "import infiniop_py; infiniop_py.cpu_isa()"
}
if [[ -d gpu-lib ]]; then
    if prebuilt_loads >>"$report" 2>&1; then
        echo "== build: gpu-lib/ prebuilt from these sources (sm_90), loaded" | tee -a "$report"
        summary+=("$(printf '%-17s %-26s %4d s' build "prebuilt gpu-lib/" 0)")
    else
        echo "== gpu-lib/ is stale or does not load here: building" | tee -a "$report"
        rm -rf infiniop_py/lib
    fi
fi
[[ -f infiniop_py/lib/libinfiniop.so ]] ||
    step build 240 env XMAKE_COLORTERM=nocolor INFINIOP_PY_CUDA=1 INFINIOP_PY_BUILD_DIR=/tmp/infiniop-build \
        python3 setup.py -q build_ext --inplace ||
    { printf '%s\n' "${summary[@]}"; echo "build failed: see $report"; exit 1; }
step versions 30 python3 -c "import infiniop_py, torch; print(infiniop_py.library_path(), torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'torch sees no GPU')"
# The PyTorch path's C++ autograd nodes, built once here (about 15 s) rather than by each test process at once.
step autograd-nodes 90 python3 -c "from infiniop_py.torch import autograd_nodes; print(autograd_nodes.status())"

# The variants program compiles (nvcc, one core) while the tests run.
variants_build=""
if selected variants; then
    bash scripts/gpu_variants.sh --build-only "$out" >/dev/null 2>&1 &
    variants_build=$!
fi

options=()
python3 -c "import xdist" 2>/dev/null && options+=(-n "$(( $(nproc) >= 16 ? 8 : 4 ))")
python3 -c "import pytest_timeout" 2>/dev/null && options+=(--timeout 90)
# -rfEs: every failure, error and skip with its reason at the end; --durations: where the time went.
step tests 180 python3 -m pytest tests -m nvidia "${options[@]}" -q -p no:cacheprovider -rfEs --durations=15
step host-overhead 60 python3 -m infiniop_py bench --host-overhead --device nvidia --json "$out/host_overhead.json"
step training 240 python3 -m infiniop_py bench --training --device nvidia --json "$out/training.json"
step bench-rows 150 python3 -m infiniop_py bench --device nvidia --ops rms_norm layer_norm --json "$out/bench_rows.json"
step bench-batch-norm 90 python3 -m infiniop_py bench --device nvidia --ops batch_norm \
    --json "$out/bench_batch_norm.json"
# The A/Bs of scripts/gpu_ab_pending: four processes a variant (every case of it in each); in a whole run the budget
# left by then caps it.
[[ -f gpu-ab/base.tar.xz ]] && step ab 300 bash scripts/gpu_ab.sh "$out"
[[ -n "$variants_build" ]] && wait "$variants_build"  # its failure shows in the step, which compiles again
step variants 90 bash scripts/gpu_variants.sh "$out"
step bench-forward 100 python3 -m infiniop_py bench --device nvidia --forward --dtypes bfloat16 float32 \
    --json "$out/bench_forward.json"
for tool in memcheck racecheck initcheck; do
    step "$tool" 60 compute-sanitizer --tool "$tool" --error-exitcode 3 python3 -m infiniop_py smoke --device nvidia
done
step ncu 60 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
    --kernel-name regex:'onePass|splitOutput|chunkSums|rowSums|sumPartials' python3 -c "
import torch, infiniop_py as ip
x, g = (torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16) for _ in range(2))
w = torch.randn(8192, device='cuda', dtype=torch.bfloat16)
ip.rms_norm_backward(g, x, w)
ip.layer_norm_backward(g, w, x, torch.rand(8192, device='cuda', dtype=torch.bfloat16) + 0.5)
torch.cuda.synchronize()"
step backend-memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m pytest tests/test_nvidia_backend.py -q -p no:cacheprovider -x

echo "== summary (report: $report)"
printf '%s\n' "${summary[@]}" | tee -a "$report"
exit "$status"
