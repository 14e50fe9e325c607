#!/usr/bin/env python3
"""Both daemons describe themselves: --help and -h list their own flags, --version tells the
project version (project(dfa VERSION ...) in the root CMakeLists.txt) and the build type.

Usage: daemon_help_test.py --coordinator BIN --worker BIN --source-dir DIR --build-type TYPE
"""
import argparse
import os
import re
import subprocess
import sys

# Flags each daemon defines in its own main.cc; --help must list them.
OWN_FLAGS = {
    "dfa-worker": ["--listen", "--coordinator", "--backend", "--memory_limit", "--step_timeout_s"],
    "dfa-coordinator": ["--listen", "--lease_ms", "--session_ttl_s", "--max_seq_len",
                        "--auth_token"],
}
# absl's own flags (defined in absl's sources): --helpfull lists them, --help must not.
FOREIGN_FLAG = "--flagfile"


def project_version(source_dir):
    text = open(os.path.join(source_dir, "CMakeLists.txt"), encoding="utf-8").read()
    m = re.search(r"project\(\s*dfa\b[^)]*\bVERSION\s+([0-9][0-9.]*)", text)
    if not m:
        raise SystemExit("daemon_help_test: no project(dfa ... VERSION x.y.z) in CMakeLists.txt")
    return m.group(1)


def run(binary, arg):
    p = subprocess.run([binary, arg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, timeout=30, text=True)
    return p.returncode, p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--coordinator", required=True)
    ap.add_argument("--worker", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--build-type", required=True)
    a = ap.parse_args()
    version = project_version(a.source_dir)
    build_type = a.build_type or "unknown"
    failures = []
    checks = 0
    for name, binary in (("dfa-worker", a.worker), ("dfa-coordinator", a.coordinator)):
        for arg in ("--help", "-h"):
            code, out = run(binary, arg)
            checks += 1
            if "No flags matched" in out:
                failures.append(f"{name} {arg}: prints 'No flags matched'")
            for flag in OWN_FLAGS[name]:
                if not re.search(re.escape(flag) + r"\b", out):
                    failures.append(f"{name} {arg}: does not list {flag}:\n{out}")
            if FOREIGN_FLAG in out:
                failures.append(f"{name} {arg}: lists absl's {FOREIGN_FLAG} (only --helpfull "
                                f"should)")
            if "Listening" in out or "listening on" in out:
                failures.append(f"{name} {arg}: started serving instead of printing help")
        code, out = run(binary, "--version")
        checks += 1
        want = f"{name} {version} ({build_type} build)"
        if out.strip() != want:
            failures.append(f"{name} --version: got {out.strip()!r}, want {want!r}")
        if code != 0:
            failures.append(f"{name} --version: exit code {code}, want 0")
        code, out = run(binary, "--helpfull")
        checks += 1
        if FOREIGN_FLAG not in out or OWN_FLAGS[name][0] not in out:
            failures.append(f"{name} --helpfull: should list every flag, absl's included")
    for f in failures:
        print("FAIL:", f)
    print(f"daemon_help_test: {checks} runs, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
