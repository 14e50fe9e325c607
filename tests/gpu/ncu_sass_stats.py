#!/usr/bin/env python3
"""Reads the per-instruction CSV that `ncu -i REP --page source --print-source sass --csv` writes
(one kernel) and prints where the warps' time goes.

  ncu_sass_stats.py FILE [N]            stall totals, the N (default 40) instructions with the most
                                        warp-stall samples, and every shared access with excess
                                        wavefronts (bank conflicts)
  ncu_sass_stats.py FILE range A B ...  instructions A..B (pairs) with samples and top stalls
  ncu_sass_stats.py FILE sections NAME:A-B ...
                                        samples and executed instructions per warp-item of each
                                        named index range (phases of a loop), as a share of their sum
Indices are row numbers of the SASS listing (0-based, as printed). Samples count warps at an
instruction; within a loop their share of the loop's samples is the share of a warp's time.
"""
import collections
import csv
import sys


def load(path):
    rows = list(csv.reader(open(path)))
    # Row 0 names the kernel, row 1 the columns.
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    return hdr, data, ix, stalls


def num(r, ix, k):
    try:
        return float(r[ix[k]].replace(",", ""))
    except (KeyError, ValueError):
        return 0.0


SAMPLES = "Warp Stall Sampling (All Samples)"


def top_stalls(r, ix, stalls, n=2):
    c = sorted(((num(r, ix, s), s[6:]) for s in stalls), reverse=True)[:n]
    return " ".join(f"{name}={v:.0f}" for v, name in c if v > 0)


def summary(path, n):
    _, data, ix, stalls = load(path)
    total = sum(num(r, ix, SAMPLES) for r in data) or 1.0
    tot = collections.Counter()
    for r in data:
        for s in stalls:
            tot[s] += num(r, ix, s)
    print(f"total samples {total:.0f}")
    for s, v in tot.most_common():
        if v:
            print(f"  {s:26s} {v:10.0f} {100 * v / total:5.1f}%")
    print(f"\n# top {n} instructions: index, samples, top stalls, SASS")
    order = sorted(range(len(data)), key=lambda i: -num(data[i], ix, SAMPLES))
    for i in order[:n]:
        r = data[i]
        print(f"{i:5d} {num(r, ix, SAMPLES):8.0f}  {top_stalls(r, ix, stalls, 3):46s} {r[1].strip()[:90]}")
    print("\n# shared accesses with excess wavefronts (bank conflicts)")
    for i, r in enumerate(data):
        e = num(r, ix, "L1 Wavefronts Shared Excessive")
        if e > 0:
            print(f"{i:5d} excess={e:.0f} wavefronts={num(r, ix, 'L1 Wavefronts Shared'):.0f} "
                  f"ideal={num(r, ix, 'L1 Wavefronts Shared Ideal'):.0f} {r[1].strip()[:70]}")


def show_range(path, bounds):
    _, data, ix, stalls = load(path)
    for a, b in zip(bounds[0::2], bounds[1::2]):
        for i in range(int(a), int(b) + 1):
            r = data[i]
            print(f"{i:5d} {num(r, ix, SAMPLES):8.0f} executed={num(r, ix, 'Instructions Executed'):10.0f} "
                  f"{top_stalls(r, ix, stalls):30s} {r[1].strip()[:90]}")
        print("----")


def sections(path, specs):
    _, data, ix, _ = load(path)
    parts = []
    for spec in specs:
        name, rng = spec.rsplit(":", 1)
        a, b = (int(x) for x in rng.split("-"))
        parts.append((name, a, b))
    per_item = max(num(data[i], ix, "Instructions Executed") for _, a, b in parts for i in range(a, b + 1))
    sums = [(name, sum(num(data[i], ix, SAMPLES) for i in range(a, b + 1)),
             sum(num(data[i], ix, "Instructions Executed") for i in range(a, b + 1))) for name, a, b in parts]
    total = sum(s for _, s, _ in sums) or 1.0
    for name, s, e in sums:
        print(f"{name:24s} {s:9.0f} {100 * s / total:5.1f}%  instructions/warp/item={e / per_item:.0f}")


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    if len(argv) >= 3 and argv[2] == "range":
        show_range(argv[1], argv[3:])
    elif len(argv) >= 3 and argv[2] == "sections":
        sections(argv[1], argv[3:])
    else:
        summary(argv[1], int(argv[2]) if len(argv) > 2 else 40)


if __name__ == "__main__":
    main(sys.argv)
