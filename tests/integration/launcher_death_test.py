#!/usr/bin/env python3
"""A local cluster's daemons never outlive the program that launched them (client/local_cluster.h,
client/child_process.h, client/cli/interrupt.h), on real processes:

  head     `dfa demo | head -1` (a real shell pipeline): the demo stops its daemons on the
           broken pipe and exits 141 (SIGPIPE) instead of dying with them left running
  pipe     the same with the reader closed mid-run, from Python (the demo's daemons known by
           pid first): exit 141 within a bound, every daemon gone
  sigkill  `dfa cluster` SIGKILLed (no clean-up can run): every daemon listed in its env file
           (DFA_PIDS) is gone within a bound (PR_SET_PDEATHSIG)
  sighup   `dfa cluster` sent SIGHUP (its terminal gone): exit 0, daemons gone
  quiet    `dfa cluster | head -1`: once head has its line the cluster stops (nothing else is
           written while it is up; the launcher notices the reader gone), daemons gone
  python   (--parts python; the package on PYTHONPATH, DFA_BIN_DIR set) a Python process
           holding a dfa.LocalCluster (started from the binding's short-lived call thread)
           keeps its daemons while it lives and, SIGKILLed, leaves none within the bound

A daemon is found by pid: a process whose stdout is a log file of the cluster's log directory.

Usage: launcher_death_test.py --dfa BIN [--parts head,pipe,sigkill,sighup,quiet,python]
"""
import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

from proc_checks import alive, check, kill_left, log, summary, wait_for

BOUND_S = 15  # a daemon's own SIGTERM shutdown is ~1-2 s on the 2-core box


def daemons_logging_to(log_dir):
    """Pids of live processes whose stdout is a file under `log_dir` (the daemons' logs)."""
    log_dir = os.path.realpath(log_dir)
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            target = os.readlink(f"/proc/{d}/fd/1")
        except OSError:
            continue
        if target.startswith(log_dir + "/") and alive(int(d)):
            pids.append(int(d))
    return sorted(pids)


def gone_within(pids, bound):
    t = time.monotonic()
    ok = wait_for(lambda: not [p for p in pids if alive(p)], bound, step=0.05)
    return ok, time.monotonic() - t


