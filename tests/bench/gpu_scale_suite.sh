#!/usr/bin/env bash
# The scale run in one device call on nvidia-h200-x4 or nvidia-h200-x8, from the
# repository root, programs packed in .gpu-service/ by tests/bench/pack_gpu_service.sh with the
# targets dfa, dfa-coordinator, dfa-worker and dfa-service-io-dump (docs/scale.md):
#   1. coordinator + one dfa-worker per GPU (NCCL between them), started once;
#   2. a forward+backward job through gRPC on all GPUs per schedule, dumped for a check against
#      PyTorch (dfa-service-io-dump; checked once the workers are stopped: their pools hold the
#      GPUs);
#   3. `dfa bench` forward+backward on resident seeded inputs, 32 heads, D=128, bf16, for every
#      worker count in SIZES (default: 2 = the baseline, and all GPUs), causal and full, S in SEQS,
#      each schedule; per-GPU TFLOP/s and every worker's idle fraction;
#   4. the longest causal S that fits and finishes (balanced, all GPUs; LONGEST_SEQS, growing);
#   5. PyTorch context parallelism (torch_cp_bench.py) on the same shapes and GPU counts;
#   6. tables: $OUT/bench_table.md, $OUT/idle_per_worker.md, $OUT/scale_table.md.
# Every wait is bounded; the whole call keeps inside DEADLINE seconds (configs that would start
# past their phase's budget are skipped and listed as such); daemons are stopped by a trap.
# Environment (defaults in brackets): OUT [./gpu-out], GPUS [all], SIZES ["2 GPUS"],
#   SEQS ["131072 524288"], MASKS ["causal full"], SCHEDULES ["balanced heads zigzag ring distflash"],
#   LONGEST_SEQS [8 GPUs: "1048576 2097152"; 4: "1048576"], REPEAT [2], STEP_TIMEOUT [150],
#   DEADLINE [570], SERVICE_BUDGET [DEADLINE - TORCH_BUDGET - 40], TORCH_BUDGET [170],
#   TORCH_BACKENDS [cudnn], TORCH_LONGEST [""], VERIFY_SEQ [4096], DFA_BACKEND [cuda],
#   DFA_WORKER_FLAGS [""], PARTS ["service torch"] (either alone: one part per call).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
source tests/bench/gpu_env.sh  # NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$root/gpu-out}
mkdir -p "$OUT"
bin=${DFA_GPU_DIR:-$root/.gpu-service}/bin
start_s=$SECONDS
ngpu=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
if ((ngpu < 1)); then
  echo "gpu_scale_suite: no GPU visible (nvidia-smi -L)" >&2
  exit 1
fi
SIZES=${SIZES:-$( ((ngpu > 2)) && echo "2 $ngpu" || echo "$ngpu")}
SEQS=${SEQS-"131072 524288"}  # may be set empty (only the longest probe)
MASKS=${MASKS:-"causal full"}
SCHEDULES=${SCHEDULES:-"balanced heads zigzag ring distflash"}
if ((ngpu >= 8)); then LONGEST_SEQS=${LONGEST_SEQS-"1048576 2097152"}; else LONGEST_SEQS=${LONGEST_SEQS-"1048576"}; fi
REPEAT=${REPEAT:-2}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
DEADLINE=${DEADLINE:-570}
TORCH_BUDGET=${TORCH_BUDGET:-170}
SERVICE_BUDGET=${SERVICE_BUDGET:-$((DEADLINE - TORCH_BUDGET - 40))}
TORCH_BACKENDS=${TORCH_BACKENDS:-cudnn}
TORCH_LONGEST=${TORCH_LONGEST:-}
VERIFY_SEQ=${VERIFY_SEQ:-4096}
DFA_BACKEND=${DFA_BACKEND:-cuda}
PARTS=${PARTS:-"service torch"}
run_dir=$(mktemp -d /tmp/dfa-scale.XXXXXX)
{
  echo "gpu_scale_suite: $(date -u +%FT%TZ) gpus=$ngpu sizes='$SIZES' seqs='$SEQS' masks='$MASKS'"
  echo "  schedules='$SCHEDULES' longest='$LONGEST_SEQS' repeat=$REPEAT backend=$DFA_BACKEND"
  echo "  deadline=${DEADLINE}s service=${SERVICE_BUDGET}s torch=${TORCH_BUDGET}s parts='$PARTS'"
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -12
} 2>&1 | tee "$OUT/setup.txt"

