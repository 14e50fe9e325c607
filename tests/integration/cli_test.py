#!/usr/bin/env python3
"""The command lines on real processes: dfa (every subcommand), dfa-plan, dfa-plan-sweep and,
with --parts python, `python -m dfa`.

  help      -h / --help on every program and subcommand list its flags; --version prints
            "<program> <project version> (<build type> build)"
  typos     an unknown flag is named with the closest known one ("unknown flag --coordinatr
            (did you mean --coordinator?)"), never a later "--coordinator is required"; an
            unknown command likewise
  units     K/M/G sizes on every command: `dfa plan --seq 256K`, `dfa-plan-sweep --seq 16K`
  memory    `dfa submit --seq 64M --heads 64 --head-dim 128` is refused with a message naming
            the flags and the bytes (exit 2), never std::bad_alloc (134)
  cluster   `dfa cluster` (the one local launcher) up; `dfa status --json`, `dfa workers
            --json`, `dfa plan --json` parse with json.loads and have their documented keys;
            `dfa demo --coordinator` runs its verified job on it
  ctrl-c    SIGINT to `dfa submit` during a long job: exit 130, and within a bound the
            coordinator shows no job running and no session (dfa status --json); SIGINT to
            `dfa demo` stops the daemons it started; SIGINT to `dfa cluster` exits 0 and stops
            every daemon
  python    (--parts python) `python -m dfa --version/--help`, its did-you-mean, and `python -m dfa
            cluster` up with `python -m dfa status/workers --json` giving the same keys

Usage: cli_test.py --dfa BIN --plan BIN --sweep BIN --source-dir DIR --build-type TYPE
                   [--parts help,typos,units,cluster,demo,python]
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from proc_checks import alive, check, kill_left, log, summary, wait_for

STATUS_KEYS = {"coordinator", "live_workers", "sessions", "jobs_running", "jobs_queued",
               "client_leases", "memory_used_bytes", "memory_limit_bytes"}
WORKER_KEYS = {"worker_id", "address", "host", "backend", "device", "memory_limit_bytes",
               "memory_used_bytes", "speed", "last_seen_seconds", "alive", "incarnation"}
PLAN_KEYS = {"profile", "schedule", "workers", "seq_len", "causal", "makespan_ratio",
             "compute_makespan_ratio", "backward_makespan_ratio", "max_peak_buffer_bytes",
             "forward", "backward"}
# Flags each command's --help must list (a sample of its table; the unit test checks all).
HELP_FLAGS = {
    "demo": ["--coordinator", "--workers", "--threads", "--backend", "--seq", "--no-verify",
             "--auth-token"],
    "submit": ["--coordinator", "--seq", "--heads", "--kv-heads", "--head-dim", "--verify",
               "--forward-only", "--retries", "--tls-cert"],
    "status": ["--coordinator", "--job", "--json"],
    "workers": ["--coordinator", "--json"],
    "bench": ["--coordinator", "--transfer-mib", "--skip-single", "--repeat"],
    "cluster": ["--workers", "--threads", "--backend", "--memory-limit", "--env-file"],
    "plan": ["--workers", "--seq", "--schedule", "--json", "--profile", "--speeds"],
}

def run(cmd, timeout=60, env=None):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    return p.returncode, p.stdout, p.stderr


def project_version(source_dir):
    text = open(os.path.join(source_dir, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(\s*dfa\b[^)]*\bVERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise SystemExit("cli_test: no project(dfa ... VERSION x.y.z) in CMakeLists.txt")
    return m.group(1)


def test_help_and_version(a, version, build_type):
    programs = [("dfa", [a.dfa]), ("dfa-plan", [a.plan]), ("dfa-plan-sweep", [a.sweep])]
    for name, cmd in programs:
        want = f"{name} {version} ({build_type} build)"
        rc, out, err = run(cmd + ["--version"])
        check(rc == 0 and out.strip() == want, f"{name} --version: rc {rc}, {out!r}, want {want!r}")
        for h in ("-h", "--help"):
            rc, out, err = run(cmd + [h])
            check(rc == 0 and out.startswith("usage: "), f"{name} {h}: rc {rc}\n{out}{err}")
    for h in ("-h", "--help", "help"):
        rc, out, _ = run([a.dfa, h])
        check(rc == 0 and all(c in out for c in HELP_FLAGS), f"dfa {h} lists the commands: {out}")
    for sub, flags in HELP_FLAGS.items():
        for h in ("-h", "--help"):
            rc, out, err = run([a.dfa, sub, h])
            check(rc == 0 and out.startswith(f"usage: dfa {sub}"),
                  f"dfa {sub} {h}: rc {rc}\n{out}{err}")
            for f in flags + ["--help", "--version"]:
                check(re.search(re.escape(f) + r"\b", out), f"dfa {sub} {h} does not list {f}")
        rc, out, _ = run([a.dfa, sub, "--version"])
        check(rc == 0 and out.strip() == f"dfa {version} ({build_type} build)",
              f"dfa {sub} --version: {out!r}")
    rc, out, _ = run([a.plan, "--help"])
    check("--seq" in out and "--schedule" in out, "dfa-plan --help lists --seq and --schedule")
    rc, out, _ = run([a.sweep, "--help"])
    check("--max-workers" in out and "--patterns" in out, "dfa-plan-sweep --help lists its flags")


def test_typos(a):
    rc, out, err = run([a.dfa, "submit", "--coordinatr", "127.0.0.1:1"])
    check(rc == 2, f"dfa submit --coordinatr: exit {rc}, want 2")
    check("unknown flag --coordinatr (did you mean --coordinator?)" in err,
          f"dfa submit --coordinatr names the flag and the fix: {err!r}")
    check("is required" not in err, f"dfa submit --coordinatr must not say 'is required': {err!r}")
    for cmd in ([a.dfa, "status", "--coordinatr", "x"], [a.dfa, "workers", "--coordinatr", "x"],
                [a.dfa, "demo", "--coordinatr", "x"], [a.dfa, "bench", "--coordinatr", "x"]):
        rc, _, err = run(cmd)
        check(rc == 2 and "did you mean --coordinator?" in err, f"{cmd[1:]}: {rc} {err!r}")
    rc, _, err = run([a.dfa, "plan", "--workers", "2", "--seq", "4K", "--schedul", "ring"])
    check(rc == 2 and "unknown flag --schedul (did you mean --schedule?)" in err,
          f"dfa plan --schedul: {rc} {err!r}")
    rc, _, err = run([a.sweep, "--max-worker", "4"])
    check(rc == 2 and "did you mean --max-workers?" in err, f"dfa-plan-sweep --max-worker: {err!r}")
    rc, _, err = run([a.dfa, "sumbit"])
    check(rc == 2 and "unknown command 'sumbit' (did you mean 'submit'?)" in err,
          f"dfa sumbit: {rc} {err!r}")
    rc, _, err = run([a.dfa, "cluster", "--workers", "0"])
    check(rc == 2 and "--workers" in err, f"dfa cluster --workers 0: {rc} {err!r}")


def test_units_and_memory(a):
    rc, out, err = run([a.dfa, "plan", "--workers", "4", "--seq", "256K", "--schedule", "balanced",
                        "--json"])
    check(rc == 0, f"dfa plan --seq 256K: exit {rc}: {err}")
    if rc == 0:
        d = json.loads(out)
        check(PLAN_KEYS <= set(d), f"dfa plan --json keys: {sorted(d)}")
        check(d["seq_len"] == 262144 and d["workers"] == 4, f"dfa plan --seq 256K: {d['seq_len']}")
    rc, out, err = run([a.plan, "--workers=2", "--seq=64k", "--schedule=ring", "--json"])
    check(rc == 0 and json.loads(out)["seq_len"] == 65536, f"dfa-plan --seq=64k: {rc} {err}")
    rc, out, err = run([a.sweep, "--seq", "16K", "--max-workers", "2", "--patterns", "equal",
                        "--mask", "causal"])
    check(rc == 0 and "seq 16384" in out, f"dfa-plan-sweep --seq 16K: {rc} {out}{err}")
    rc, _, err = run([a.dfa, "plan", "--workers", "2", "--seq", "1.5K", "--schedule", "ring"])
    check(rc == 2 and "--seq" in err, f"dfa plan --seq 1.5K refused naming --seq: {err!r}")

    # Terabytes of host tensors: refused before any allocation (no coordinator is contacted).
    rc, out, err = run([a.dfa, "submit", "--coordinator", "127.0.0.1:1", "--seq", "64M",
                        "--heads", "64", "--head-dim", "128"], timeout=30)
    check(rc == 2, f"dfa submit --seq 64M: exit {rc} (134 is an abort), want 2: {err!r}")
    for want in ("--seq 67108864", "--heads 64", "--head-dim 128", "TiB", "host memory"):
        check(want in err, f"dfa submit --seq 64M: message lacks {want!r}: {err!r}")
    check("bad_alloc" not in err, f"dfa submit --seq 64M: {err!r}")


class Background:
    """A command in its own session (so a SIGINT reaches only it), output to a file."""

    def __init__(self, cmd, path, env=None):
        self.path = path
        self.out = open(path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)

    def text(self):
        self.out.flush()
        with open(self.path, errors="replace") as f:
            return f.read()

    def interrupt(self, timeout):
        """SIGINT; returns (exit status or None on timeout, seconds it took)."""
        t = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.monotonic() - t

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.out.close()


def read_env(path):
    env = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            env[k] = v.strip('"')
    return env


def daemons_with(text):
    """Pids of dfa-coordinator / dfa-worker processes whose command line contains `text`."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if ("dfa-worker" in cmd or "dfa-coordinator" in cmd) and text in cmd and alive(int(d)):
            pids.append(int(d))
    return pids


