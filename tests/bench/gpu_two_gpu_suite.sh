#!/usr/bin/env bash
# The two-GPU suite in one device call (nvidia-h200-x2; from the repository root, programs packed
# in .gpu-service/ by tests/bench/pack_gpu_service.sh with gpu_service.sh's targets plus
# nccl_transport_test, device_memory_pool_test and nccl_client_group_test): those tests (the
# last is the NCCL client path, docs/data-plane.md), the whole service
# (gpu_service.sh: verify vs PyTorch + dfa bench grid), then PyTorch's context parallelism on the
# same shapes. Every part is bounded; results under $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
source tests/bench/gpu_env.sh
echo "== tests"
for t in nccl_transport_test device_memory_pool_test nccl_client_group_test; do
  timeout 120 .gpu-service/bin/$t --gtest_brief=1 2>&1 | grep -E 'PASSED|FAILED|Failure|tests from|over NCCL in' 
done
echo "== service"
timeout "${SERVICE_TIMEOUT:-330}" tests/bench/gpu_service.sh 2>&1 | tail -60
echo "== pytorch context parallelism (2 GPUs)"
timeout "${TORCH_TIMEOUT:-200}" torchrun --standalone --nproc_per_node=2 tests/bench/torch_cp_bench.py \
  --seq "${TORCH_SEQS:-16384,32768,131072,262144}" --masks "${TORCH_MASKS:-causal,full}" --backends cudnn,flash \
  --out "$OUT/torch_cp.jsonl" 2>&1 | grep -E 'torch_cp|FAILED|longest|Error' | tee "$OUT/torch_cp.log"