def test_head(a, tmp):
    log_dir = os.path.join(tmp, "head-logs")
    cmd = f"{shlex.quote(a.dfa)} demo --seq 4K --log-dir {shlex.quote(log_dir)} | head -1"
    t = time.monotonic()
    p = subprocess.run(["bash", "-c", f"{cmd}; echo \"rc=${{PIPESTATUS[0]}}\" >&2"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       stdin=subprocess.DEVNULL, timeout=120)
    secs = time.monotonic() - t
    left = daemons_logging_to(log_dir)
    try:
        check(p.stdout.startswith("dfa demo: starting"), f"head -1 got the first line: {p.stdout!r}")
        check(os.path.exists(os.path.join(log_dir, "coordinator.log")),
              f"the demo started its cluster: {p.stderr}")
        check(not left, f"`dfa demo | head -1` left daemons running: {left}\n{p.stderr}")
        rc = p.stderr.strip().rsplit("rc=", 1)[-1]
        check(rc == "141", f"`dfa demo | head -1`: dfa exit {rc}, want 141 (stopped on the "
                           f"broken pipe):\n{p.stderr}")
        check("stopping the local cluster" in p.stderr, f"says it stops the cluster: {p.stderr}")
        log(f"`dfa demo | head -1`: dfa exit {rc} after {secs:.2f} s, no daemon left")
    finally:
        kill_left(left)


def test_pipe(a, tmp):
    log_dir = os.path.join(tmp, "pipe-logs")
    # S = 32K on 2 one-thread workers: tens of seconds of job, so the reader goes mid-run.
    demo = subprocess.Popen([a.dfa, "demo", "--seq", "32K", "--log-dir", log_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    daemons = []
    try:
        daemons = wait_for(lambda: (lambda d: d if len(d) == 3 else None)(
            daemons_logging_to(log_dir)), 60) or []
        if not check(len(daemons) == 3, f"dfa demo runs 3 daemons: {daemons}"):
            return
        first = demo.stdout.readline().decode()
        check(first.startswith("dfa demo: starting"), f"first line: {first!r}")
        demo.stdout.close()  # what `| head -1` does once it has its line
        t = time.monotonic()
        try:
            rc = demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            rc = None
        secs = time.monotonic() - t
        err = demo.stderr.read().decode(errors="replace")
        check(rc == 141, f"dfa demo with its reader gone: exit {rc}, want 141:\n{err}")
        ok, gone_s = gone_within(daemons, BOUND_S)
        check(ok, f"daemons left after the demo's reader went: "
                  f"{[p for p in daemons if alive(p)]}\n{err}")
        check("cancelling the job" in err or "stopping the local cluster" in err,
              f"the demo says what it gives back: {err}")
        log(f"dfa demo, reader closed: exit {rc} {secs:.2f} s later; daemons gone "
            f"{gone_s:.2f} s after that")
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        kill_left(daemons)


def start_cluster(a, tmp, name, stdout):
    log_dir = os.path.join(tmp, f"{name}-logs")
    env_file = os.path.join(tmp, f"{name}.env")
    proc = subprocess.Popen([a.dfa, "cluster", "--workers", "2", "--log-dir", log_dir,
                             "--env-file", env_file], stdout=stdout, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    ok = wait_for(lambda: os.path.exists(env_file) or proc.poll() is not None, 60)
    pids = []
    if ok and os.path.exists(env_file):
        with open(env_file) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                if k == "DFA_PIDS":
                    pids = [int(x) for x in v.strip('"').split()]
    return proc, pids, log_dir


def test_sigkill(a, tmp):
    proc, pids, log_dir = start_cluster(a, tmp, "sigkill", subprocess.DEVNULL)
    try:
        if not check(len(pids) == 3 and all(alive(p) for p in pids),
                     f"dfa cluster up with 3 daemons: {pids}"):
            return
        check(sorted(pids) == daemons_logging_to(log_dir),
              f"DFA_PIDS are the daemons logging to {log_dir}: {pids}")
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, not its group
        proc.wait()
        ok, secs = gone_within(pids, BOUND_S)
        check(ok, f"daemons left {BOUND_S} s after dfa cluster was SIGKILLed: "
                  f"{[p for p in pids if alive(p)]}")
        log(f"dfa cluster SIGKILLed: its 3 daemons gone within {secs:.2f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_left(pids)


def test_sighup(a, tmp):
    proc, pids, _ = start_cluster(a, tmp, "sighup", subprocess.DEVNULL)
    try:
        if not check(len(pids) == 3, f"dfa cluster up with 3 daemons: {pids}"):
            return
        t = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        err = proc.stderr.read().decode(errors="replace")
        check(rc == 0, f"dfa cluster on SIGHUP: exit {rc}, want 0: {err}")
        left = [p for p in pids if alive(p)]
        check(not left, f"daemons left after dfa cluster's SIGHUP: {left}")
        log(f"dfa cluster SIGHUP: exit {rc} in {time.monotonic() - t:.2f} s, daemons gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_left(pids)


def test_quiet(a, tmp):
    proc, pids, _ = start_cluster(a, tmp, "quiet", subprocess.PIPE)
    try:
        if not check(len(pids) == 3, f"dfa cluster up with 3 daemons: {pids}"):
            return
        first = proc.stdout.readline().decode()
        check(first.startswith("coordinator"), f"first line: {first!r}")
        proc.stdout.close()
        t = time.monotonic()
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        err = proc.stderr.read().decode(errors="replace")
        check(rc == 0, f"`dfa cluster | head -1`: exit {rc}, want 0: {err}")
        left = [p for p in pids if alive(p)]
        check(not left, f"daemons left after `dfa cluster | head -1`: {left}")
        log(f"`dfa cluster | head -1`: exit {rc} {time.monotonic() - t:.2f} s after the reader "
            "went, daemons gone")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_left(pids)


PY_HOLDER = r"""
import sys, time
import dfa
cluster = dfa.LocalCluster(workers=2, log_dir=sys.argv[1])
print("UP", flush=True)
time.sleep(120)
"""


def test_python(a, tmp):
    log_dir = os.path.join(tmp, "python-logs")
    proc = subprocess.Popen([sys.executable, "-c", PY_HOLDER, log_dir], stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    daemons = []
    try:
        up = proc.stdout.readline().decode().strip()
        if not check(up == "UP", f"python started its LocalCluster: {up!r}"):
            return
        time.sleep(1.0)  # the thread that started the cluster has ended by now
        daemons = daemons_logging_to(log_dir)
        check(len(daemons) == 3, f"the Python process holds 3 live daemons: {daemons}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        ok, secs = gone_within(daemons, BOUND_S)
        check(ok, f"daemons left after the Python process was SIGKILLed: "
                  f"{[p for p in daemons if alive(p)]}")
        log(f"python with a dfa.LocalCluster SIGKILLed: its 3 daemons gone within {secs:.2f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_left(daemons)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dfa", required=True)
    ap.add_argument("--parts", default="head,pipe,sigkill,sighup,quiet")
    a = ap.parse_args()
    parts = a.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="dfa-launcher-test-") as tmp:
        for name, fn in (("head", test_head), ("pipe", test_pipe), ("sigkill", test_sigkill),
                         ("sighup", test_sighup), ("quiet", test_quiet),
                         ("python", test_python)):
            if name not in parts:
                continue
            t = time.monotonic()
            fn(a, tmp)
            log(f"-- {name}: {time.monotonic() - t:.1f} s")
    return summary("launcher_death_test")


if __name__ == "__main__":
    sys.exit(main())