def status_json(a, coordinator):
    rc, out, err = run([a.dfa, "status", "--coordinator", coordinator, "--json"], timeout=30)
    if rc != 0:
        return None
    return json.loads(out)


def test_cluster(a, tmp):
    pids = []
    run_dir = os.path.join(tmp, "cluster")
    env_file = os.path.join(tmp, "cluster.env")
    cluster = Background([a.dfa, "cluster", "--workers", "2", "--log-dir", run_dir,
                          "--env-file", env_file], os.path.join(tmp, "cluster.out"))
    try:
        if not check(wait_for(lambda: os.path.exists(env_file) or cluster.proc.poll() is not None,
                              60) and os.path.exists(env_file),
                     f"dfa cluster wrote {env_file}:\n{cluster.text()}"):
            return
        env = read_env(env_file)
        coordinator = env["DFA_COORDINATOR"]
        pids = [int(p) for p in env["DFA_PIDS"].split()]
        check(len(pids) == 3 and len(env["DFA_WORKERS"].split()) == 2,
              f"cluster.env lists 1 coordinator + 2 workers: {env}")
        out = cluster.text()
        check(coordinator in out and "worker-1" in out, f"dfa cluster prints the addresses: {out}")
        log(f"cluster up: coordinator {coordinator}")

        s = status_json(a, coordinator)
        check(s is not None and STATUS_KEYS <= set(s), f"dfa status --json keys: {s}")
        check(s is not None and s["live_workers"] == 2 and s["sessions"] == 0,
              f"dfa status --json: {s}")
        rc, out, err = run([a.dfa, "workers", "--coordinator", coordinator, "--json"])
        if check(rc == 0, f"dfa workers --json: {rc} {err}"):
            w = json.loads(out)
            check(len(w["workers"]) == 2 and all(WORKER_KEYS <= set(x) for x in w["workers"]),
                  f"dfa workers --json keys: {w}")
            check(all(x["alive"] for x in w["workers"]), f"dfa workers: all alive: {w}")

        rc, out, err = run([a.dfa, "demo", "--coordinator", coordinator, "--seq", "1K"],
                           timeout=120)
        check(rc == 0 and "dfa demo: PASS" in out, f"dfa demo --coordinator: {rc}\n{out}{err}")
        rc, _, err = run([a.dfa, "demo", "--coordinator", coordinator, "--threads", "2"])
        check(rc == 2 and "--threads" in err, f"dfa demo --coordinator --threads: {rc} {err!r}")

        test_submit_ctrl_c(a, tmp, coordinator)

        rc, secs = cluster.interrupt(timeout=30)
        check(rc == 0, f"dfa cluster on Ctrl-C: exit {rc}, want 0:\n{cluster.text()}")
        left = [p for p in pids if alive(p)]
        check(not left, f"daemons left after dfa cluster's Ctrl-C: {left}")
        log(f"dfa cluster stopped in {secs:.2f} s on Ctrl-C")
    finally:
        cluster.kill()
        kill_left(pids)


