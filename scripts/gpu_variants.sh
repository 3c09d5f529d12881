#!/usr/bin/env bash
# Issue 53's kernel A/B experiment on an NVIDIA GPU (sm_90): builds scripts/gpu_variants/row_backward_variants.cu
# against the libraries built in place (infiniop_py/lib, as verify_gpu.sh's build step leaves them; or
# $INFINIOP_PY_LIBRARY_DIR) and runs it: the library's RMSNorm backward against the candidate kernels and a copy,
# checked and timed (about a minute). From the repository root:
#   bash scripts/gpu_variants.sh [DIR] [-- PROGRAM OPTIONS]   (DIR: $OUT where that is set, else gpu-report/)
#   bash scripts/gpu_variants.sh --build-only [DIR]            (compile only: verify_gpu.sh starts it early)
# PROGRAM OPTIONS: --shapes 8192x8192,... --impls library,cta8,... --dtypes bf16,f16 --rounds N (see the .cu header).
# DIR/variants.txt: registers and spills per kernel (ptxas), then the table; DIR/variants.csv: the rows.
# On a lent GPU machine, libraries included, in one device call:
#   run(command="VERIFY_GPU_STEPS=variants bash scripts/verify_gpu.sh", carry=[".whl", "gpu-lib"], timeout_s=420)
set -uo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [[ "${1:-}" == --build-only ]]; then
    build_only=1
    shift
fi
dir="${OUT:-gpu-report}"
if [[ $# -gt 0 && "$1" != -* ]]; then
    dir="$1"
    shift
fi
[[ "${1:-}" == -- ]] && shift
out="$(realpath -m "$dir")"
lib="$(realpath -m "${INFINIOP_PY_LIBRARY_DIR:-infiniop_py/lib}")"
source=scripts/gpu_variants/row_backward_variants.cu
program="${GPU_VARIANTS_PROGRAM:-/tmp/infiniop-gpu-variants/row_backward_variants}"
log="$out/variants.txt"

if [[ ! -f "$lib/libinfiniop.so" ]]; then
    echo "no $lib/libinfiniop.so: build the libraries with CUDA first (VERIFY_GPU_STEPS=variants bash" \
        "scripts/verify_gpu.sh does), or set INFINIOP_PY_LIBRARY_DIR" >&2
    exit 2
fi
mkdir -p "$out" "$(dirname "$program")"
if [[ ! -x "$program" || ! -f "$program.summary" || "$source" -nt "$program" ||
    "$lib/libinfiniop.so" -nt "$program" ]]; then
    started=$SECONDS
    if ! nvcc -std=c++17 -O3 -arch=sm_90 -Inative/include -Xptxas -v -Xcompiler=-Wall,-Wextra -o "$program" \
        "$source" -L"$lib" -linfiniop -linfinirt -Xlinker -rpath,"$lib" >"$program.log" 2>&1; then
        cat "$program.log" >"$log"
        cat "$program.log" >&2
        echo "nvcc failed: see $log" >&2
        exit 1
    fi
    # One line per kernel, from ptxas's report: registers, shared memory, stack frame and spills.
    {
        echo "built in $((SECONDS - started)) s: $program"
        grep -iE "warning|error" "$program.log"
        awk '/Compiling entry function/ { split($0, quoted, "\047"); name = quoted[2] }
             /bytes stack frame/ { split($0, n, /[^0-9]+/); frame = n[2] " B stack, " n[3] "/" n[4] " B spilled" }
             /Used [0-9]+ registers/ { match($0, /Used [0-9]+/); regs = substr($0, RSTART + 5, RLENGTH - 5)
                                       smem = match($0, /[0-9]+ bytes smem/) ? substr($0, RSTART, RLENGTH - 11) : 0
                                       print name "\t" regs " regs, " smem " B smem, " frame }' "$program.log" |
            while IFS=$'\t' read -r name numbers; do
                name="$( (command -v c++filt >/dev/null && c++filt <<<"$name") || echo "$name")"
                printf '%-40s %s\n' "${name%%(*}" "$numbers"
            done
    } >"$program.summary"
fi
cp "$program.summary" "$log"
cat "$log"
((build_only)) && exit 0
"$program" "$out" "$@" 2>&1 | tee -a "$log"
