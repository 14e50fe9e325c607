#!/usr/bin/env python3
"""Turns the log of gpu_service.sh's `dfa bench` runs into a markdown table.

  python3 tests/bench/summarize_bench.py bench.log

Per configuration (GPUs, schedule, mask, S): per-GPU TFLOP/s of forward and of forward+backward
(best repeat: job FLOPs / GPUs / wall seconds; FLOPs as `dfa bench` counts them: forward
4*B*H*S^2*D, halved when causal, backward 2.5x) and the largest idle fraction of any worker over
forward+backward of that repeat.
"""
import re
import sys

HEAD = re.compile(r"^== bench gpus=(\d+) schedule=(\S+) mask=(\S+) seq=(\d+)")  # t=... may follow
JOB = re.compile(r"^(forward|backward)\s+([\d.]+) s\s+([\d.]+) GFLOP\s+([\d.]+) GFLOP/s")
WORKER = re.compile(r"worker (\d+): busy ([\d.]+) s\s+idle ([\d.]+) s")


def main():
    rows, cur, job = [], None, None
    for line in open(sys.argv[1]):
        m = HEAD.match(line)
        if m:
            cur = {"gpus": int(m[1]), "schedule": m[2], "mask": m[3], "seq": int(m[4]), "runs": []}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = JOB.match(line)
        if m:
            # seconds from the printed rate: the printed time has 3 decimals only
            job = {"kind": m[1], "s": float(m[3]) / float(m[4]), "gflop": float(m[3]), "workers": {}}
            if m[1] == "forward":
                cur["runs"].append({"forward": job})
            elif cur["runs"]:
                cur["runs"][-1]["backward"] = job
            continue
        m = WORKER.search(line)
        if m and job is not None:
            job["workers"][int(m[1])] = (float(m[2]), float(m[3]))
        if "rror" in line:
            cur["error"] = line.strip()[:100]
    print("| GPUs | schedule | mask | S | fwd TFLOP/s/GPU | fwd+bwd TFLOP/s/GPU | max worker idle % |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        best = None
        for run in r["runs"]:
            f, b = run.get("forward"), run.get("backward")
            if not f or not b:
                continue
            fb = (f["gflop"] + b["gflop"]) / (f["s"] + b["s"]) / r["gpus"] / 1e3
            if best is None or fb > best[1]:
                idle = 0.0
                for w in set(f["workers"]) | set(b["workers"]):
                    busy = sum(j["workers"].get(w, (0, 0))[0] for j in (f, b))
                    wait = sum(j["workers"].get(w, (0, 0))[1] for j in (f, b))
                    if busy + wait > 0:
                        idle = max(idle, 100 * wait / (busy + wait))
                best = (f["gflop"] / f["s"] / r["gpus"] / 1e3, fb, idle)
        s = f"{r['seq'] // 1024}K"
        if best is None:
            print(f"| {r['gpus']} | {r['schedule']} | {r['mask']} | {s} | - | - | {r.get('error', 'no result')} |")
        else:
            print(f"| {r['gpus']} | {r['schedule']} | {r['mask']} | {s} | {best[0]:.0f} | {best[1]:.0f} | {best[2]:.1f} |")


if __name__ == "__main__":
    main()