def test_submit_ctrl_c(a, tmp, coordinator):
    # ~1.1 TFLOP of causal forward on 2 one-thread workers: tens of seconds. SIGINT once it runs.
    sub = Background([a.dfa, "submit", "--coordinator", coordinator, "--seq", "32K", "--heads",
                      "8", "--head-dim", "64"], os.path.join(tmp, "submit.out"))
    try:
        running = wait_for(lambda: (status_json(a, coordinator) or {}).get("jobs_running", 0) >= 1
                           or sub.proc.poll() is not None, 60, step=0.05)
        if not check(running and sub.proc.poll() is None,
                     f"dfa submit's job runs: {sub.text()}"):
            return
        rc, secs = sub.interrupt(timeout=15)
        out = sub.text()
        check(rc == 130, f"dfa submit on Ctrl-C: exit {rc}, want 130:\n{out}")
        check(secs < 10, f"dfa submit took {secs:.1f} s to exit on Ctrl-C")
        check("cancelled" in out and "released" in out, f"dfa submit says what it gave back: {out}")
        t = time.monotonic()
        clean = wait_for(lambda: (lambda s: s is not None and s["sessions"] == 0 and
                                  s["jobs_running"] == 0 and s["jobs_queued"] == 0)(
                                      status_json(a, coordinator)), 5)
        check(clean, f"within 5 s of Ctrl-C: no session, no job: {status_json(a, coordinator)}")
        log(f"dfa submit: exit {rc} {secs:.2f} s after SIGINT; cluster clean "
            f"{time.monotonic() - t:.2f} s later")
    finally:
        sub.kill()


