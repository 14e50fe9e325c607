#!/usr/bin/env bash
# The whole service on the GPU machine: coordinator + one dfa-worker per GPU (cuda backend,
# NCCL between them) + the client, then
#   1. a forward+backward job through gRPC verified against PyTorch on the same inputs
#      (dfa-service-io-dump + verify_against_torch.py), for each schedule;
#   2. `dfa bench` on resident seeded inputs: per-GPU TFLOP/s and each worker's idle fraction,
#      on 1 and on all GPUs, schedules ring/distflash/balanced, causal and full;
# and stops every daemon before it returns (bounded waits everywhere).
# Run from the repository root after tests/bench/pack_gpu_service.sh with the targets dfa,
# dfa-coordinator, dfa-worker and dfa-service-io-dump (programs in .gpu-service/).
# Environment: OUT (results, default ./gpu-out), SEQS (default "16384 32768 131072 262144"),
#   SCHEDULES ("ring distflash balanced"), MASKS ("causal full"), GPUS (all), REPEAT (2),
#   VERIFY_SEQ (4096), STEP_TIMEOUT (seconds per dfa command, 240),
#   BACKEND (worker backend: cuda = our kernels, cudnn; default cuda),
#   CONFIGS (lines "GPUS SCHEDULE causal|full SEQ" replacing the default grid),
#   BENCH_ARGS (more `dfa bench` flags for every bench line, e.g. "--doc-lengths L1,L2,..." or
#   "--window 4096": a masked run),
#   PIN (cores per daemon, default unset = no pinning: the coordinator runs on cores [0, PIN),
#   worker g on [(g+1)*PIN, (g+2)*PIN), through taskset; on a VM, thread wake-ups across cores
#   can cost more than the control plane's own work (docs/gpu-service.md).
# $OUT/cpu_throttle.txt: the cgroup CPU limit and throttling counters before and after.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source tests/bench/gpu_env.sh
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
bin=${DFA_GPU_DIR:-$root/.gpu-service}/bin
ngpu=${GPUS:-$(nvidia-smi -L | wc -l)}
SEQS=${SEQS:-"16384 32768 131072 262144"}
SCHEDULES=${SCHEDULES:-"ring distflash balanced"}
MASKS=${MASKS:-"causal full"}
REPEAT=${REPEAT:-2}
VERIFY_SEQ=${VERIFY_SEQ:-4096}
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
run_dir=$(mktemp -d /tmp/dfa-gpu.XXXXXX)

