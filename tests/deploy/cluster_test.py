#!/usr/bin/env python3
"""Runs a real local cluster and checks what it exports, through real Prometheus tools.

The cluster is deploy/local/cluster.sh (coordinator + 2 CPU workers on free loopback ports, and
for the dashboard check a Prometheus server with a 1 s scrape interval), so the launcher is
tested too. While `dfa` client jobs run against it (plus one request that must fail, so the
error counter has a sample):

  lint       every daemon's /metrics passes `promtool check metrics`, and every metric in
             docs/metrics.md is exported by some daemon with its documented type.
  dashboard  every query of every panel of deploy/grafana/dashboard.json returns data (a finite
             value) through
             Prometheus' HTTP API (/api/v1/query), and so do the recording rules.

Ctrl-C (SIGINT) to the launcher is how the cluster stops; the test then checks that every
process it started is gone.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dashboard_queries as dq  # noqa: E402

REPO = dq.REPO
LAUNCHER = os.path.join(REPO, "deploy", "local", "cluster.sh")
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval for a 1 s scrape: >= 4 scrape intervals.


def log(msg):
    print(msg, flush=True)


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode("utf-8")


def parse_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            env[k] = v.strip('"')
    return env


class Cluster:
    """deploy/local/cluster.sh in its own session; stop() is Ctrl-C, then SIGKILL if needed."""

    def __init__(self, build_dir, run_dir, prometheus):
        cmd = [LAUNCHER, "--workers", "2", "--build-dir", build_dir, "--run-dir", run_dir]
        if prometheus:
            cmd += ["--prometheus", "--scrape-interval", "1s"]
        cmd += ["--", "--threads=1"]  # two workers and the client share CI's 2 cores
        self.run_dir = run_dir
        self.out = open(os.path.join(run_dir, "launcher.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        env_file = os.path.join(run_dir, "cluster.env")
        deadline = time.time() + 60
        while not os.path.exists(env_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("cluster did not start:\n" + self.logs())
            time.sleep(0.2)
        self.env = parse_env(env_file)
        self.pids = [int(p) for p in self.env["DFA_PIDS"].split()]

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.run_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.run_dir, name), errors="replace") as f:
                    out.append(f"--- {name} (tail)\n" + "".join(f.readlines()[-15:]))
        return "\n".join(out)

    def stop(self):
        """Returns a list of problems (launcher exit status, processes left behind)."""
        problems = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                rc = self.proc.wait(timeout=20)
                if rc != 0:
                    problems.append(f"launcher exited {rc} on Ctrl-C")
            except subprocess.TimeoutExpired:
                problems.append("launcher ignored Ctrl-C for 20 s")
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pid in getattr(self, "pids", []):
            try:
                os.kill(pid, 0)
                problems.append(f"process {pid} survived the launcher")
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.out.close()
        return problems


class Load(threading.Thread):
    """Runs `dfa` client jobs against the cluster in a loop until stopped."""

    def __init__(self, client, coordinator, run_dir):
        super().__init__(daemon=True)
        self.client, self.coordinator = client, coordinator
        self.stop_event = threading.Event()
        self.ok = 0
        self.failed = []
        self.log = open(os.path.join(run_dir, "client.log"), "w")

    def run_client(self, args, timeout=120):
        r = subprocess.run([self.client, *args], capture_output=True, text=True, timeout=timeout)
        self.log.write(f"$ dfa {' '.join(args)}\n-> {r.returncode}\n{r.stdout}{r.stderr}\n")
        self.log.flush()
        return r

    def run(self):
        # A request that must fail (unknown job): dfa_grpc_errors_total gets a sample.
        self.run_client(["status", "--coordinator", self.coordinator, "--job", "no-such-job"])
        while not self.stop_event.is_set():
            # Small causal forward+backward jobs on both workers: seconds each on 2 cores.
            r = self.run_client(["submit", "--coordinator", self.coordinator, "--workers", "2",
                                 "--seq", "2048", "--heads", "4", "--head-dim", "64"])
            if r.returncode == 0:
                self.ok += 1
            else:
                self.failed.append(r.stderr[-500:])
                time.sleep(0.5)

    def stop(self):
        self.stop_event.set()
        self.join(timeout=150)
        self.log.close()


def lint(cluster, load):
    problems = []
    promtool = shutil.which("promtool")
    if promtool is None:
        return ["promtool missing: run ./dfa.sh setup"]
    documented = dq.documented_metrics()
    exported = {}
    urls = [cluster.env["DFA_COORDINATOR_METRICS"]] + cluster.env["DFA_WORKER_METRICS"].split()
    for url in urls:
        text = http_get(url)
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=60)
        log(f"promtool check metrics {url}: exit {r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
        if r.returncode != 0 or r.stdout.strip() or r.stderr.strip():
            problems.append(f"{url}: promtool check metrics: {r.stdout}{r.stderr}")
        for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M):
            exported[m.group(1)] = m.group(2)
    for name, kind in sorted(documented.items()):
        if name not in exported:
            problems.append(f"{name} ({kind}) documented in docs/metrics.md but exported by no daemon")
        elif exported[name] != kind:
            problems.append(f"{name}: documented as {kind}, exported as {exported[name]}")
    extra = sorted(n for n in exported if n.startswith("dfa_") and n not in documented)
    if extra:
        log(f"note: exported but undocumented: {extra}")
    log(f"{len(exported)} metric families exported, {len(documented)} documented")
    return problems


def query(prom, promql):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(http_get(url))
    if body.get("status") != "success":
        raise RuntimeError(f"{promql}: {body}")
    return body["data"]["result"]


def dashboard(cluster, load, report_path, deadline_s=90):
    prom = cluster.env["DFA_PROMETHEUS"]
    dash = dq.load_dashboard()
    pending = [(t, ref, e, dq.substitute(e, RATE_INTERVAL, ".*")) for t, ref, e in dq.queries(dash)]
    # The recording rules must produce data too.
    for rule in ("worker:dfa_step_idle_fraction:ratio_rate1m", "worker:dfa_attention_flops:rate1m",
                 "cluster:dfa_attention_flops:rate1m", "kind:dfa_job_latency_seconds:p99_rate5m"):
        pending.append(("recording rule", "", rule, rule))
    health = 'count(up{job=~"dfa-.*"} == 1) == 3'  # coordinator + 2 workers scraped
    pending.append(("scrape health", "", health, health))
    answered = []
    deadline = time.time() + deadline_s
    while pending and time.time() < deadline:
        still = []
        for item in pending:
            # Data = at least one series with a finite value (a quantile or a ratio over a window
            # without jobs is NaN: not yet data; the load keeps running, so ask again).
            result = [r for r in query(prom, item[3]) if math.isfinite(float(r["value"][1]))]
            (answered if result else still).append(item + (result,) if result else item)
        pending = still
        if pending:
            time.sleep(2)
    lines = []
    for title, ref, _, promql, result in answered:
        first = result[0]
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(first["metric"].items()))
        lines.append(f"{title} [{ref}] {len(result)} series; e.g. {{{labels}}} = {first['value'][1]}")
    for line in lines:
        log("  ok  " + line)
    if report_path:
        with open(report_path, "w") as f:
            f.write("\n".join(lines) + "\n")
    log(f"{len(answered)} queries returned data, {len(pending)} did not; "
        f"client jobs: {load.ok} ok, {len(load.failed)} failed")
    return [f"no data: panel '{t}' {ref}: {promql}" for t, ref, _, promql in pending]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["lint", "dashboard"])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--report", help="write what Prometheus returned, one line per query")
    args = ap.parse_args()
    client = os.path.join(args.build_dir, "client", "dfa")
    run_dir = tempfile.mkdtemp(prefix=f"dfa-deploy-{args.mode}-")
    cluster = Cluster(os.path.abspath(args.build_dir), run_dir, prometheus=args.mode == "dashboard")
    load = Load(client, cluster.env["DFA_COORDINATOR"], run_dir)
    problems = []
    try:
        log(f"cluster up: coordinator {cluster.env['DFA_COORDINATOR']}, workers {cluster.env['DFA_WORKERS']}")
        load.start()
        # Let a few jobs finish so labelled series exist and rate windows fill.
        deadline = time.time() + 60
        while load.ok < 2 and time.time() < deadline and load.is_alive():
            time.sleep(0.5)
        if load.ok == 0:
            problems.append("no client job succeeded: " + (load.failed[-1] if load.failed else "?"))
        problems += lint(cluster, load) if args.mode == "lint" else dashboard(cluster, load, args.report)
    except Exception as e:  # report, then clean up
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        load.stop()
        problems += cluster.stop()
    if problems:
        log("FAILED:\n  " + "\n  ".join(problems))
        log(cluster.logs())
        log(f"(run directory kept: {run_dir})")
        return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    log("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