def test_demo_ctrl_c(a, tmp):
    daemons = []
    log_dir = os.path.join(tmp, "demo-logs")
    demo = Background([a.dfa, "demo", "--seq", "32K", "--log-dir", log_dir],
                      os.path.join(tmp, "demo.out"))
    try:
        # The job runs once its uploads are done (the progress lines are flushed).
        ok = wait_for(lambda: "upload V" in demo.text() or demo.proc.poll() is not None, 90)
        coordinator_log = os.path.join(log_dir, "coordinator.log")
        if not check(ok and demo.proc.poll() is None and os.path.exists(coordinator_log),
                     f"dfa demo starts its cluster and uploads: {demo.text()}"):
            return
        # The daemons' command lines carry the coordinator's address the demo printed.
        m = re.search(r"coordinator (127\.0\.0\.1:\d+)", demo.text())
        daemons = daemons_with(m.group(1)) if m else []
        check(len(daemons) == 3, f"dfa demo runs 3 daemons: {daemons}")
        rc, secs = demo.interrupt(timeout=30)
        check(rc == 130, f"dfa demo on Ctrl-C: exit {rc}, want 130:\n{demo.text()}")
        gone = wait_for(lambda: not [p for p in daemons if alive(p)], 5)
        check(gone, f"dfa demo's daemons left after Ctrl-C: {[p for p in daemons if alive(p)]}")
        log(f"dfa demo: exit {rc} {secs:.2f} s after SIGINT, its daemons stopped")
    finally:
        demo.kill()
        kill_left(daemons)


