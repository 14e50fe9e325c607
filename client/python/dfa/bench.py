"""python3 -m dfa.bench: what offloading one attention layer costs beyond the job itself.

For each sequence length, one layer step (forward + backward of causal attention, fp32 or bf16)
is timed three ways on the same tensors:
  * local: torch.nn.functional.scaled_dot_product_attention on this machine's CPU;
  * service: dfa.torch.Attention (the session kept across steps, as in training): the wall time
    of a step, against the time of its two jobs as the coordinator measured them (wall_seconds):
    overhead = step wall / job time;
  * split: the same step through a raw Session, phase by phase: uploads (Q, K, V, then dO),
    job runs as the client sees them (submit + watch), the jobs' own time, downloads (O, then
    dQ, dK, dV), and the control plane (CreateSession + ReleaseSession, which the module pays
    once, not per step).
Best of --repeat. Starts its own local cluster unless --coordinator is given.
`--offload` runs the GPU benchmark instead (dfa/offload_bench.py: a torch job's layer on CUDA
tensors through the service by CUDA IPC, shared memory and gRPC, against local SDPA).

  python3 -m dfa.bench [--coordinator HOST:PORT | --workers 2 --threads 1] [--seq 2048,8192]
                       [--batch 1] [--heads 8] [--kv-heads 8] [--head-dim 64] [--dtype f32]
"""

import argparse
import time

import numpy as np


def best_of(n, fn):
    best = None
    for _ in range(n):
        r = fn()
        if best is None or r["step"] < best["step"]:
            best = r
    return best


def module_step(attn, q, k, v, g, torch):
    t = time.perf_counter()
    out = attn(q, k, v)
    torch.autograd.grad(out, (q, k, v), g)
    step = time.perf_counter() - t
    jobs = attn.last_jobs
    job = jobs["forward"]["wall_seconds"] + jobs["backward"]["wall_seconds"]
    return {"step": step, "job": job}


def split_step(client, spec, q, k, v, do):
    import dfa
    r = {}
    t = time.perf_counter()
    s = client.create_session(spec)
    r["create"] = time.perf_counter() - t
    t = time.perf_counter()
    for kind, a in ((dfa.Q, q), (dfa.K, k), (dfa.V, v)):
        s.upload(kind, a)
    r["upload_qkv"] = time.perf_counter() - t
    t = time.perf_counter()
    fwd = s.run("forward")
    r["run_fwd"] = time.perf_counter() - t
    t = time.perf_counter()
    s.download(dfa.O)
    r["download_o"] = time.perf_counter() - t
    t = time.perf_counter()
    s.upload(dfa.DO, do)
    r["upload_do"] = time.perf_counter() - t
    t = time.perf_counter()
    bwd = s.run("backward")
    r["run_bwd"] = time.perf_counter() - t
    t = time.perf_counter()
    for kind in (dfa.DQ, dfa.DK, dfa.DV):
        s.download(kind)
    r["download_grads"] = time.perf_counter() - t
    t = time.perf_counter()
    s.release()
    r["release"] = time.perf_counter() - t
    r["job"] = fwd["wall_seconds"] + bwd["wall_seconds"]
    r["step"] = sum(r[x] for x in ("upload_qkv", "run_fwd", "download_o", "upload_do", "run_bwd",
                                   "download_grads"))
    return r


def run_one(a, client, seq, torch, log):
    import dfa
    import dfa.torch
    import torch.nn.functional as F
    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    hkv = a.kv_heads or a.heads
    gen = torch.Generator().manual_seed(seq)
    mk = lambda h: (torch.rand(a.batch, h, seq, a.head_dim, generator=gen) * 2 - 1).to(dt)
    q, k, v, g = mk(a.heads), mk(hkv), mk(hkv), mk(a.heads)
    for t in (q, k, v):
        t.requires_grad_()

    def local():
        t = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != a.heads)
        torch.autograd.grad(out, (q, k, v), g)
        return {"step": time.perf_counter() - t}

    res = {"local": best_of(a.repeat, local)}
    attn = dfa.torch.Attention(client, is_causal=True, layout="bhsd", enable_gqa=hkv != a.heads)
    module_step(attn, q, k, v, g, torch)  # creates the session
    res["service"] = best_of(a.repeat, lambda: module_step(attn, q, k, v, g, torch))
    attn.release()
    spec = dfa.AttentionSpec(batch=a.batch, seq_len=seq, q_heads=a.heads, kv_heads=hkv,
                             head_dim=a.head_dim, causal=True, dtype=a.dtype)
    host = lambda t: t.detach().transpose(1, 2).contiguous()
    hq, hk, hv, hg = host(q), host(k), host(v), host(g)
    res["split"] = best_of(a.repeat, lambda: split_step(client, spec, hq, hk, hv, hg))
    return res


def report(seq, res, log):
    sv, sp, lo = res["service"], res["split"], res["local"]
    log("S=%-6d local SDPA %8.1f ms | service step %8.1f ms, its jobs %8.1f ms: overhead "
        "%.3fx" % (seq, 1e3 * lo["step"], 1e3 * sv["step"], 1e3 * sv["job"],
                   sv["step"] / max(sv["job"], 1e-9)))
    log("         split: uploads %.1f + %.1f ms, runs %.1f + %.1f ms (jobs %.1f ms), downloads "
        "%.1f + %.1f ms; control plane (once per session) create %.1f, release %.1f ms"
        % tuple(1e3 * sp[x] for x in ("upload_qkv", "upload_do", "run_fwd", "run_bwd", "job",
                                      "download_o", "download_grads", "create", "release")))


def main(argv=None):
    import sys
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--offload" in argv:  # one layer of a torch job on a GPU: dfa/offload_bench.py
        from dfa import offload_bench
        return offload_bench.main(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coordinator")
    p.add_argument("--bin-dir")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--torch-threads", type=int, default=0, help="0: workers x threads")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", default="2048,8192")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args(argv)
    import torch
    import dfa
    torch.set_num_threads(a.torch_threads or a.workers * a.threads)
    cluster = None
    if not a.coordinator:
        cluster = dfa.LocalCluster(workers=a.workers, threads_per_worker=a.threads,
                                   bin_dir=a.bin_dir)
        a.coordinator = cluster.coordinator_address
    print("cluster: %d cpu workers x %d thread(s); local SDPA on %d torch threads; B=%d H=%d/%d "
          "D=%d %s causal, best of %d" % (a.workers, a.threads, torch.get_num_threads(), a.batch,
                                          a.heads, a.kv_heads or a.heads, a.head_dim, a.dtype,
                                          a.repeat))
    try:
        client = dfa.Client(a.coordinator)
        for seq in (int(x) for x in a.seq.split(",")):
            report(seq, run_one(a, client, seq, torch, print), print)
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
