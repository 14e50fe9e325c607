#!/usr/bin/env bash
# On the GPU machine (from the repository root, after tests/bench/pack_gpu_service.sh here):
# the service's GPU tests (tests/gpu/service, tests/multigpu), the CUDA IPC and NCCL transport
# benchmarks, and PyTorch's context-parallel baseline. Every step is bounded by `timeout`; logs
# and JSON lines go to $OUT (default ./gpu-out).
#   tests/bench/gpu_checks.sh [tests|ipc|nccl|torch|all]...
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source tests/bench/gpu_env.sh
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
bin=.gpu-service/bin
what=("$@")
((${#what[@]})) || what=(all)
has() { for w in "${what[@]}"; do [[ $w == "$1" || $w == all ]] && return 0; done; return 1; }

{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv; nvidia-smi topo -m; } \
  >"$OUT/machine.txt" 2>&1
if has tests; then
  for t in arena_allocator_test device_memory_pool_test cuda_ipc_test nccl_transport_test \
    device_ipc_service_test; do
    echo "== $t"
    timeout 180 "$bin/$t" --gtest_brief=1 2>&1 | tail -25
  done >"$OUT/tests.log" 2>&1
  grep -E '==|PASSED|FAILED|SKIPPED|Failure' "$OUT/tests.log"
fi
if has ipc; then  # client data plane: CUDA IPC against shared memory and gRPC, GB/s
  timeout 180 "$bin/dfa-device-ipc-bench" 262144 3 >"$OUT/ipc_bench.txt" 2>&1
  cat "$OUT/ipc_bench.txt"
fi
if has nccl; then
  timeout 120 "$bin/dfa-nccl-transport-bench" 2 20 >"$OUT/nccl_bench.txt" 2>&1
  cat "$OUT/nccl_bench.txt"
fi
if has torch; then
  ngpu=$(nvidia-smi -L | wc -l)
  # 2 GPUs: PyTorch context parallelism, head-tail load balance, cuDNN and FA2, causal and full;
  # 16K in all is where per-step latency dominates; then the longest causal S that fits.
  if ((ngpu >= 2)); then
    timeout 420 torchrun --standalone --nproc_per_node=2 tests/bench/torch_cp_bench.py \
      --seq 16384,32768,131072,262144 --masks causal,full --backends cudnn,flash \
      --longest "${DFA_CP_LONGEST:-524288,1048576}" --out "$OUT/torch_cp.jsonl" 2>&1 |
      grep -v -E '^\s*$|Warning|warn\(' | tee "$OUT/torch_cp.log" | tail -40
  fi
  # 1 GPU: plain SDPA on the whole sequence (the reference the 2-GPU runs keep a share of).
  timeout 240 python3 tests/bench/torch_cp_bench.py --seq 32768,131072,262144 \
    --masks causal --backends cudnn,flash --out "$OUT/torch_1gpu.jsonl" 2>&1 |
    grep -v -E 'Warning|warn\(' | tee "$OUT/torch_1gpu.log" | tail -12
fi
