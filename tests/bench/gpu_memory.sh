#!/usr/bin/env bash
# Session memory on one GPU (docs/memory.md), in one bounded call on the GPU machine:
#   1. session_memory_gpu_test: the device pool's peak against the bytes admission charges;
#   2. a forward+backward job through gRPC verified against PyTorch with key chunks of 1024
#      rows (the chunked backward, gradients written in bf16 into Q's, K's and V's memory);
#   3. `dfa bench` at 256K causal (32 heads x 128, bf16, one cudnn worker, balanced) with the
#      default --step_tokens and with one chunk (--step_tokens=262144), and at LONG_SEQ: the
#      throughput and the worker's pool peak (its log's "device memory pool" line);
#   4. PyTorch SDPA (cuDNN) at 256K causal on the same GPU: throughput and peak memory.
# Run from the repository root after
#   tests/bench/pack_gpu_service.sh build dfa dfa-coordinator dfa-worker dfa-service-io-dump \
#     session_memory_gpu_test
# with the bundle in DFA_GPU_DIR (default .gpu-service). Environment: OUT (default ./gpu-out),
# LONG_SEQ (default 1048576; empty: skip), REPEAT (default 2).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source tests/bench/gpu_env.sh
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
bin=$DFA_GPU_DIR/bin
LONG_SEQ=${LONG_SEQ-1048576}
REPEAT=${REPEAT:-2}
export DFA_GPU_DIR BACKEND=cudnn GPUS=1 STEP_TIMEOUT=${STEP_TIMEOUT:-240}

echo "== session_memory_gpu_test"
timeout 120 "$bin/session_memory_gpu_test" 2>&1 | tee "$OUT/session_memory_gpu_test.txt" | tail -8

run() {  # run NAME [env...]: one gpu_service.sh call (its own coordinator and worker)
  local name=$1
  shift
  echo "== $name $*"
  env OUT="$OUT/$name" "$@" timeout 280 tests/bench/gpu_service.sh >"$OUT/$name.log" 2>&1
  echo "exit $?"
  grep -h "device memory pool" "$OUT/$name"/pool.txt 2>/dev/null
  grep -E "^forward|^backward" "$OUT/$name/bench.log" 2>/dev/null | tail -4
  tail -3 "$OUT/$name"/verify-*.txt 2>/dev/null
}
run verify-chunked SCHEDULES=balanced VERIFY_SEQ=4096 CONFIGS=" " DFA_WORKER_FLAGS=--step_tokens=1024
run bench-256k SCHEDULES=" " REPEAT="$REPEAT" CONFIGS="1 balanced causal 262144"
run bench-256k-one-chunk SCHEDULES=" " REPEAT="$REPEAT" CONFIGS="1 balanced causal 262144" \
  DFA_WORKER_FLAGS=--step_tokens=262144
echo "== PyTorch SDPA cuDNN 256K causal"
timeout 120 python3 tests/bench/torch_cp_bench.py --seq 262144 --masks causal --backends cudnn \
  2>&1 | tee "$OUT/sdpa.txt" | tail -4
if [ -n "$LONG_SEQ" ]; then
  run "bench-$LONG_SEQ" SCHEDULES=" " REPEAT=1 CONFIGS="1 balanced causal $LONG_SEQ"
fi
