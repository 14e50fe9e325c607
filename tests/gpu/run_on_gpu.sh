#!/usr/bin/env bash
# Runs the GPU kernel checks and benchmarks on the GPU machine (see docs/kernels-cuda.md).
# Expects the binaries and their bundled libraries in $G (default .gpu-kernels, built here
# with tests/gpu/pack_for_gpu.sh) and writes logs to $OUT (default ./gpu-out).
#   tests/gpu/run_on_gpu.sh [test] [test-mma] [test-cpasync] [test-bwdtma] [test-bwdpipe]
#                           [check] [bench-cpasync-quick] [bench-bwd-quick]
#                           [bench-nopp-quick] [bench-dfa] [bench-dfa-quick]
#                           [bench-mma] [bench-mma-quick] [bench-sdpa] [bench-sdpa-quick]
#                           [test-bwdsched] [bench-env-quick] [times-locked]
# *-mma steps set DFA_CUDA_NO_WGMMA=1 (the sm_80 mma.sync kernels, for comparison on Hopper);
# *-cpasync steps set DFA_CUDA_FWD_WS=0 (Hopper forward on the cp.async kernel, not the TMA one);
# bench-nopp-quick turns its ping-pong off; test-bwdtma sets DFA_CUDA_BWD_PIPE=0 (Hopper backward on
# the atomic-dQ TMA kernel instead of the default pipe kernel), test-bwdpipe runs the test and
# the SDPA check for each pipe mode in $PIPE_MODES (default 1..5); bench-bwd-quick runs the quick
# bench for the default, each pipe mode in $BENCH_PIPE_MODES (default 0..5) and the cp.async kernel
# (DFA_CUDA_BWD_WS=0; left out when BENCH_PIPE_MODES is set) in a row. test-bwdsched runs the test
# and the SDPA check with the pipe backward's non-default scheduling / epilogue switches
# (DFA_CUDA_BWD_ORDER=3, DFA_CUDA_BWD_START=2, DFA_CUDA_BWD_EPILOGUE=1, then =0 with ORDER=4);
# bench-env-quick runs the quick bench at head dim 128 ROUNDS times (default 3) for each setting in
# $BENCH_ENVS (space-separated settings, each a comma-separated list of VAR=VALUE; "-" = defaults),
# alternating them, e.g. BENCH_ENVS="- DFA_CUDA_BWD_ORDER=0,DFA_CUDA_BWD_EPILOGUE=0".
# times-locked: kernel-only TFLOP/s per quick-bench row at the locked base clock (ncu; backward
# and forward kernels, two runs pooled; docs/kernels-profiling.md: the way to compare binaries).
set -uo pipefail
G=${G:-.gpu-kernels}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi -L
for step in "$@"; do
  echo "=== $step"
  case $step in
    test) timeout 120 "$G/cuda_backend_test" 2>&1 | tee "$OUT/test.log" | grep -E "OK|FAIL|SKIP|Failure|Expected|Which is|error|rel|trace" | head -60 ;;
    check) mkdir -p /tmp/dfa-cases && timeout 60 "$G/dfa_sdpa_cases" /tmp/dfa-cases &&
      timeout 180 python3 tests/gpu/sdpa_check.py /tmp/dfa-cases 2>&1 | tee "$OUT/sdpa_check.log" ;;
    bench-dfa) timeout 300 "$G/dfa_kernel_bench" 2>&1 | tee "$OUT/bench_dfa.md" ;;
    bench-dfa-quick) timeout 120 "$G/dfa_kernel_bench" --quick 2>&1 | tee "$OUT/bench_dfa.md" ;;
    test-cpasync) DFA_CUDA_FWD_WS=0 timeout 120 "$G/cuda_backend_test" 2>&1 | tee "$OUT/test_cpasync.log" | grep -E "OK|FAIL|SKIP|Failure|error" | head -30 ;;
    bench-cpasync-quick) DFA_CUDA_FWD_WS=0 timeout 120 "$G/dfa_kernel_bench" --quick 2>&1 | tee "$OUT/bench_cpasync.md" ;;
    bench-nopp-quick) DFA_CUDA_FWD_PINGPONG=0 timeout 120 "$G/dfa_kernel_bench" --quick 2>&1 | tee "$OUT/bench_nopp.md" ;;
    test-bwdtma) DFA_CUDA_BWD_PIPE=0 timeout 60 "$G/cuda_backend_test" 2>&1 | tee "$OUT/test_bwdtma.log" | grep -E "OK|FAIL|SKIP|Failure|error" | head -30 ;;
    test-bwdpipe) for m in ${PIPE_MODES:-1 2 3 4 5}; do echo "# DFA_CUDA_BWD_PIPE=$m"; DFA_CUDA_BWD_PIPE=$m timeout 60 "$G/cuda_backend_test" &&
      rm -rf /tmp/dfa-cases && mkdir -p /tmp/dfa-cases && DFA_CUDA_BWD_PIPE=$m timeout 60 "$G/dfa_sdpa_cases" /tmp/dfa-cases &&
      timeout 120 python3 tests/gpu/sdpa_check.py /tmp/dfa-cases; echo "rc=$?"; done 2>&1 | tee "$OUT/test_bwdpipe.log" | grep -E "^#|OK \]|FAIL|failing|rc=" ;;
    bench-bwd-quick) vs="DFA_CUDA_BWD_PIPE="; for m in ${BENCH_PIPE_MODES:-0 1 2 3 4 5}; do vs="$vs DFA_CUDA_BWD_PIPE=$m"; done
      [ -z "${BENCH_PIPE_MODES:-}" ] && vs="$vs DFA_CUDA_BWD_WS=0"
      for v in $vs; do echo "# $v"; env $v timeout 60 "$G/dfa_kernel_bench" --quick; done 2>&1 | tee "$OUT/bench_bwd.md" ;;
    test-bwdsched) for v in DFA_CUDA_BWD_ORDER=3,DFA_CUDA_BWD_START=2,DFA_CUDA_BWD_EPILOGUE=1 \
        DFA_CUDA_BWD_ORDER=4,DFA_CUDA_BWD_EPILOGUE=0; do echo "# ${v//,/ }"; env ${v//,/ } timeout 60 "$G/cuda_backend_test" &&
      rm -rf /tmp/dfa-cases && mkdir -p /tmp/dfa-cases && env ${v//,/ } timeout 60 "$G/dfa_sdpa_cases" /tmp/dfa-cases &&
      timeout 120 python3 tests/gpu/sdpa_check.py /tmp/dfa-cases; echo "rc=$?"; done 2>&1 | tee "$OUT/test_bwdsched.log" | grep -E "^#|OK \]|FAIL|failing|rc=" ;;
    bench-env-quick) for r in $(seq "${ROUNDS:-3}"); do for v in ${BENCH_ENVS:--}; do echo "# round $r: $v"
        if [ "$v" = - ]; then timeout 60 "$G/dfa_kernel_bench" --quick --hdim 128; else env ${v//,/ } timeout 60 "$G/dfa_kernel_bench" --quick --hdim 128; fi
      done; done 2>&1 | tee "$OUT/bench_env.md" ;;
    test-mma) DFA_CUDA_NO_WGMMA=1 timeout 120 "$G/cuda_backend_test" 2>&1 | tee "$OUT/test_mma.log" | grep -E "OK|FAIL|SKIP|Failure|error" | head -30 ;;
    bench-mma) DFA_CUDA_NO_WGMMA=1 timeout 300 "$G/dfa_kernel_bench" 2>&1 | tee "$OUT/bench_mma.md" ;;
    bench-mma-quick) DFA_CUDA_NO_WGMMA=1 timeout 120 "$G/dfa_kernel_bench" --quick 2>&1 | tee "$OUT/bench_mma.md" ;;
    bench-sdpa-quick) timeout 200 python3 tests/gpu/bench_sdpa.py --quick 2>&1 | tee "$OUT/bench_sdpa.md" ;;
    bench-sdpa) timeout 300 python3 tests/gpu/bench_sdpa.py 2>&1 | tee "$OUT/bench_sdpa.md" ;;
    times-locked) for k in bwd fwd; do [ $k = bwd ] && re=FlashBwd || re=FlashFwd
        for r in 1 2; do timeout 300 ncu --clock-control base --metrics gpu__time_duration.sum \
          --kernel-name "regex:$re" --csv "$G/dfa_kernel_bench" --quick --reps 1 > "$OUT/times_${k}_$r.csv" 2>&1; done
        echo "# $k kernels, locked base clock"; python3 tests/gpu/ncu_kernel_times.py $k "$OUT"/times_${k}_*.csv
      done 2>&1 | tee "$OUT/times_locked.md" ;;
    *) echo "unknown step $step" ;;
  esac
done
