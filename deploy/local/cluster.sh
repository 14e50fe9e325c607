#!/usr/bin/env bash
# One-host local cluster: a coordinator and N workers on loopback, each with a metrics port, and
# optionally a Prometheus server scraping them (deploy/prometheus/prometheus-local.yml).
#
#   deploy/local/cluster.sh [--workers N] [--backend cpu|cuda|auto] [--build-dir DIR]
#                           [--run-dir DIR] [--prometheus] [--scrape-interval 5s]
#                           [-- extra dfa-worker flags]
#
# Prints the addresses, writes them to RUN_DIR/cluster.env (shell syntax, for scripts and
# tests), then waits. Ctrl-C (or SIGTERM) stops every process it started and exits 0; if a daemon
# dies on its own, the rest are stopped too and the exit status is 1. Ports are picked free.
# Logs: RUN_DIR/*.log. Then e.g.: build/client/dfa demo --coordinator "$DFA_COORDINATOR"
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
workers=2
backend=cpu
build_dir="$root/build"
run_dir=""
with_prometheus=0
scrape_interval=5s
extra_worker_flags=()

while (($#)); do
  case "$1" in
    --workers) workers=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --run-dir) run_dir=$2; shift 2 ;;
    --prometheus) with_prometheus=1; shift ;;
    --scrape-interval) scrape_interval=$2; shift 2 ;;
    --) shift; extra_worker_flags=("$@"); break ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cluster.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: --workers must be a positive integer, got '$workers'" >&2; exit 2; }
[[ "$scrape_interval" =~ ^[0-9]+(ms|s|m)$ ]] || { echo "cluster.sh: --scrape-interval must look like 5s, got '$scrape_interval'" >&2; exit 2; }

coordinator_bin="$build_dir/coordinator/dfa-coordinator"
worker_bin="$build_dir/worker/dfa-worker"
for b in "$coordinator_bin" "$worker_bin"; do
  [ -x "$b" ] || { echo "cluster.sh: $b not built (./dfa.sh build, or --build-dir)" >&2; exit 2; }
done
if ((with_prometheus)); then
  command -v prometheus >/dev/null || { echo "cluster.sh: prometheus missing (./dfa.sh setup)" >&2; exit 2; }
fi
if [ -z "$run_dir" ]; then run_dir=$(mktemp -d "${TMPDIR:-/tmp}/dfa-cluster.XXXXXX"); fi
mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)

# Free loopback ports below the kernel's ephemeral range (a port the kernel hands out for an
# outgoing connection cannot then be taken before the daemon binds it; LocalCluster does the
# same). All sockets are held until every port is chosen, so they are distinct.
read -r -a ports < <(python3 - "$((2 * workers + 3))" <<'PY'
import random, socket, sys
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    for _ in range(200):
        try:
            s.bind(("127.0.0.1", random.randrange(10000, max(10001, low))))
            break
        except OSError:
            continue
    else:
        s.bind(("127.0.0.1", 0))  # the kernel's pick as the fallback
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
)

pids=()
names=()
stopping=0

stop_all() {
  stopping=1
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
  done
  for ((i = 0; i < 50; i++)); do
    local alive=0 p
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
}
trap 'stop_all; exit 0' INT TERM
trap 'stop_all' EXIT

start() {  # start NAME CMD...: runs CMD in the background, logging to RUN_DIR/NAME.log
  local name=$1; shift
  "$@" >"$run_dir/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
}

http_ok() {  # http_ok URL: 0 when URL answers 200
  python3 -c 'import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200 else 1)
except Exception:
    sys.exit(1)' "$1"
}