pids=()
stop_all() {
  local p i
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ((i = 0; i < 50; i++)); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  cp "$run_dir"/*.log "$OUT/" 2>/dev/null
}
trap stop_all EXIT

# The CPU limit of this machine's cgroup and its throttling counters (CFS throttling stalls every
# thread of a process for the rest of a period: the request-leg waits of docs/gpu-service.md).
cpu_throttle() {  # cpu_throttle LABEL
  local d
  echo "# $1: nproc $(nproc), affinity $(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')"
  for d in /sys/fs/cgroup /sys/fs/cgroup/cpu /sys/fs/cgroup/cpu,cpuacct; do
    for f in cpu.max cpu.cfs_quota_us cpu.cfs_period_us cpu.stat; do
      [ -r "$d/$f" ] && echo "$d/$f: $(tr '\n' ' ' <"$d/$f")"
    done
  done
  return 0
}
cpu_throttle before >"$OUT/cpu_throttle.txt" 2>&1

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {  # wait_http URL SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$1" \
      2>/dev/null && return 0
    sleep 0.1
  done
  echo "gpu_service: $1 not up after $2 s" >&2
  return 1
}

cport=$(port)
cmport=$(port)
coordinator=127.0.0.1:$cport
pin() {  # pin SLOT: the taskset prefix for daemon SLOT (0 = coordinator, g+1 = worker g)
  [ -n "${PIN:-}" ] || return 0
  echo "taskset -c $(($1 * PIN))-$(($1 * PIN + PIN - 1))"
}
$(pin 0) "$bin/dfa-coordinator" --listen="$coordinator" --metrics_port="$cmport" >"$run_dir/coordinator.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$cmport/metrics" 30 || exit 1
for ((g = 0; g < ngpu; g++)); do
  wp=$(port)
  wm=$(port)
  # One GPU per worker: the worker sees it as device 0; NCCL finds the NVLink path by bus id.
  CUDA_VISIBLE_DEVICES=$g $(pin $((g + 1))) "$bin/dfa-worker" --listen="127.0.0.1:$wp" --advertise="127.0.0.1:$wp" \
    --coordinator="$coordinator" --worker_id="gpu-$g" --backend="${BACKEND:-cuda}" --metrics_port="$wm" \
    ${DFA_WORKER_FLAGS:-} >"$run_dir/worker-$g.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$wm/metrics" 60 || exit 1
done
sleep 1
timeout 20 "$bin/dfa" workers --coordinator "$coordinator" 2>&1 | tee "$OUT/workers.txt"

# 1. Verified job through gRPC, against PyTorch on the same inputs.
for sched in $SCHEDULES; do
  d=$OUT/verify-$sched
  mkdir -p "$d"
  echo "== verify: S=$VERIFY_SEQ causal, $ngpu GPUs, schedule $sched"
  # Checked against PyTorch once the workers are stopped (their pools hold the GPUs' memory).
  timeout 120 "$bin/dfa-service-io-dump" --coordinator "$coordinator" --out "$d" \
    --seq "$VERIFY_SEQ" --workers "$ngpu" --schedule "$sched" || rm -rf "$d"
done

# 2. Throughput on resident seeded inputs.
bench() {  # bench GPUS SCHEDULE MASK SEQ
  echo "== bench gpus=$1 schedule=$2 mask=$3 seq=$4 t=$(date +%s)"
  timeout "$STEP_TIMEOUT" "$bin/dfa" bench --coordinator "$coordinator" --workers "$1" \
    --schedule "$2" --"$3" --seq "$4" --heads 32 --head-dim 128 --dtype bf16 \
    --repeat "$REPEAT" --skip-transfer --skip-single ${BENCH_ARGS:-} 2>&1
  echo "== exit $?"
}
{
  if [ -n "${CONFIGS:-}" ]; then
    echo "$CONFIGS"
  else
    # Default grid: 1 GPU (the schedule does not matter there), then every schedule on all GPUs.
    for mask in $MASKS; do
      for s in $SEQS; do
        [[ $mask == full && $s -lt 32768 ]] && continue
        [[ $s == 32768 || $s == 262144 ]] && echo "1 balanced $mask $s"
        if ((ngpu > 1)); then
          for sched in $SCHEDULES; do
            # distflash is a causal schedule; for full attention it is the ring.
            [[ $mask == full && $sched == distflash ]] && continue
            [[ $mask == full && $s == 131072 ]] && continue
            echo "$ngpu $sched $mask $s"
          done
        fi
      done
    done
  fi
} | while read -r g sched mask s; do
  [ -n "$g" ] && bench "$g" "$sched" "$mask" "$s" </dev/null
done 2>&1 | tee "$OUT/bench.log" | grep -E '^==|^forward|^backward|worker [0-9]+:|rror'
python3 tests/bench/summarize_bench.py "$OUT/bench.log" | tee "$OUT/bench_table.md"
cpu_throttle after >>"$OUT/cpu_throttle.txt" 2>&1
stop_all
pids=()
grep -h "device memory pool" "$run_dir"/worker-*.log 2>/dev/null | tee "$OUT/pool.txt"
for d in "$OUT"/verify-*/; do
  [ -f "$d/meta.json" ] || continue
  sched=$(basename "$d")
  timeout 120 python3 tests/bench/verify_against_torch.py "$d" 2>&1 | tail -6 | tee "$OUT/$sched.txt"
  rm -rf "$d"
done
