#!/usr/bin/env python3
"""Secrets as files on real processes (Kubernetes mounts Secrets as files): a dfa-coordinator
given its client and worker tokens by --auth_token_file / --worker_token_file, a dfa-worker by
--worker_token_file, and the `dfa` command (and, with --python, `python -m dfa`) by
--auth-token-file.

  files     the worker registers with the token from its file; `dfa status/workers
            --auth-token-file` are answered; without a token, or with the worker token, the
            coordinator refuses (UNAUTHENTICATED / PERMISSION_DENIED); a file ending in a newline
            works (what `kubectl create secret --from-file` and editors leave)
  refusals  a value and a file for one token: refused naming both flags; an empty or missing file:
            refused naming the flag (exit 2: the daemons and the CLI alike), before anything
            is served

Usage: token_file_test.py --dfa BIN --coordinator BIN --worker BIN [--python]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

failures = []
checks = 0
ENV = {k: v for k, v in os.environ.items() if k != "DFA_AUTH_TOKEN"}


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def run(cmd, timeout=60):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=ENV)
    return p.returncode, p.stdout, p.stderr


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


def start_coordinator(binary, args, log):
    """Starts it on a free port; returns (process, address) once it printed its ready line."""
    out = open(log + ".out", "w+")
    p = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--lease_ms=900"] + args,
                         stdout=out, stderr=open(log, "w"), stdin=subprocess.DEVNULL, env=ENV)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and p.poll() is None:
        out.seek(0)
        m = re.search(r"dfa-coordinator listening on (\S+)", out.read())
        if m:
            return p, m.group(1)
        time.sleep(0.02)
    return p, None


def stop(p):
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for_worker(a, address, token_file, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rc, out, err = run([a.dfa, "workers", "--coordinator", address, "--auth-token-file",
                            token_file, "--json"])
        if rc == 0 and any(w["alive"] for w in json.loads(out)["workers"]):
            return json.loads(out)
        time.sleep(0.1)
    return None


def test_files(a, tmp):
    client_token = write(os.path.join(tmp, "auth-token"), "client-secret-0123456789\n")
    worker_token = write(os.path.join(tmp, "worker-token"), "worker-secret-9876543210")
    c, address = start_coordinator(a.coordinator, [f"--auth_token_file={client_token}",
                                                   f"--worker_token_file={worker_token}"],
                                   os.path.join(tmp, "coordinator.log"))
    w = None
    try:
        if not check(address, f"coordinator with token files did not start: "
                              f"{open(os.path.join(tmp, 'coordinator.log')).read()}"):
            return
        w = subprocess.Popen([a.worker, "--listen=127.0.0.1:0", f"--coordinator={address}",
                              "--worker_id=token-file-worker", "--threads=1",
                              "--memory_limit=256M", f"--worker_token_file={worker_token}"],
                             stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "w.log"), "w"),
                             stdin=subprocess.DEVNULL, env=ENV)
        listed = wait_for_worker(a, address, client_token)
        check(listed and listed["workers"][0]["worker_id"] == "token-file-worker",
              f"the worker with --worker_token_file is not listed: {listed}; worker log: "
              f"{open(os.path.join(tmp, 'w.log')).read()}")
        rc, out, err = run([a.dfa, "status", "--coordinator", address, "--auth-token-file",
                            client_token, "--json"])
        check(rc == 0 and json.loads(out)["live_workers"] == 1,
              f"dfa status --auth-token-file: {rc} {out} {err}")
        rc, out, err = run([a.dfa, "status", "--coordinator", address, "--json"])
        check(rc != 0 and "UNAUTHENTICATED" in err, f"no token: {rc} {err}")
        rc, out, err = run([a.dfa, "status", "--coordinator", address, "--auth-token-file",
                            worker_token])
        check(rc != 0 and "PERMISSION_DENIED" in err, f"the worker token as a client's: {rc} {err}")
        rc, out, err = run([a.dfa, "status", "--coordinator", address, "--auth-token", "x",
                            "--auth-token-file", client_token])
        check(rc == 2 and "--auth-token and --auth-token-file" in err, f"both: {rc} {err}")
        missing = os.path.join(tmp, "missing")
        rc, out, err = run([a.dfa, "status", "--coordinator", address, "--auth-token-file",
                            missing])
        check(rc == 2 and "--auth-token-file" in err and missing in err,
              f"missing file: {rc} {err}")
        if a.python:
            py = [sys.executable, "-m", "dfa"]
            rc, out, err = run(py + ["status", "--coordinator", address, "--auth-token-file",
                                     client_token, "--json"])
            check(rc == 0 and json.loads(out)["live_workers"] == 1,
                  f"python -m dfa status --auth-token-file: {rc} {out} {err}")
            rc, out, err = run(py + ["status", "--coordinator", address, "--auth-token", "x",
                                     "--auth-token-file", client_token])
            check(rc == 2 and "--auth-token and --auth-token-file" in err,
                  f"python -m dfa both: {rc} {err}")
            rc, out, err = run(py + ["status", "--coordinator", address, "--auth-token-file",
                                     missing])
            check(rc == 2 and "--auth-token-file" in err, f"python -m dfa missing: {rc} {err}")
        print(f"token files: coordinator {address}, worker registered, CLI answered", flush=True)
    finally:
        if w:
            stop(w)
        stop(c)


def test_refusals(a, tmp):
    token = write(os.path.join(tmp, "t"), "abc-123")
    empty = write(os.path.join(tmp, "empty"), "\n")
    cases = [
        (a.coordinator, ["--auth_token=abc", f"--auth_token_file={token}"],
         "--auth_token and --auth_token_file"),
        (a.coordinator, ["--worker_token=abc", f"--worker_token_file={token}"],
         "--worker_token and --worker_token_file"),
        (a.coordinator, [f"--auth_token_file={empty}"], "--auth_token_file"),
        (a.coordinator, [f"--auth_token_file={tmp}/none"], "--auth_token_file"),
        (a.worker, [f"--worker_token_file={empty}"], "--worker_token_file"),
    ]
    for binary, args, named in cases:
        rc, out, err = run([binary, "--listen=127.0.0.1:0"] + args, timeout=20)
        name = os.path.basename(binary)
        check(rc == 2 and named in err and "listening on" not in out,
              f"{name} {' '.join(args)}: exit {rc}, stderr {err!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dfa", required=True)
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--python", action="store_true", help="also python -m dfa (on PYTHONPATH)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="dfa-token-file-") as tmp:
        test_files(a, tmp)
        test_refusals(a, tmp)
    print(f"token_file_test: {checks} checks, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