wait_http() {  # wait_http NAME URL: waits up to 30 s, failing if the process died
  local name=$1 url=$2 i j
  for ((i = 0; i < 300; i++)); do
    http_ok "$url" && return 0
    for ((j = 0; j < ${#pids[@]}; j++)); do
      if ! kill -0 "${pids[j]}" 2>/dev/null; then
        echo "cluster.sh: ${names[j]} exited during startup; its log:" >&2
        tail -n 20 "$run_dir/${names[j]}.log" >&2
        exit 1
      fi
    done
    sleep 0.1
  done
  echo "cluster.sh: $name did not answer $url in 30 s (log: $run_dir/$name.log)" >&2
  exit 1
}

coordinator_addr="127.0.0.1:${ports[0]}"
coordinator_metrics=${ports[1]}
start coordinator "$coordinator_bin" --listen="$coordinator_addr" --metrics_port="$coordinator_metrics"
wait_http coordinator "http://127.0.0.1:$coordinator_metrics/metrics"

worker_addrs=()
worker_metrics=()
for ((w = 0; w < workers; w++)); do
  addr="127.0.0.1:${ports[2 + 2 * w]}"
  metrics=${ports[3 + 2 * w]}
  worker_addrs+=("$addr")
  worker_metrics+=("$metrics")
  start "worker-$w" "$worker_bin" --listen="$addr" --advertise="$addr" \
    --coordinator="$coordinator_addr" --worker_id="worker-$w" --backend="$backend" \
    --metrics_port="$metrics" \
    ${extra_worker_flags[@]+"${extra_worker_flags[@]}"}
done
for ((w = 0; w < workers; w++)); do
  wait_http "worker-$w" "http://127.0.0.1:${worker_metrics[w]}/metrics"
done

prometheus_url=""
if ((with_prometheus)); then
  prom_dir="$run_dir/prometheus"
  mkdir -p "$prom_dir/targets" "$prom_dir/data"
  sed -E "s/^(  scrape_interval:|  evaluation_interval:) .*/\1 $scrape_interval/" \
    "$root/deploy/prometheus/prometheus-local.yml" | grep -v '^  scrape_timeout:' >"$prom_dir/prometheus.yml"
  cp "$root/deploy/prometheus/dfa-rules.yml" "$prom_dir/"
  printf '[{"targets": ["127.0.0.1:%s"]}]\n' "$coordinator_metrics" >"$prom_dir/targets/coordinator.json"
  targets=$(printf '"127.0.0.1:%s", ' "${worker_metrics[@]}")
  printf '[{"targets": [%s]}]\n' "${targets%, }" >"$prom_dir/targets/workers.json"
  prom_port=${ports[$((2 * workers + 2))]}
  start prometheus prometheus --config.file="$prom_dir/prometheus.yml" \
    --storage.tsdb.path="$prom_dir/data" --web.listen-address="127.0.0.1:$prom_port" \
    --storage.tsdb.retention.time=1d
  prometheus_url="http://127.0.0.1:$prom_port"
  wait_http prometheus "$prometheus_url/-/ready"
fi

{
  echo "DFA_RUN_DIR=$run_dir"
  echo "DFA_COORDINATOR=$coordinator_addr"
  echo "DFA_COORDINATOR_METRICS=http://127.0.0.1:$coordinator_metrics/metrics"
  echo "DFA_WORKERS=\"${worker_addrs[*]}\""
  echo "DFA_WORKER_METRICS=\"$(printf 'http://127.0.0.1:%s/metrics ' "${worker_metrics[@]}" | sed 's/ $//')\""
  echo "DFA_PROMETHEUS=$prometheus_url"
  echo "DFA_PIDS=\"${pids[*]}\""
} >"$run_dir/cluster.env.tmp"
mv "$run_dir/cluster.env.tmp" "$run_dir/cluster.env"

echo "coordinator  $coordinator_addr   metrics http://127.0.0.1:$coordinator_metrics/metrics"
for ((w = 0; w < workers; w++)); do
  echo "worker-$w     ${worker_addrs[w]}   metrics http://127.0.0.1:${worker_metrics[w]}/metrics"
done
[ -n "$prometheus_url" ] && echo "prometheus   $prometheus_url"
echo "logs and cluster.env in $run_dir; Ctrl-C stops the cluster"
echo "try: $build_dir/client/dfa demo --coordinator $coordinator_addr"

# Wait until a child exits (a crash) or a signal arrives (trap above).
while :; do
  for ((j = 0; j < ${#pids[@]}; j++)); do
    if ! kill -0 "${pids[j]}" 2>/dev/null; then
      ((stopping)) && exit 0
      echo "cluster.sh: ${names[j]} exited; stopping the cluster (log: $run_dir/${names[j]}.log)" >&2
      exit 1
    fi
  done
  sleep 0.5 &
  wait $! || true
done