left() { echo $(($1 - (SECONDS - start_s))); }  # seconds left until offset $1 of this call
has_part() { [[ " $PARTS " == *" $1 "* ]]; }

pids=()
stop_all() {
  local p i alive
  ((${#pids[@]})) || return 0
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for ((i = 0; i < 50; i++)); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  pids=()
  cp "$run_dir"/*.log "$OUT/" 2>/dev/null
}
trap stop_all EXIT
trap 'stop_all; exit 143' TERM INT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() {  # wait_http URL SECONDS
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    python3 -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$1" \
      2>/dev/null && return 0
    sleep 0.1
  done
  echo "gpu_scale_suite: $1 not up after $2 s" >&2
  return 1
}

# bench GPUS SCHEDULE MASK SEQ REPEAT: one `dfa bench` (the log format summarize_bench.py reads).
bench() {
  local budget
  budget=$(left "$SERVICE_BUDGET")
  ((budget > STEP_TIMEOUT)) && budget=$STEP_TIMEOUT
  echo "== bench gpus=$1 schedule=$2 mask=$3 seq=$4 t=$(date +%s)"
  if ((budget < 10)); then
    echo "skipped: service budget spent"
    return 1
  fi
  timeout "$budget" "$bin/dfa" bench --coordinator "$coordinator" --workers "$1" \
    --schedule "$2" --"$3" --seq "$4" --heads 32 --head-dim 128 --dtype bf16 \
    --repeat "$5" --skip-transfer --skip-single 2>&1
  local rc=$?
  echo "== exit $rc"
  return $rc
}

if has_part service; then
  cport=$(port)
  cmport=$(port)
  coordinator=127.0.0.1:$cport
  "$bin/dfa-coordinator" --listen="$coordinator" --metrics_port="$cmport" \
    >"$run_dir/coordinator.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$cmport/metrics" 30 || exit 1
  for ((g = 0; g < ngpu; g++)); do
    wp=$(port)
    wm=$(port)
    # One GPU per worker, seen as its device 0; NCCL finds the NVLink/NVSwitch path by bus id.
    CUDA_VISIBLE_DEVICES=$g "$bin/dfa-worker" --listen="127.0.0.1:$wp" --advertise="127.0.0.1:$wp" \
      --coordinator="$coordinator" --worker_id="gpu-$g" --backend="$DFA_BACKEND" \
      --metrics_port="$wm" ${DFA_WORKER_FLAGS:-} >"$run_dir/worker-$g.log" 2>&1 &
    pids+=($!)
  done
  # The workers start (and take their device pools) in parallel; wait for each, bounded.
  for ((g = 0; g < ngpu; g++)); do
    for ((i = 0; i < 600; i++)); do
      grep -q "listening on" "$run_dir/worker-$g.log" 2>/dev/null && break
      kill -0 "${pids[$((g + 1))]}" 2>/dev/null || break
      sleep 0.1
    done
    grep -q "listening on" "$run_dir/worker-$g.log" ||
      { echo "gpu_scale_suite: worker $g did not start:"; tail -5 "$run_dir/worker-$g.log"; exit 1; }
  done
  sleep 1
  timeout 20 "$bin/dfa" workers --coordinator "$coordinator" 2>&1 | tee "$OUT/workers.txt"

  # 2. Verified jobs (all GPUs), checked against PyTorch after the workers stop.
  for sched in $SCHEDULES; do
    d=$OUT/verify-$sched
    mkdir -p "$d"
    echo "== verify: S=$VERIFY_SEQ causal, $ngpu GPUs, schedule $sched"
    timeout 60 "$bin/dfa-service-io-dump" --coordinator "$coordinator" --out "$d" \
      --seq "$VERIFY_SEQ" --workers "$ngpu" --schedule "$sched" || rm -rf "$d"
  done 2>&1 | tee "$OUT/verify_jobs.log"

  # 3. The grid, most wanted first (the budget cuts the tail and says so): every schedule on all
  # GPUs; balanced on the smaller sizes (the 2-GPU baseline); the longest S (4.); the other
  # schedules on the smaller sizes, in SCHEDULES order. distflash is causal-only here (for
  # full masks it is the ring with more bytes; docs/scale.md) and at P = 2 it is the ring's plan.
  grid() {  # grid all-gpus|baseline|rest
    local sched P mask s
    for sched in $SCHEDULES; do
      for P in $(echo "$SIZES" | tr ' ' '\n' | sort -rn); do
        case $1 in
          all-gpus) [[ $P == "$ngpu" ]] || continue ;;
          baseline) [[ $P != "$ngpu" && $sched == balanced ]] || continue ;;
          rest) [[ $P != "$ngpu" && $sched != balanced ]] || continue ;;
        esac
        [[ $P == 2 && $sched == distflash ]] && continue
        for mask in $MASKS; do
          [[ $mask == full && $sched == distflash ]] && continue
          for s in $SEQS; do echo "$P $sched $mask $s"; done
        done
      done
    done
  }
  run_grid() {  # run_grid FILE
    local P sched mask s
    while read -r P sched mask s; do
      bench "$P" "$sched" "$mask" "$s" "$REPEAT" </dev/null
    done <"$1" 2>&1 | tee -a "$OUT/bench.log" | grep -E '^==|^forward|^backward|^skipped|rror'
  }
  : >"$OUT/bench.log"
  for part in all-gpus baseline rest; do grid $part >"$OUT/grid-$part.txt"; done
  run_grid "$OUT/grid-all-gpus.txt"
  run_grid "$OUT/grid-baseline.txt"

  # 4. Longest causal S (balanced, all GPUs, one repeat): growing until one fails or times out.
  for s in $LONGEST_SEQS; do
    bench "$ngpu" balanced causal "$s" 1 </dev/null >"$OUT/longest-$s.log" 2>&1
    rc=$?
    grep -E '^==|^forward|^backward|^skipped|rror' "$OUT/longest-$s.log"
    cat "$OUT/longest-$s.log" >>"$OUT/bench.log"
    ((rc == 0)) || break
    echo "longest that fits and finishes so far: S=$s on $ngpu GPUs" | tee -a "$OUT/longest.txt"
  done
  run_grid "$OUT/grid-rest.txt"

  python3 tests/bench/summarize_bench.py "$OUT/bench.log" | tee "$OUT/bench_table.md"
  stop_all
  for d in "$OUT"/verify-*/; do
    [ -f "$d/meta.json" ] || continue
    sched=$(basename "$d")
    timeout 90 python3 tests/bench/verify_against_torch.py "$d" 2>&1 | tail -6 | tee "$OUT/$sched.txt"
    rm -rf "$d"
  done
fi

# 5. PyTorch context parallelism on the same shapes (its own processes; the workers are gone).
if has_part torch; then
  : >"$OUT/torch_cp.jsonl"
  torch_end=$((SECONDS - start_s + TORCH_BUDGET))
  ((torch_end > DEADLINE)) && torch_end=$DEADLINE
  for P in $(echo "$SIZES" | tr ' ' '\n' | sort -rn); do
    budget=$(left "$torch_end")
    if ((budget < 20)); then
      echo "skipped: torch_cp gpus=$P (torch budget spent)" | tee -a "$OUT/torch_cp.log"
      continue
    fi
    extra=()
    [[ $P == "$ngpu" && -n $TORCH_LONGEST ]] && extra=(--longest "$TORCH_LONGEST")
    echo "== torch_cp gpus=$P budget=${budget}s"
    timeout "$budget" torchrun --standalone --nproc_per_node="$P" tests/bench/torch_cp_bench.py \
      --seq "$(echo "$SEQS" | tr ' ' ',')" --masks "$(echo "$MASKS" | tr ' ' ',')" \
      --backends "$TORCH_BACKENDS" --out "$OUT/torch_cp.jsonl" "${extra[@]}" 2>&1 |
      grep -E 'torch_cp|FAILED|longest|Error' | tee -a "$OUT/torch_cp.log"
  done
fi

# 6. Tables: per-worker idle, and per-GPU throughput against the 2-GPU figure and PyTorch CP.
python3 - "$OUT" <<'EOF' | tee "$OUT/scale_table.md"
import json, os, re, sys
out = sys.argv[1]
HEAD = re.compile(r"^== bench gpus=(\d+) schedule=(\S+) mask=(\S+) seq=(\d+)")
JOB = re.compile(r"^(forward|backward)\s+([\d.]+) s\s+([\d.]+) GFLOP")
WORKER = re.compile(r"worker (\d+): busy ([\d.]+) s\s+idle ([\d.]+) s")
rows, cur, job = [], None, None
path = os.path.join(out, "bench.log")
for line in open(path) if os.path.exists(path) else []:
    m = HEAD.match(line)
    if m:
        cur = {"key": (int(m[1]), m[2], m[3], int(m[4])), "runs": []}
        rows.append(cur)
        continue
    if cur is None:
        continue
    m = JOB.match(line)
    if m:
        job = {"s": float(m[2]), "gflop": float(m[3]), "w": {}}
        if m[1] == "forward":
            cur["runs"].append({"f": job})
        elif cur["runs"]:
            cur["runs"][-1]["b"] = job
        continue
    m = WORKER.search(line)
    if m and job is not None:
        job["w"][int(m[1])] = (float(m[2]), float(m[3]))
best = {}
for r in rows:
    for run in r["runs"]:
        f, b = run.get("f"), run.get("b")
        if not f or not b:
            continue
        P = r["key"][0]
        tf = (f["gflop"] + b["gflop"]) / (f["s"] + b["s"]) / P / 1e3
        idle = {}
        for w in set(f["w"]) | set(b["w"]):
            busy = sum(j["w"].get(w, (0, 0))[0] for j in (f, b))
            wait = sum(j["w"].get(w, (0, 0))[1] for j in (f, b))
            idle[w] = 100 * wait / (busy + wait) if busy + wait > 0 else 0.0
        if r["key"] not in best or tf > best[r["key"]][0]:
            best[r["key"]] = (tf, f["gflop"] / f["s"] / P / 1e3, idle)
torch = {}
tpath = os.path.join(out, "torch_cp.jsonl")
for line in open(tpath) if os.path.exists(tpath) else []:
    d = json.loads(line)
    k = (d["gpus"], d["mask"], d["seq"])
    if k not in torch or d["fwd_bwd_tflops_per_gpu"] > torch[k][0]:
        torch[k] = (d["fwd_bwd_tflops_per_gpu"], d["backend"])
print("| GPUs | schedule | mask | S | fwd TFLOP/s/GPU | fwd+bwd TFLOP/s/GPU | vs 2 GPUs, same schedule | vs 2-GPU balanced | PyTorch CP fwd+bwd/GPU | vs PyTorch | max idle % |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(best, key=lambda k: (k[2], k[3], k[1], k[0])):
    P, sched, mask, s = k
    tf, ff, idle = best[k]
    base = best.get((2, "balanced", mask, s))  # the 2-GPU figure: its balanced plan
    vs2 = f"{100 * tf / base[0]:.1f}%" if base and P != 2 else "-"
    same = best.get((2, sched, mask, s))
    vs2s = f"{100 * tf / same[0]:.1f}%" if same and P != 2 else "-"
    t = torch.get((P, mask, s))
    tt = f"{t[0]:.0f} ({t[1]})" if t else "-"
    vt = f"{100 * tf / t[0]:.0f}%" if t else "-"
    print(f"| {P} | {sched} | {mask} | {s // 1024}K | {ff:.1f} | {tf:.1f} | {vs2s} | {vs2} | {tt} | {vt} | {max(idle.values()):.1f} |")
print()
print("Idle fraction of every worker over forward+backward (best repeat), %:")
print()
print("| GPUs | schedule | mask | S | " + " | ".join(f"w{i}" for i in range(8)) + " |")
print("|---|---|---|---|" + "---|" * 8)
for k in sorted(best, key=lambda k: (k[2], k[3], k[1], k[0])):
    idle = best[k][2]
    cells = [f"{idle[i]:.1f}" if i in idle else "" for i in range(8)]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3] // 1024}K | " + " | ".join(cells) + " |")
EOF
echo "gpu_scale_suite: done in $((SECONDS - start_s)) s; results in $OUT"