def test_python(a, tmp):
    py = [sys.executable, "-m", "dfa"]
    rc, out, err = run(py + ["--version"])
    check(rc == 0 and out.startswith("python -m dfa "), f"python -m dfa --version: {rc} {out!r}")
    for sub in ("", "status", "workers", "cluster"):
        rc, out, err = run(py + ([sub] if sub else []) + ["--help"])
        check(rc == 0 and "usage:" in out, f"python -m dfa {sub} --help: {rc} {out}{err}")
    rc, _, err = run(py + ["status", "--coordinatr", "x"])
    check(rc == 2 and "unknown flag --coordinatr (did you mean --coordinator?)" in err,
          f"python -m dfa status --coordinatr: {rc} {err!r}")
    rc, _, err = run(py + ["stauts"])
    check(rc == 2 and "did you mean 'status'?" in err, f"python -m dfa stauts: {rc} {err!r}")

    cluster = Background(py + ["cluster", "--workers", "2", "--log-dir",
                               os.path.join(tmp, "py-cluster")], os.path.join(tmp, "py.out"))
    coordinator = None
    try:
        m = wait_for(lambda: re.search(r"coordinator\s+(127\.0\.0\.1:\d+)", cluster.text())
                     or cluster.proc.poll() is not None, 60)
        if not check(m and m is not True and cluster.proc.poll() is None,
                     f"python -m dfa cluster starts: {cluster.text()}"):
            return
        coordinator = m.group(1)
        out = cluster.text()
        check("2 cpu worker(s), 1 thread(s) each" in out,
              f"python -m dfa cluster uses the C++ defaults: {out}")
        test_python_status(a, coordinator)
        daemons = daemons_with(coordinator)
        check(len(daemons) == 3, f"python -m dfa cluster runs 3 daemons: {daemons}")
        rc, _ = cluster.interrupt(timeout=30)
        check(rc == 0, f"python -m dfa cluster on Ctrl-C: exit {rc}:\n{cluster.text()}")
        check(wait_for(lambda: not [p for p in daemons if alive(p)], 5),
              "python -m dfa cluster's daemons stopped on Ctrl-C")
    finally:
        cluster.kill()
        if coordinator:
            kill_left(daemons_with(coordinator))


def test_python_status(a, coordinator):
    py = [sys.executable, "-m", "dfa"]
    rc, out, err = run(py + ["status", "--coordinator", coordinator, "--json"])
    if check(rc == 0, f"python -m dfa status --json: {rc} {err}"):
        s = json.loads(out)
        check(set(s) == STATUS_KEYS, f"python -m dfa status --json keys: {sorted(s)}")
        check(s["live_workers"] == 2, f"python -m dfa status: {s}")
    rc, out, err = run(py + ["workers", "--coordinator", coordinator, "--json"])
    if check(rc == 0, f"python -m dfa workers --json: {rc} {err}"):
        w = json.loads(out)
        check(len(w["workers"]) == 2 and all(set(x) == WORKER_KEYS for x in w["workers"]),
              f"python -m dfa workers --json keys: {w}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dfa", required=True)
    ap.add_argument("--plan", required=True)
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-type", required=True)
    ap.add_argument("--parts", default="help,typos,units,cluster,demo",
                    help="which checks: help, typos, units, cluster, demo, python (python -m dfa:"
                         " the package on PYTHONPATH, DFA_BIN_DIR set)")
    a = ap.parse_args()
    parts = a.parts.split(",")
    version = project_version(a.source_dir)
    with tempfile.TemporaryDirectory(prefix="dfa-cli-test-") as tmp:
        for name, fn in (("help", lambda: test_help_and_version(a, version, a.build_type or
                                                                 "unknown")),
                         ("typos", lambda: test_typos(a)),
                         ("units", lambda: test_units_and_memory(a)),
                         ("cluster", lambda: test_cluster(a, tmp)),
                         ("demo", lambda: test_demo_ctrl_c(a, tmp)),
                         ("python", lambda: test_python(a, tmp))):
            if name not in parts:
                continue
            t = time.monotonic()
            fn()
            log(f"-- {name}: {time.monotonic() - t:.1f} s")
    return summary("cli_test")


if __name__ == "__main__":
    sys.exit(main())
