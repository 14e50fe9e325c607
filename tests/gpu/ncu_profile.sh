#!/usr/bin/env bash
# Full Nsight Compute profile of ONE kernel launch of a program, on the GPU machine, with the two
# exports that tests/gpu/ncu_sass_stats.py and a reader need (docs/kernels-profiling.md):
#   tests/gpu/ncu_profile.sh OUTDIR NAME KERNEL_REGEX SKIP -- PROGRAM [ARGS...]
# profiles the (SKIP+1)-th launch whose kernel name matches KERNEL_REGEX and writes
# OUTDIR/NAME.ncu-rep, NAME.details.txt (all sections), NAME.sass.csv (per-SASS-instruction
# warp-stall samples and memory counters). Clocks are left alone (--clock-control none), as the
# benchmarks run. Example (bf16 D=128 16K causal backward: the bench's third pipe-kernel launch):
#   tests/gpu/ncu_profile.sh $OUT bwd16k FlashBwdSm90PipeKernel 2 -- \
#     .cache/gpu-kernels/dfa-cuda-kernel-bench --quick --hdim 128 --reps 1
set -euo pipefail
if [ $# -lt 6 ] || [ "$5" != "--" ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
out=$1 name=$2 regex=$3 skip=$4
shift 5
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu not found" >&2; exit 2; }
mkdir -p "$out"
"$ncu" --clock-control none --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 \
  --set full --import-source no -f -o "$out/$name" "$@" > "$out/$name.log" 2>&1
"$ncu" -i "$out/$name.ncu-rep" --page details > "$out/$name.details.txt"
"$ncu" -i "$out/$name.ncu-rep" --page source --print-source sass --csv > "$out/$name.sass.csv"
grep -E "Duration|SM Frequency|Registers Per|Issue Slots Busy" "$out/$name.details.txt" || true
