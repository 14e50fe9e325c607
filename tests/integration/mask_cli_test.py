"""`dfa demo` with --doc-lengths and --window on local CPU clusters (P = 1 and P = 3), and
`dfa submit --verify` with them against a `dfa cluster` of 3 workers:
forward + backward verified against single-device attention under the same mask (exit 0,
"dfa demo: PASS", every tensor "ok"), the job line naming the mask, FLOPs counting visible pairs
(fewer than the dense causal job's); and bad mask flags refused with exit 2 naming the flag.

Run: python3 tests/integration/mask_cli_test.py --dfa build/client/dfa
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time


def run(dfa, *args, timeout=240):
    p = subprocess.run([dfa, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def gflop(out, label):
    m = re.search(r"^%s\s+\S+ s\s+([0-9.]+) GFLOP " % label, out, re.M)
    assert m, "no %s line in:\n%s" % (label, out)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dfa", required=True)
    a = ap.parse_args()
    failures = []

    def check(cond, what, out=""):
        if not cond:
            failures.append(what)
            print("FAIL: %s\n%s" % (what, out[-3000:]))
        else:
            print("ok: %s" % what)

    seq = "1536"
    # Uneven documents (a 1-token one) crossing the shards of 3 workers, and a window.
    mask = ["--doc-lengths", "1,700,1,322,512", "--window", "200"]
    for workers in ("1", "3"):
        rc, out = run(a.dfa, "demo", "--workers", workers, "--seq", seq, "--heads", "4",
                      "--head-dim", "32", *mask)
        check(rc == 0 and "dfa demo: PASS" in out, "demo P=%s masked passes" % workers, out)
        check(out.count(" ok ") >= 5 and " FAIL " not in out,
              "demo P=%s: O, LSE, dQ, dK, dV verified" % workers, out)
        check("causal docs=5 window=200,0" in out, "demo P=%s job line names the mask" % workers,
              out)
        if rc == 0:
            rc2, dense = run(a.dfa, "demo", "--workers", workers, "--seq", seq, "--heads", "4",
                             "--head-dim", "32")
            check(rc2 == 0 and gflop(out, "forward") < 0.5 * gflop(dense, "forward"),
                  "demo P=%s FLOPs count visible pairs" % workers, out + dense)
    # Not causal, two-sided window with documents.
    rc, out = run(a.dfa, "demo", "--workers", "3", "--seq", "1000", "--heads", "2",
                  "--head-dim", "16", "--full", "--doc-lengths", "333,1,666", "--window", "50,25")
    check(rc == 0 and "dfa demo: PASS" in out and "full docs=3 window=50,25" in out,
          "demo P=3 full two-sided window passes", out)

    # dfa submit against a running cluster (dfa cluster writes its coordinator to the env file).
    with tempfile.TemporaryDirectory() as tmp:
        env_file = os.path.join(tmp, "cluster.env")
        with open(os.path.join(tmp, "cluster.out"), "w") as log:
            cluster = subprocess.Popen([a.dfa, "cluster", "--workers", "3", "--log-dir",
                                        os.path.join(tmp, "logs"), "--env-file", env_file],
                                       stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 60
            while not os.path.exists(env_file) and cluster.poll() is None and \
                    time.time() < deadline:
                time.sleep(0.1)
            time.sleep(0.2)  # the file is written whole before the cluster prints "ready"
            env = {}
            if os.path.exists(env_file):
                for line in open(env_file):
                    if "=" in line:
                        key, value = line.strip().split("=", 1)
                        env[key] = value.strip("'\"")
            check("DFA_COORDINATOR" in env, "dfa cluster up", str(env))
            if "DFA_COORDINATOR" in env:
                rc, out = run(a.dfa, "submit", "--coordinator", env["DFA_COORDINATOR"], "--seq",
                              seq, "--heads", "4", "--head-dim", "32", "--verify", *mask)
                check(rc == 0 and out.count(" ok ") >= 5 and " FAIL " not in out and
                      "docs=5 window=200,0" in out, "submit --verify masked on 3 workers", out)
        finally:
            cluster.send_signal(signal.SIGINT)
            try:
                cluster.wait(timeout=30)
            except subprocess.TimeoutExpired:
                cluster.kill()

    for bad, message in (
            (["--doc-lengths", "100,200"], "--doc-lengths: the lengths sum to 300, --seq is 1536"),
            (["--window", "-5"], "--window: LEFT = '-5' is not a count >= 0 or -1 (unbounded)"),
            (["--doc-lengths", "1536", "--window", "1,2,3"],
             "--window: '1,2,3' is not LEFT or LEFT,RIGHT")):
        for command in ("demo", "plan"):
            extra = ["--schedule", "balanced", "--workers", "2"] if command == "plan" else []
            rc, out = run(a.dfa, command, "--seq", seq, *extra, *bad)
            check(rc == 2 and message in out, "%s %s refused naming the flag" % (command, bad),
                  out)
    rc, out = run(a.dfa, "plan", "--workers", "4", "--seq", "64K", "--schedule", "balanced",
                  "--doc-lengths", "1K,31K,32K", "--window", "4K")
    check(rc == 0 and "CheckPlan: OK" in out and "4096" in out, "plan takes the mask flags", out)
    if failures:
        print("%d failed" % len(failures))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
