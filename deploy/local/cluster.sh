#!/usr/bin/env bash
# One-host local cluster: a coordinator and N workers on loopback, each with a metrics port, and
# optionally a Prometheus server scraping them (deploy/prometheus/prometheus-local.yml).
#
#   deploy/local/cluster.sh [--workers N] [--threads T] [--backend cpu|cuda|cudnn|auto]
#                           [--build-dir DIR] [--run-dir DIR] [--prometheus]
#                           [--scrape-interval 5s] [-- extra dfa-worker flags]
#
# The daemons are started by `dfa cluster` (client/cli/cluster_command.cc, the same launcher and
# defaults as `dfa demo`, `dfa bench` and Python's dfa.LocalCluster: 2 CPU workers, 1 thread
# each; `dfa cluster --help`). This script adds Prometheus. Prints the addresses, writes them
# to RUN_DIR/cluster.env (shell syntax, for scripts and tests), then waits. Ctrl-C (or SIGTERM)
# stops every process it started and exits 0; if a daemon dies on its own, the rest are stopped
# too and the exit status is 1. Ports are picked free. Logs: RUN_DIR/*.log.
# Then e.g.: build/client/dfa demo --coordinator "$DFA_COORDINATOR"
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
workers=""
threads=""
backend=""
build_dir="$root/build"
run_dir=""
with_prometheus=0
scrape_interval=5s
extra_worker_flags=()

while (($#)); do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --run-dir) run_dir=$2; shift 2 ;;
    --prometheus) with_prometheus=1; shift ;;
    --scrape-interval) scrape_interval=$2; shift 2 ;;
    --) shift; extra_worker_flags=("$@"); break ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$scrape_interval" =~ ^[0-9]+(ms|s|m)$ ]] || { echo "cluster.sh: --scrape-interval must look like 5s, got '$scrape_interval'" >&2; exit 2; }

dfa_bin="$build_dir/client/dfa"
for b in "$dfa_bin" "$build_dir/coordinator/dfa-coordinator" "$build_dir/worker/dfa-worker"; do
  [ -x "$b" ] || { echo "cluster.sh: $b not built (./dfa.sh build, or --build-dir)" >&2; exit 2; }
done
if ((with_prometheus)); then
  command -v prometheus >/dev/null || { echo "cluster.sh: prometheus missing (./dfa.sh setup)" >&2; exit 2; }
fi
if [ -z "$run_dir" ]; then run_dir=$(mktemp -d "${TMPDIR:-/tmp}/dfa-cluster.XXXXXX"); fi
mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)
rm -f "$run_dir/cluster.env" "$run_dir/daemons.env"

pids=()
stopping=0

