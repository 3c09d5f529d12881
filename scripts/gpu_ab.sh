#!/usr/bin/env bash
# Issue 53's A/B of library builds on an NVIDIA GPU: each gpu-ab/NAME.tar.xz (scripts/prebuild_gpu_ab.sh) timed
# against gpu-ab/base.tar.xz by scripts/ab.py --device nvidia --cases (two processes a side, ABBA, each timing every
# case of the variant as `bench --device nvidia` times it, in CUDA graphs), on the cases of gpu-ab/CASES (one line
# of ab.py options each, optionally after "[NAME,NAME2] ": then for those variants only; without that file, the
# cases below: issue 53's losing BatchNorm shapes, ResNet-50's channels-last layers, and one row norm of each
# kind). From the repository root, the package importable with its Python dependencies (the `ab` step of
# scripts/verify_gpu.sh runs it so):
#   bash scripts/gpu_ab.sh [DIR]     (DIR: $OUT where that is set, else gpu-report/)
# DIR/ab.txt: each build's revision, then a report per variant and case (B/A time: under 1 means the variant is
# faster; "same bits" or not); DIR/ab.json: the reports. Exit status 0 when every comparison ran.
set -uo pipefail
cd "$(dirname "$0")/.."
out="$(realpath -m "${1:-${OUT:-gpu-report}}")"
mkdir -p "$out"
[[ -f gpu-ab/base.tar.xz ]] || { echo "no gpu-ab/base.tar.xz: see scripts/prebuild_gpu_ab.sh" >&2; exit 2; }
default_cases=(
    "--op batch_norm --dtype float16 --shape 32x256x32x32"
    "--op batch_norm --dtype float16 --shape 128x512x7x7"
    "--op batch_norm --dtype float32 --shape 128x512x7x7"
    "--op batch_norm --dtype bfloat16 --shape 128x2048x7x7 --layout channels_last"
    "--op batch_norm --dtype bfloat16 --shape 128x1024x14x14 --layout channels_last"
    "--op batch_norm --dtype bfloat16 --shape 128x256x56x56 --layout channels_last"
    "--op rms_norm --dtype bfloat16 --shape 8192x8192"
    "--op layer_norm_from_input --dtype bfloat16 --shape 8192x8192"
)
cases=("${default_cases[@]}")
[[ -f gpu-ab/CASES ]] && mapfile -t cases < <(grep -Ev '^[[:space:]]*(#|$)' gpu-ab/CASES)
libs=/tmp/infiniop-ab-libs
rm -rf "$libs"
: >"$out/ab.txt"
for archive in gpu-ab/*.tar.xz; do
    name="$(basename "$archive" .tar.xz)"
    mkdir -p "$libs/$name" && tar -C "$libs/$name" -xJf "$archive" || exit 1
    echo "$name: $(cat "$libs/$name/REVISION")" | tee -a "$out/ab.txt"
done
status=0
for variant in "$libs"/*; do
    [[ -d "$variant" ]] || continue
    name="$(basename "$variant")"
    [[ "$name" == base ]] && continue
    : >"$libs/$name.cases"
    for line in "${cases[@]}"; do
        case="$line"
        if [[ "$line" =~ ^\[([^]]*)\][[:space:]]*(.*)$ ]]; then  # [variants] options: those variants only
            [[ ",${BASH_REMATCH[1]}," == *",$name,"* ]] || continue
            case="${BASH_REMATCH[2]}"
        fi
        echo "== $name against base: $case" | tee -a "$out/ab.txt"
        echo "$case" >>"$libs/$name.cases"
    done
    [[ -s "$libs/$name.cases" ]] || continue
    # Every case of this variant in one process a side (ABBA: two each), so that torch's and CUDA's start is paid
    # four times a variant rather than twice a case; a case that fails is reported so, and the others still run.
    python3 scripts/ab.py "$libs/base" "$variant" --device nvidia --processes 2 --calls 20 \
        --cases "$libs/$name.cases" --json >"$libs/$name.json" 2>>"$out/ab.txt" || status=1
    # A JSON file that holds no report (the run failed before its first case) fails the variant.
    if reports=$(python3 -c 'import json, sys; sys.path.insert(0, "scripts"); import ab
for report in json.load(open(sys.argv[1])): print(ab.format_report(report))' "$libs/$name.json" 2>/dev/null) \
        && [[ -n "$reports" ]]; then
        echo "$reports" | tee -a "$out/ab.txt"
    else
        echo "$name: failed: see above" | tee -a "$out/ab.txt"
        rm -f "$libs/$name.json"
        status=1
    fi
done
python3 -c 'import json, sys
print(json.dumps([r for path in sys.argv[1:] for r in json.load(open(path))], indent=1))' \
    $(compgen -G "$libs/*.json") >"$out/ab.json"
exit "$status"
