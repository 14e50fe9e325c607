"""python3 -m dfa.bench: what the Python client costs on top of the service.

Runs one forward+backward job of random data through the Python package and prints, per
phase, the seconds and rate: uploads and downloads (gRPC streams, all workers in parallel,
CRC32C on both sides), the jobs (the coordinator's wall time and FLOP/s), and this machine's
numpy memcpy rate for scale. Starts its own local cluster unless --coordinator is given.

  python3 -m dfa.bench [--coordinator HOST:PORT | --workers 2 --threads 1] [--seq 4096]
                       [--batch 1] [--heads 8] [--kv-heads 8] [--head-dim 64] [--dtype bf16]
                       [--full] [--chunk-mib 4] [--repeat 3]
"""

import argparse
import time

import numpy as np

import dfa
from dfa.spec import DO, DQ, DK, DV, K, LSE, O, Q, V


def memcpy_rate(nbytes):
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coordinator")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--full", action="store_true")
    p.add_argument("--chunk-mib", type=float, default=4)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    spec = dfa.AttentionSpec(batch=a.batch, seq_len=a.seq, q_heads=a.heads, kv_heads=a.kv_heads,
                             head_dim=a.head_dim, causal=not a.full, dtype=a.dtype)
    cluster = None
    if not a.coordinator:
        from dfa.cluster import LocalCluster
        t = time.perf_counter()
        cluster = LocalCluster(workers=a.workers, threads_per_worker=a.threads)
        a.coordinator = cluster.coordinator_address
        print("local cluster: 1 coordinator + %d cpu workers (%d thread(s) each), ready in %.2f s"
              % (a.workers, a.threads, time.perf_counter() - t))
    try:
        run(a, spec)
    finally:
        if cluster:
            cluster.stop()


def run(a, spec):
    rng = np.random.default_rng(0)
    mk = lambda kind: dfa.from_float(rng.uniform(-1, 1, spec.shape(kind)), spec.dtype)
    q, k, v, do = mk(Q), mk(K), mk(V), mk(DO)
    chunk = int(a.chunk_mib * (1 << 20))
    print("job: B=%d S=%d Hq=%d Hkv=%d D=%d %s %s; tensors %.1f MiB (Q)"
          % (spec.batch, spec.seq_len, spec.q_heads, spec.kv_heads, spec.head_dim, spec.dtype,
             "causal" if spec.causal else "full", q.nbytes / 2 ** 20))
    print("numpy memcpy (1 thread): %.2f GB/s" % memcpy_rate(max(q.nbytes, 64 << 20)))
    client = dfa.Client(a.coordinator)
    best = {}

    def timed(name, fn, nbytes=None):
        t = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t
        if name not in best or dt < best[name][0]:
            best[name] = (dt, nbytes)
        return r

    for _ in range(a.repeat):
        with client.create_session(spec) as s:
            for kind, arr, name in ((Q, q, "upload Q"), (K, k, "upload K"), (V, v, "upload V")):
                timed(name, lambda: s.upload(kind, arr, chunk), arr.nbytes)
            fwd = timed("forward job (client view)", lambda: s.run("forward"))
            timed("download O", lambda: s.download(O, chunk), q.nbytes)
            timed("download LSE", lambda: s.download(LSE, chunk), spec.batch * spec.q_heads * spec.seq_len * 4)
            timed("upload dO", lambda: s.upload(DO, do, chunk), do.nbytes)
            bwd = timed("backward job (client view)", lambda: s.run("backward"))
            for kind, arr, name in ((DQ, q, "download dQ"), (DK, k, "download dK"), (DV, v, "download dV")):
                timed(name, lambda: s.download(kind, chunk), arr.nbytes)
    print("best of %d, %d workers, gRPC streams in parallel, %.0f MiB chunks:" % (a.repeat, len(s.shards), a.chunk_mib))
    for name, (dt, nbytes) in best.items():
        rate = "  %6.2f GB/s" % (nbytes / dt / 1e9) if nbytes else ""
        print("  %-28s %8.4f s%s" % (name, dt, rate))
    for job, name in ((fwd, "forward"), (bwd, "backward")):
        print("%-8s coordinator wall %.4f s  %.2f GFLOP  %.2f GFLOP/s" % (
            name, job.wall_seconds, job.flops / 1e9, job.flops / max(job.wall_seconds, 1e-9) / 1e9))
        for w in job.workers:
            tot = w.busy_seconds + w.idle_seconds
            print("         worker %d: busy %.4f s  idle %.4f s (%.1f%%)" % (
                w.rank, w.busy_seconds, w.idle_seconds, 100 * w.idle_seconds / max(tot, 1e-12)))
    client.close()


if __name__ == "__main__":
    main()