stop_all() {  # SIGTERM to what this script started (dfa cluster stops its daemons), then KILL
  stopping=1
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
  done
  for ((i = 0; i < 150; i++)); do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap 'stop_all; exit 0' INT TERM
trap 'stop_all' EXIT

# The coordinator and the workers: `dfa cluster`, its output in RUN_DIR/dfa-cluster.log; it writes
# the daemons' addresses and pids to RUN_DIR/daemons.env once they are all ready.
cluster_flags=(--log-dir "$run_dir" --env-file "$run_dir/daemons.env" --bin-dir "$build_dir")
[ -n "$workers" ] && cluster_flags+=(--workers "$workers")
[ -n "$threads" ] && cluster_flags+=(--threads "$threads")
[ -n "$backend" ] && cluster_flags+=(--backend "$backend")
"$dfa_bin" cluster "${cluster_flags[@]}" -- ${extra_worker_flags[@]+"${extra_worker_flags[@]}"} \
  >"$run_dir/dfa-cluster.log" 2>&1 &
cluster_pid=$!
pids+=("$cluster_pid")
while [ ! -f "$run_dir/daemons.env" ]; do
  if ! kill -0 "$cluster_pid" 2>/dev/null; then
    wait "$cluster_pid" && rc=0 || rc=$?
    echo "cluster.sh: dfa cluster exited ($rc) before the cluster was ready:" >&2
    cat "$run_dir/dfa-cluster.log" >&2
    exit $((rc == 2 ? 2 : 1))
  fi
  sleep 0.1
done
# shellcheck disable=SC1091
. "$run_dir/daemons.env"

http_ok() {  # http_ok URL: 0 when URL answers 200
  python3 -c 'import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception:
    sys.exit(1)' "$1"
}

wait_http() {  # wait_http NAME URL: waits up to 30 s, failing if something this script started died
  local name=$1 url=$2 i p
  for ((i = 0; i < 300; i++)); do
    http_ok "$url" && return 0
    for p in "${pids[@]}"; do
      if ! kill -0 "$p" 2>/dev/null; then
        echo "cluster.sh: process $p exited while waiting for $name; logs in $run_dir" >&2
        tail -n 20 "$run_dir/dfa-cluster.log" >&2
        exit 1
      fi
    done
    sleep 0.1
  done
  echo "cluster.sh: $name did not answer $url in 30 s (logs in $run_dir)" >&2
  exit 1
}

for url in $DFA_COORDINATOR_METRICS $DFA_WORKER_METRICS; do wait_http "$url" "$url"; done

prometheus_url=""
if ((with_prometheus)); then
  # A free loopback port below the kernel's ephemeral range (as LocalCluster picks its ports).
  prom_port=$(python3 - <<'PY'
import random, socket
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
s = socket.socket()
for _ in range(200):
    try:
        s.bind(("127.0.0.1", random.randrange(10000, max(10001, low))))
        break
    except OSError:
        continue
else:
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
PY
)
  prom_dir="$run_dir/prometheus"
  mkdir -p "$prom_dir/targets" "$prom_dir/data"
  sed -E "s/^(  scrape_interval:|  evaluation_interval:) .*/\1 $scrape_interval/" \
    "$root/deploy/prometheus/prometheus-local.yml" | grep -v '^  scrape_timeout:' >"$prom_dir/prometheus.yml"
  cp "$root/deploy/prometheus/dfa-rules.yml" "$prom_dir/"
  hostport() { local u=${1#http://}; echo "${u%%/*}"; }
  printf '[{"targets": ["%s"]}]\n' "$(hostport "$DFA_COORDINATOR_METRICS")" >"$prom_dir/targets/coordinator.json"
  targets=""
  for url in $DFA_WORKER_METRICS; do targets+="\"$(hostport "$url")\", "; done
  printf '[{"targets": [%s]}]\n' "${targets%, }" >"$prom_dir/targets/workers.json"
  prometheus --config.file="$prom_dir/prometheus.yml" --storage.tsdb.path="$prom_dir/data" \
    --web.listen-address="127.0.0.1:$prom_port" --storage.tsdb.retention.time=1d \
    >"$run_dir/prometheus.log" 2>&1 &
  pids+=($!)
  prometheus_url="http://127.0.0.1:$prom_port"
  wait_http prometheus "$prometheus_url/-/ready"
fi

{
  cat "$run_dir/daemons.env" | grep -v '^DFA_PIDS='
  echo "DFA_PROMETHEUS=$prometheus_url"
  echo "DFA_PIDS=\"$DFA_PIDS ${pids[*]}\""
} >"$run_dir/cluster.env.tmp"
mv "$run_dir/cluster.env.tmp" "$run_dir/cluster.env"

grep -v '^stopped' "$run_dir/dfa-cluster.log" | grep -v '^try:' || true
[ -n "$prometheus_url" ] && echo "prometheus   $prometheus_url"
echo "logs and cluster.env in $run_dir; Ctrl-C stops the cluster"
echo "try: $dfa_bin demo --coordinator $DFA_COORDINATOR"

# Wait until something this script started exits (a crash) or a signal arrives (trap above).
while :; do
  for p in "${pids[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then
      ((stopping)) && exit 0
      echo "cluster.sh: process $p exited; stopping the cluster (logs in $run_dir)" >&2
      tail -n 20 "$run_dir/dfa-cluster.log" >&2
      exit 1
    fi
  done
  sleep 0.5 &
  wait $! || true
done
