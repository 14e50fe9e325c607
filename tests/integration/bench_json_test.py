#!/usr/bin/env python3
"""`dfa bench --json` on real processes: the bench starts its own local cluster (coordinator and
two CPU workers), runs the data-plane lines and forward+backward attention jobs and prints one
JSON document on stdout, nothing else.

  json      stdout is exactly one JSON object with the documented keys (docs/client.md); the 8
            data-plane lines, each a positive rate; percent_of_memcpy is the rate over memcpy's;
            the jobs (forward, backward per --repeat) succeeded with flops > 0 and
            flops_per_second = flops / wall_seconds; the best rates are the jobs' best; the
            ratios are service over single process; the spec is the flags'
  text      the text run of the same flags prints the same line labels and sections (the
            figures themselves differ run to run)
  skips     --skip-transfer --skip-single: "transfers" and "single_process" are null
  usage     a typo beside --json: exit 2, the flag named on stderr, nothing on stdout

Usage: bench_json_test.py --dfa BIN
"""
import argparse
import json
import subprocess
import sys

TOP_KEYS = {"coordinator", "local_cluster", "transfers", "attention"}
TRANSFER_KEYS = {"tensor_mib", "tensor_bytes", "repeats", "schedule", "workers_measured",
                 "memcpy_gbps", "lines", "round_trip_exact"}
LINE_KEYS = {"label", "direction", "path", "all_workers", "best_gbps", "percent_of_memcpy",
             "client_cpu_seconds_per_gb", "worker_cpu_seconds_per_gb", "bytes", "pieces"}
ATTENTION_KEYS = {"spec", "description", "workers", "schedule", "repeat", "backward", "jobs",
                  "best_forward_flops_per_second", "best_backward_flops_per_second",
                  "single_process", "forward_ratio", "backward_ratio"}
JOB_KEYS = {"job_id", "session_id", "kind", "state", "steps_done", "steps_total", "wall_seconds",
            "flops", "flops_per_second", "seconds_outside_workers", "workers"}
SMALL = ["--workers", "2", "--threads", "1", "--transfer-mib", "1", "--transfer-repeat", "1",
         "--seq", "1K", "--heads", "2", "--head-dim", "32", "--repeat", "2"]

failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def run(cmd, timeout=240):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       stdin=subprocess.DEVNULL, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


