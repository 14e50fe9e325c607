#!/usr/bin/env bash
# Runs the GPU kernel tests and benchmarks on the GPU machine (see docs/kernels-cuda.md), from the
# repository root. Expects the programs and their libraries in $G (default .cache/gpu-kernels,
# made here by tests/gpu/pack_for_gpu.sh) and writes logs to $OUT (default ./gpu-out).
#   tests/gpu/run_on_gpu.sh STEP...
# Steps:
#   test              cuda_backend_test (every kernel of the table, each forced in turn)
#   check             dfa_sdpa_cases + sdpa_check.py: the table's kernels against PyTorch SDPA
#   check-all         the same for each forced kernel choice in $CHOICES (below)
#   bench             dfa-cuda-kernel-bench (all configs; extra flags in $BENCH_ARGS)
#   bench-quick       the same with --quick
#   bench-choices     the quick bench at head dim 128 for each choice in $CHOICES, in a row
#   bench-ab          $ROUNDS rounds (default 3), alternating: the quick bench at head dim 128,
#                     the same bench of another build when $BASE_BENCH names one (an A/B at
#                     equal conditions), and PyTorch SDPA (FlashAttention-2, cuDNN; AB_SDPA=0: not)
#   bench-masks       dfa-cuda-kernel-bench --masks: documents and windows next to dense causal
#                     (its document offsets into /tmp/dfa-docs for bench-flex)
#   bench-masks-ab    $ROUNDS rounds, alternating: --masks --quick (64K) of this build and of
#                     $BASE_BENCH (required): an A/B of the masked kernels at equal conditions
#   bench-flex        tests/gpu/bench_flex.py: PyTorch flex attention on the same masks (after
#                     bench-masks; flags in $FLEX_ARGS, default S = 64K)
#   bench-sdpa        tests/gpu/bench_sdpa.py (bench-sdpa-quick: --quick)
#   cudnn-test        cudnn_backend_test (libcudnn from PyTorch's environment)
#   cudnn-bench       dfa_cudnn_bench (cudnn-bench-quick: --quick)
#   times-locked      kernel-only TFLOP/s per quick-bench row at the locked base clock (ncu; two
#                     runs pooled; docs/kernels-profiling.md: the way to compare binaries)
#   times-locked-masks  the same for the --masks rows (BENCH_ARGS=--quick: 64K only)
# $CHOICES: kernel choices as comma-separated flags of tests/gpu/kernel_flags.h, "-" for the
# table; default "- --fwd-kernel=cpasync,--bwd-kernel=cpasync --fwd-kernel=mma,--bwd-kernel=mma
# --bwd-tile-chunk=0".
set -uo pipefail
G=${G:-.cache/gpu-kernels}
OUT=${OUT:-gpu-out}
ROUNDS=${ROUNDS:-3}
CHOICES=${CHOICES:-"- --fwd-kernel=cpasync,--bwd-kernel=cpasync --fwd-kernel=mma,--bwd-kernel=mma --bwd-tile-chunk=0"}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
flags() { [ "$1" = - ] || echo "${1//,/ }"; }
use_cudnn() {  # cuDNN 9 from PyTorch's environment; the frontend loads the bundled libcudart
  local lib
  lib=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
  echo "cudnn lib: ${lib:-not found}"
  export LD_LIBRARY_PATH=${lib:+$lib:}$LD_LIBRARY_PATH
  export CUDNN_FRONTEND_CUDART_LIB_NAME=$PWD/$G/lib/libcudart.so.13
}
cases() {  # cases DIR [FLAGS...]: writes the SDPA cases and checks them
  rm -rf "$1" && mkdir -p "$1" && timeout 60 "$G/dfa_sdpa_cases" "$@" &&
    timeout 180 python3 tests/gpu/sdpa_check.py "$1"
}
nvidia-smi -L
for step in "$@"; do
  echo "=== $step"
  case $step in
    test) timeout 180 "$G/cuda_backend_test" 2>&1 | tee "$OUT/test.log" |
      grep -E "OK \]|FAILED|SKIPPED|PASSED|Failure|Expected|Which is|error|rel|trace" | head -80 ;;
    check) cases /tmp/dfa-cases 2>&1 | tee "$OUT/sdpa_check.log" ;;
    check-all) for c in $CHOICES; do echo "# choice $c"; cases /tmp/dfa-cases $(flags "$c"); echo "rc=$?"
      done 2>&1 | tee "$OUT/sdpa_check_all.log" | grep -E "^#|FAIL|failing|rc=|error" ;;
    bench) timeout 300 "$G/dfa-cuda-kernel-bench" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.md" ;;
    bench-quick) timeout 120 "$G/dfa-cuda-kernel-bench" --quick ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_quick.md" ;;
    bench-choices) for c in $CHOICES; do echo "# choice $c"
        timeout 60 "$G/dfa-cuda-kernel-bench" --quick --hdim 128 $(flags "$c")
      done 2>&1 | tee "$OUT/bench_choices.md" ;;
    bench-ab) for r in $(seq "$ROUNDS"); do
        echo "# round $r: dfa-cuda-kernel-bench"; timeout 60 "$G/dfa-cuda-kernel-bench" --quick --hdim 128
        if [ -n "${BASE_BENCH:-}" ]; then
          echo "# round $r: base $BASE_BENCH"; timeout 60 "$BASE_BENCH" --quick --hdim 128
        fi
        if [ "${AB_SDPA:-1}" != 0 ]; then
          echo "# round $r: PyTorch SDPA"; timeout 120 python3 tests/gpu/bench_sdpa.py --quick --hdim 128
        fi
      done 2>&1 | tee "$OUT/bench_ab.md" ;;
    bench-masks) mkdir -p /tmp/dfa-docs
      timeout 300 "$G/dfa-cuda-kernel-bench" --masks --docs-out /tmp/dfa-docs ${BENCH_ARGS:-} 2>&1 |
        tee "$OUT/bench_masks.md" ;;
    bench-masks-ab) if [ -z "${BASE_BENCH:-}" ]; then echo "bench-masks-ab: set BASE_BENCH"; continue; fi
      for r in $(seq "$ROUNDS"); do
        echo "# round $r: dfa-cuda-kernel-bench"; timeout 100 "$G/dfa-cuda-kernel-bench" --masks --quick
        echo "# round $r: base $BASE_BENCH"; timeout 100 "$BASE_BENCH" --masks --quick
      done 2>&1 | tee "$OUT/bench_masks_ab.md" ;;
    bench-flex) timeout "${FLEX_TIMEOUT:-240}" python3 tests/gpu/bench_flex.py /tmp/dfa-docs ${FLEX_ARGS:-} 2>&1 |
        tee "$OUT/bench_flex.md" | grep -v Warning ;;
    bench-sdpa) timeout 300 python3 tests/gpu/bench_sdpa.py 2>&1 | tee "$OUT/bench_sdpa.md" ;;
    bench-sdpa-quick) timeout 200 python3 tests/gpu/bench_sdpa.py --quick 2>&1 | tee "$OUT/bench_sdpa.md" ;;
    cudnn-test) (use_cudnn; timeout 300 "$G/cudnn_backend_test") 2>&1 | tee "$OUT/cudnn_test.log" |
      grep -E "cuDNN|cudnn lib|OK \]|FAILED|SKIPPED|PASSED|Failure|Expected|Which is|error|rel|trace|fallback|actual" | head -80 ;;
    cudnn-bench) (use_cudnn; timeout 300 "$G/dfa_cudnn_bench") 2>&1 | tee "$OUT/cudnn_bench.md" ;;
    cudnn-bench-quick) (use_cudnn; timeout 120 "$G/dfa_cudnn_bench" --quick) 2>&1 | tee "$OUT/cudnn_bench.md" ;;
    times-locked) for k in bwd fwd; do [ $k = bwd ] && re=FlashBwd || re=FlashFwd
        for r in 1 2; do timeout 300 ncu --clock-control base --metrics gpu__time_duration.sum \
          --kernel-name "regex:$re" --csv "$G/dfa-cuda-kernel-bench" --quick --reps 1 > "$OUT/times_${k}_$r.csv" 2>&1; done
        echo "# $k kernels, locked base clock"; python3 tests/gpu/ncu_kernel_times.py $k "$OUT"/times_${k}_*.csv
      done 2>&1 | tee "$OUT/times_locked.md" ;;
    times-locked-masks) for k in bwd fwd; do [ $k = bwd ] && re=FlashBwd || re=FlashFwd
        for r in 1 2; do timeout 300 ncu --clock-control base --metrics gpu__time_duration.sum \
          --kernel-name "regex:$re" --csv "$G/dfa-cuda-kernel-bench" --masks --rounds 1 --reps 1 \
          ${BENCH_ARGS:-} > "$OUT/times_masks_${k}_$r.csv" 2>&1; done
        echo "# $k kernels, locked base clock"
        python3 tests/gpu/ncu_kernel_times.py $k-masks "$OUT"/times_masks_${k}_*.csv
      done 2>&1 | tee "$OUT/times_locked_masks.md" ;;
    *) echo "unknown step $step" ;;
  esac
done
