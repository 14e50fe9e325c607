#!/usr/bin/env python3
"""Runs a real local cluster and checks what it exports, through real Prometheus tools.

The cluster is deploy/local/cluster.sh (coordinator + 2 CPU workers on free loopback ports, and
for the dashboard check a Prometheus server with a 1 s scrape interval), so the launcher is
tested too. While `dfa` client jobs run against it (plus one request that must fail, so the
error counter has a sample):

  lint       every daemon's /metrics passes `promtool check metrics`, every metric in
             docs/metrics.md is exported by some daemon with its documented type (process
             metrics, dfa_build_info and the request totals included), request totals count
             what the load did, and /healthz and /readyz answer 200 on every daemon.
  dashboard  every query of every panel of deploy/grafana/dashboard.json returns data (a finite
             value) through Prometheus' HTTP API (/api/v1/query), with the variables at "All"
             and at this cluster's own values (cluster="local", each job); none does for a
             cluster, namespace or job that does not exist (every query is scoped by them);
             the recording rules return data too.

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
import urllib.error
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


def http_status(url, timeout=5):
    """(status, body) also for error statuses (503 from /readyz)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8")


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
        problems.append(f"exported but not documented in docs/metrics.md: {extra}")
    log(f"{len(exported)} metric families exported, {len(documented)} documented")
    # The counters only grow; what a heartbeat or a slow scrape has not counted yet gets a few
    # seconds (workers heartbeat every lease/3, about 1 s by default) before it is a problem.
    deadline = time.time() + 10
    values = lint_values(urls)
    while values and time.time() < deadline:
        time.sleep(0.5)
        values = lint_values(urls)
    problems += values
    problems += lint_probes(urls)
    return problems


def samples(text, name):
    """[(labels dict, value)] of metric `name` in a text exposition."""
    out = []
    for m in re.finditer(r"^" + re.escape(name) + r"(?:\{([^}]*)\})? (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        out.append((labels, float(m.group(2))))
    return out


def lint_values(urls):
    """The new families carry what they should after the load ran."""
    problems = []
    texts = {url: http_get(url) for url in urls}
    coordinator, workers = urls[0], urls[1:]
    for url, text in texts.items():
        info = samples(text, "dfa_build_info")
        if len(info) != 1 or info[0][1] != 1 or not info[0][0].get("version") or \
                not info[0][0].get("build_type"):
            problems.append(f"{url}: dfa_build_info is {info}, want one series = 1 with "
                            "version and build_type")
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes",
                     "process_open_fds", "process_max_fds", "process_start_time_seconds"):
            got = samples(text, name)
            if len(got) != 1 or not got[0][1] > 0:
                problems.append(f"{url}: {name} = {got}, want one positive sample")
        start = samples(text, "process_start_time_seconds")
        if start and not time.time() - 3600 < start[0][1] <= time.time() + 1:
            problems.append(f"{url}: process_start_time_seconds {start[0][1]} is not a recent start")
    ok = {l["rpc"]: v for l, v in samples(texts[coordinator], "dfa_coordinator_requests_total")
          if l.get("code") == "OK"}
    for rpc in ("CreateSession", "SubmitJob", "RegisterWorker", "Heartbeat"):
        if not ok.get(rpc, 0) > 0:
            problems.append(f"{coordinator}: dfa_coordinator_requests_total{{rpc={rpc},code=OK}} "
                            f"= {ok.get(rpc)} after client jobs ran")
    refused = sum(v for l, v in samples(texts[coordinator], "dfa_coordinator_requests_total")
                  if l.get("rpc") == "GetJob" and l.get("code") == "NOT_FOUND")
    errors = sum(v for l, v in samples(texts[coordinator], "dfa_grpc_errors_total")
                 if l.get("method") == "GetJob" and l.get("code") == "NOT_FOUND")
    if refused < 1 or refused != errors:
        problems.append(f"{coordinator}: GetJob NOT_FOUND counted {refused} in requests_total, "
                        f"{errors} in dfa_grpc_errors_total (want the same, >= 1)")
    for url in workers:
        got = {l["rpc"]: v for l, v in samples(texts[url], "dfa_worker_requests_total")
               if l.get("code") == "OK"}
        for rpc in ("OpenSession", "RunJob"):
            if not got.get(rpc, 0) > 0:
                problems.append(f"{url}: dfa_worker_requests_total{{rpc={rpc},code=OK}} = "
                                f"{got.get(rpc)} after client jobs ran")
        # Tensors moved through gRPC streams or, on one host, shared memory.
        moved = sum(got.get(rpc, 0) for rpc in ("Upload", "Download", "SharedMemoryTransfer"))
        if not moved > 0:
            problems.append(f"{url}: no data-plane RPC counted in dfa_worker_requests_total: {got}")
    return problems


def lint_probes(urls):
    """/healthz and /readyz of every daemon of a running cluster with live workers: 200."""
    problems = []
    for url in urls:
        base = url.rsplit("/", 1)[0]
        for path, body in (("/healthz", "ok\n"), ("/readyz", "ready\n")):
            status, text = http_status(base + path)
            log(f"GET {base + path}: {status} {text.strip()}")
            if (status, text) != (200, body):
                problems.append(f"GET {base + path}: {status} {text!r}, want 200 {body!r}")
    return problems


