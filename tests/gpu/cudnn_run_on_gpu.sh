#!/usr/bin/env bash
# Runs the cuDNN backend's test and benchmark on the GPU machine, next to PyTorch SDPA's own
# FlashAttention-2 and cuDNN backends (tests/gpu/bench_sdpa.py) in the same run.
# Expects .cache/gpu-cudnn from tests/gpu/cudnn_pack_for_gpu.sh; logs go to $OUT (default gpu-out).
#   tests/gpu/cudnn_run_on_gpu.sh [test] [bench] [bench-quick] [bench-sdpa]
set -uo pipefail
G=${G:-.cache/gpu-cudnn}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# cuDNN 9 from PyTorch's environment (libcudnn.so.9 loads its engine libraries from the same folder).
cudnn_lib=$(python3 -c 'import nvidia.cudnn as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${cudnn_lib:+$cudnn_lib:}$PWD/$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUDNN_FRONTEND_CUDART_LIB_NAME=$PWD/$G/lib/libcudart.so.13
nvidia-smi -L
echo "cudnn lib: $cudnn_lib"; ls "$cudnn_lib" 2>/dev/null | head -3
for step in "$@"; do
  echo "=== $step"
  case $step in
    test) timeout 240 "$G/cudnn_backend_test" 2>&1 | tee "$OUT/cudnn_test.log" |
      grep -E "cuDNN|OK|FAIL|SKIP|Failure|Expected|Which is|error|rel|trace|fallback|actual" | head -80 ;;
    bench) timeout 300 "$G/dfa_cudnn_bench" 2>&1 | tee "$OUT/cudnn_bench.md" ;;
    bench-quick) timeout 120 "$G/dfa_cudnn_bench" --quick 2>&1 | tee "$OUT/cudnn_bench.md" ;;
    bench-sdpa) timeout 300 python3 tests/gpu/bench_sdpa.py 2>&1 | tee "$OUT/bench_sdpa.md" ;;
    *) echo "unknown step $step" ;;
  esac
done