def test_json(dfa):
    rc, out, err = run([dfa, "bench"] + SMALL + ["--json"])
    if not check(rc == 0, f"dfa bench --json: exit {rc}:\n{err}"):
        return None
    try:
        d = json.loads(out)  # the whole of stdout: one document, no text lines around it
    except json.JSONDecodeError as e:
        check(False, f"dfa bench --json: stdout is not one JSON document ({e}):\n{out}")
        return None
    check(set(d) == TOP_KEYS, f"top-level keys {sorted(d)}")
    check(d["coordinator"].startswith("127.0.0.1:"), f"coordinator {d['coordinator']}")
    check(d["local_cluster"] == {"workers": 2, "backend": "cpu", "threads_per_worker": 1},
          f"local_cluster {d['local_cluster']}")

    t = d["transfers"]
    check(set(t) == TRANSFER_KEYS, f"transfers keys {sorted(t)}")
    check(t["tensor_mib"] == 1 and t["tensor_bytes"] >= 1 << 20 and t["repeats"] == 1,
          f"transfers sizes {t['tensor_mib']} {t['tensor_bytes']} {t['repeats']}")
    check(t["round_trip_exact"] is True and t["workers_measured"] is True, "round trip, pids")
    check(t["memcpy_gbps"] > 0, f"memcpy {t['memcpy_gbps']}")
    lines = t["lines"]
    check(len(lines) == 8, f"{len(lines)} data-plane lines, want 8")
    seen = set()
    for line in lines:
        check(set(line) == LINE_KEYS, f"line keys {sorted(line)}")
        seen.add((line["direction"], line["path"], line["all_workers"]))
        check(line["best_gbps"] > 0 and line["bytes"] > 0 and line["pieces"] >= 1,
              f"{line['label']}: {line}")
        check(close(line["percent_of_memcpy"], 100 * line["best_gbps"] / t["memcpy_gbps"], 1e-5),
              f"{line['label']}: percent_of_memcpy {line['percent_of_memcpy']}")
        if line["all_workers"]:
            check(line["bytes"] == t["tensor_bytes"], f"{line['label']}: {line['bytes']} bytes")
    check(seen == {(d_, p, a) for d_ in ("upload", "download") for p in ("grpc", "shm")
                   for a in (False, True)}, f"line kinds {sorted(seen)}")

    a = d["attention"]
    check(set(a) == ATTENTION_KEYS, f"attention keys {sorted(a)}")
    check(a["spec"]["seq_len"] == 1024 and a["spec"]["q_heads"] == 2 and
          a["spec"]["head_dim"] == 32 and a["spec"]["causal"] is True, f"spec {a['spec']}")
    check("S=1024" in a["description"], f"description {a['description']}")
    check(a["workers"] == 2 and a["repeat"] == 2 and a["backward"] is True, "workers, repeat")
    jobs = a["jobs"]
    check([j["kind"] for j in jobs] == ["JOB_FORWARD", "JOB_BACKWARD"] * 2,
          f"job kinds {[j['kind'] for j in jobs]}")
    for j in jobs:
        check(set(j) == JOB_KEYS, f"job keys {sorted(j)}")
        check(j["state"] == "JOB_SUCCEEDED" and j["steps_done"] == j["steps_total"] > 0,
              f"job {j['job_id']}: {j['state']} {j['steps_done']}/{j['steps_total']}")
        check(j["flops"] > 0 and j["wall_seconds"] > 0 and
              close(j["flops_per_second"], j["flops"] / j["wall_seconds"], 1e-5),
              f"job {j['job_id']}: flops {j['flops']} / {j['wall_seconds']} s")
        check(len(j["workers"]) == 2 and 0 <= j["seconds_outside_workers"] <= j["wall_seconds"],
              f"job {j['job_id']} workers {j['workers']}")
    # Backward FLOPs are 2.5x the forward's (the cost both the text and the metrics use).
    check(close(jobs[1]["flops"], 2.5 * jobs[0]["flops"], 1e-6), "backward flops = 2.5 forward")
    fwd = max(j["flops_per_second"] for j in jobs if j["kind"] == "JOB_FORWARD")
    bwd = max(j["flops_per_second"] for j in jobs if j["kind"] == "JOB_BACKWARD")
    check(close(a["best_forward_flops_per_second"], fwd, 1e-5), "best forward is the jobs' best")
    check(close(a["best_backward_flops_per_second"], bwd, 1e-5), "best backward is the jobs' best")
    s = a["single_process"]
    check(s is not None and s["threads"] == 2 and s["forward_seconds"] > 0 and
          s["backward_seconds"] > 0, f"single_process {s}")
    if s:
        check(close(a["forward_ratio"], fwd / s["forward_flops_per_second"], 1e-5), "forward ratio")
        check(close(a["backward_ratio"], bwd / s["backward_flops_per_second"], 1e-5),
              "backward ratio")
    print(f"dfa bench --json: {len(lines)} data-plane lines (best {max(l['best_gbps'] for l in lines):.2f} GB/s), "
          f"{len(jobs)} jobs, forward {fwd / 1e9:.2f} GFLOP/s, ratio {a['forward_ratio']:.2f}",
          flush=True)
    return d


def test_text(dfa, d):
    rc, out, err = run([dfa, "bench"] + SMALL)
    if not check(rc == 0, f"dfa bench (text): exit {rc}:\n{err}"):
        return
    text_lines = out.splitlines()
    for line in d["transfers"]["lines"]:
        check(any(l.startswith(line["label"] + " ") for l in text_lines),
              f"text output has no line '{line['label']}':\n{out}")
    for header in ("== client data plane", "== attention:", "== single process",
                   "== service vs single process", "memcpy, 1 thread",
                   "round trip (upload, download) exact"):
        check(header in out, f"text output lacks '{header}'")
    check(sum(l.startswith("forward ") for l in text_lines) >= 2 and
          sum(l.startswith("backward ") for l in text_lines) >= 2,
          "text output: a line per job")


def test_skips(dfa):
    rc, out, err = run([dfa, "bench"] + SMALL + ["--skip-transfer", "--skip-single",
                                                 "--forward-only", "--json"])
    if not check(rc == 0, f"dfa bench --skip-transfer --skip-single --json: exit {rc}:\n{err}"):
        return
    d = json.loads(out)
    a = d["attention"]
    check(d["transfers"] is None, f"transfers {d['transfers']}")
    check(a["single_process"] is None and a["forward_ratio"] is None and
          a["backward_ratio"] is None, f"single {a['single_process']}")
    check(a["backward"] is False and [j["kind"] for j in a["jobs"]] == ["JOB_FORWARD"] * 2,
          f"forward-only jobs {[j['kind'] for j in a['jobs']]}")


def test_usage(dfa):
    rc, out, err = run([dfa, "bench", "--json", "--transfer-mibs", "1"])
    check(rc == 2 and out == "" and "--transfer-mibs" in err,
          f"typo beside --json: exit {rc}, stdout {out!r}, stderr {err!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dfa", required=True)
    a = ap.parse_args()
    d = test_json(a.dfa)
    if d:
        test_text(a.dfa, d)
    test_skips(a.dfa)
    test_usage(a.dfa)
    print(f"bench_json_test: {checks} checks, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
