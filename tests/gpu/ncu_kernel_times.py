#!/usr/bin/env python3
"""Kernel-only TFLOP/s of dfa-cuda-kernel-bench's units at locked clocks, from ncu.

Run on the GPU machine (ncu works on its Firecracker kinds):
  ncu --clock-control base --metrics gpu__time_duration.sum --kernel-name regex:FlashBwd --csv \\
      dfa-cuda-kernel-bench --quick --reps 1 > bwd.csv
  python3 ncu_kernel_times.py bwd [bwd.csv ...]     (fwd: --kernel-name regex:FlashFwd, then `fwd`)
The bench runs one warm-up and `--reps` timed calls per config, in the order of its printed rows,
and each call launches one kernel that matches the regex; the launches are assigned to the rows
in that order. Several files (runs of the same command) are pooled: the median per config is
printed, with the spread. `fwd-masks` / `bwd-masks` read the table of `--masks --rounds 1`
(FLOPs on the row's visible pairs; "x dense" over the dense causal row of the same S). Locked clocks (base) make binaries comparable where the bench's own
timing follows the card's power state (a faster kernel before a row can slow the row down).
"""
import csv
import io
import statistics
import sys


def parse(path, masks=False):
    text = open(path).read().splitlines()
    rows = [l for l in text if l.startswith("| dfa-")]
    labels = []
    for r in rows:
        f = [x.strip() for x in r.split("|")]
        if masks:  # | kernel | D | S | mask | visible pairs | ...
            labels.append((int(f[2]), f[3], f[4], float(f[5])))
        else:
            labels.append((int(f[2]), f[3], f[4] == "yes"))
    recs = list(csv.reader(io.StringIO("\n".join(l for l in text if l.startswith('"')))))
    hdr = recs[0]
    ix = {h: i for i, h in enumerate(hdr)}
    ns = [float(r[ix["Metric Value"]].replace(",", "")) for r in recs[1:]
          if r[ix["Metric Name"]] == "gpu__time_duration.sum"]
    if len(ns) % len(labels) != 0:
        sys.exit(f"{path}: {len(ns)} launches for {len(labels)} rows")
    per = len(ns) // len(labels)
    return {lab: ns[k * per:(k + 1) * per] for k, lab in enumerate(labels)}


def main(argv):
    kinds = ("fwd", "bwd", "fwd-masks", "bwd-masks")
    if len(argv) < 3 or argv[1] not in kinds:
        sys.exit(__doc__)
    masks = argv[1].endswith("-masks")
    bwd = argv[1].startswith("bwd")
    pooled = {}
    for path in argv[2:]:
        for lab, v in parse(path, masks).items():
            pooled.setdefault(lab, []).extend(v)
    if masks:
        print("| D | S | mask | kernel ms (median) | TFLOP/s | x dense | spread |")
        print("|---|---|---|---|---|---|---|")
        dense = {}
        for (d, s, mask, pairs), v in pooled.items():
            tf = 4 * 32 * pairs * d * (2.5 if bwd else 1) / statistics.median(v) / 1e3
            if mask == "dense causal":
                dense[(d, s)] = tf
            ref = dense.get((d, s))
            print(f"| {d} | {s} | {mask} | {statistics.median(v) / 1e6:.3f} | {tf:.1f} | "
                  f"{tf / ref if ref else float('nan'):.3f} | "
                  f"{100 * (max(v) - min(v)) / statistics.median(v):.1f}% |")
        return
    print("| D | S | causal | kernel ms (median) | TFLOP/s | spread |")
    print("|---|---|---|---|---|---|")
    for (d, s, causal), v in pooled.items():
        n = int(s.rstrip("K")) * 1024
        flops = 4 * 32 * n * n * d / (2 if causal else 1) * (2.5 if bwd else 1)
        med = statistics.median(v)
        print(f"| {d} | {s} | {'yes' if causal else 'no'} | {med / 1e6:.3f} | {flops / med / 1e3:.1f} | "
              f"{100 * (max(v) - min(v)) / med:.1f}% |")


if __name__ == "__main__":
    main(sys.argv)