def query(prom, promql):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    body = json.loads(http_get(url))
    if body.get("status") != "success":
        raise RuntimeError(f"{promql}: {body}")
    return body["data"]["result"]


def finite(prom, promql):
    return [r for r in query(prom, promql) if math.isfinite(float(r["value"][1]))]


def wait_for_data(prom, pending, deadline_s):
    """Asks every (title, ref, expr, promql) until each returned data or the time is up; returns
    (answered with their results, still pending)."""
    answered = []
    deadline = time.time() + deadline_s
    while pending and time.time() < deadline:
        still = []
        for item in pending:
            # Data = at least one series with a finite value (a quantile or a ratio over a window
            # without jobs is NaN: not yet data; the load keeps running, so ask again).
            result = finite(prom, item[3])
            (answered if result else still).append(item + (result,) if result else item)
        pending = still
        if pending:
            time.sleep(2)
    return answered, pending


def dashboard(cluster, load, report_path, deadline_s=90):
    prom = cluster.env["DFA_PROMETHEUS"]
    dash = dq.load_dashboard()
    pending = [(t, ref, e, dq.substitute(e, RATE_INTERVAL, ".*")) for t, ref, e in dq.queries(dash)]
    # The recording rules must produce data too.
    for rule in ("worker:dfa_step_idle_fraction:ratio_rate1m", "worker:dfa_attention_flops:rate1m",
                 "cluster:dfa_attention_flops:rate1m", "kind:dfa_job_latency_seconds:p99_rate5m",
                 "job:dfa_request_server_errors:ratio_rate5m"):
        pending.append(("recording rule", "", rule, rule))
    health = 'count(up{job=~"dfa-.*"} == 1) == 3'  # coordinator + 2 workers scraped
    pending.append(("scrape health", "", health, health))
    # The variables' own queries list this cluster's values.
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            pending.append((f"variable ${var['name']}", "", var["definition"], None))
    variables = [p for p in pending if p[3] is None]
    pending = [p for p in pending if p[3] is not None]
    answered, pending = wait_for_data(prom, pending, deadline_s)
    problems = [f"no data: panel '{t}' {ref}: {promql}" for t, ref, _, promql in pending]
    problems += check_variables(prom, variables)
    # This cluster's own values: cluster="local" (prometheus-local.yml), each job alone.
    panels = [(t, ref, e) for t, ref, e in dq.queries(dash)]
    own = [(t, ref, e, dq.substitute(e, RATE_INTERVAL, ".*", cluster="local", job="dfa-.*"))
           for t, ref, e in panels]
    by_job = {"dfa-coordinator": [], "dfa-worker": []}
    for t, ref, e in panels:
        series = {s for s, _ in dq.selectors(e)}
        job = ("dfa-worker" if all(s.startswith(("dfa_worker_", "dfa_transport_")) for s in series)
               else "dfa-coordinator" if all(s.startswith("dfa_coordinator_") for s in series)
               else None)
        if job:
            by_job[job].append((t, ref, e, dq.substitute(e, RATE_INTERVAL, ".*", cluster="local",
                                                         job=job)))
    scoped, missing = wait_for_data(prom, own + by_job["dfa-coordinator"] + by_job["dfa-worker"], 30)
    problems += [f"no data with cluster=local / its own job: panel '{t}' {ref}: {promql}"
                 for t, ref, _, promql in missing]
    log(f"{len(scoped)} queries returned data with this cluster's own variable values")
    # And nothing for a cluster, namespace or job that is not there: every query is scoped.
    for var in dq.SCOPE_VARIABLES:
        for t, ref, e in panels:
            promql = dq.substitute(e, RATE_INTERVAL, ".*", **{var: "no-such-" + var})
            got = finite(prom, promql)
            if got:
                problems.append(f"panel '{t}' {ref} returns data for {var}=no-such-{var}: "
                                f"{promql} -> {got[:1]}")
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
    return problems


def check_variables(prom, variables):
    """Each variable's label_values(selector, label) lists this cluster's values."""
    want = {"cluster": {"local"}, "job": {"dfa-coordinator", "dfa-worker"}}
    problems = []
    for title, _, definition, _ in variables:
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", definition)
        if not m:
            problems.append(f"{title}: cannot read {definition}")
            continue
        selector = dq.substitute(m.group(1), RATE_INTERVAL, ".*")
        values = {r["metric"].get(m.group(2)) for r in query(prom, selector)} - {None}
        log(f"{title}: {sorted(values)}")
        if m.group(2) in want and not want[m.group(2)] <= values:
            problems.append(f"{title}: lists {sorted(values)}, want {sorted(want[m.group(2)])}")
        if m.group(2) == "worker" and len(values) != 2:
            problems.append(f"{title}: lists {sorted(values)}, want the 2 workers")
    return problems


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
