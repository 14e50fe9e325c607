"""python -m dfa bench --offload: one attention layer of a torch job offloaded to the service,
against the same layer computed locally by PyTorch SDPA (cuDNN), in the same run.

For each sequence length S, one layer step (forward + backward, causal, bf16 by default) starts
from torch CUDA tensors Q, K, V [B, S, Hq|Hkv, D] and dO and ends with O, dQ, dK, dV as torch
CUDA tensors. Rounds alternate between the ways (so clocks and thermals treat them alike):
  * local: torch.nn.functional.scaled_dot_product_attention under sdpa_kernel(CUDNN_ATTENTION);
  * ipc: through the service, tensors moved by CUDA IPC (dfa._dfa.DeviceAttentionJob, what
    dfa.torch.Attention uses for CUDA tensors; the tensors are bound to the session's jobs, so
    the workers copy them inside the jobs and a step sends no transfer rpc once bound): split
    into transfer (the device copies of the step, inside the jobs, plus any binding rpcs),
    compute (the two jobs' wall time as the coordinator measures it, less their copies: the
    engine, the worker's executor, and the dispatch, the RunJob calls to the worker and their
    replies) and control plane (the jobs' SubmitJob rpcs, each answered when its job is final,
    beyond the jobs' own time);
  * nccl: through the service, tensors moved by NCCL (dfa.torch's NcclJob over the client's
    NcclTensorIo: this process joins the worker as one more NCCL rank; the worker must be on
    another GPU, --worker-device): transfer (the NCCL transfer calls) and compute (the two
    jobs' wall time);
  * shm, grpc: the host paths (the tensors copied to host memory and back, counted in the step;
    the C++ AttentionJob's shared-memory or gRPC data plane): transfer = step - jobs' runs.
Each service output is compared with SDPA's (bf16 tolerance: max |diff| / max |ref| <= 2e-2).
Every service path reuses its session across rounds (a training step makes no CreateSession).
Best and median of --rounds per way; the targets on one H200 (client and worker on the same
GPU, IPC, the worker's device memory limited): ipc <= 1.05x local at S >= 64K, <= 1.30x at 16K.

Without --coordinator it starts a coordinator and one cudnn worker on GPU --worker-device
(default 0: this process's torch shares the GPU) with --device_memory_limit=<--worker-memory>
and this process's libnccl.so.2 first on its LD_LIBRARY_PATH (NCCL needs one version on every
rank). --out FILE appends one JSON line per (S, way).
"""

import argparse
import json
import os
import statistics
import time

TARGETS = ((65536, 1.05), (0, 1.30))  # (S at least, ipc / local at most)


def target_for(seq):
    for s, t in TARGETS:
        if seq >= s:
            return t
    return None


def parser():
    p = argparse.ArgumentParser(prog="python -m dfa bench --offload",
                                description=__doc__.splitlines()[0])
    p.add_argument("--offload", action="store_true", help="(this benchmark)")
    p.add_argument("--coordinator", default="")
    p.add_argument("--bin-dir", default=None)
    p.add_argument("--backend", default="cudnn", help="the local cluster's worker backend")
    p.add_argument("--worker-device", type=int, default=0,
                   help="the local worker's GPU (--paths nccl needs another GPU than 0)")
    p.add_argument("--worker-memory", default="0.5",
                   help="the local worker's --device_memory_limit (40G, or a fraction)")
    p.add_argument("--seq", default="16384,65536,262144")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--paths", default="ipc,shm,grpc",
                   help="service paths to run (ipc, nccl, shm, grpc)")
    p.add_argument("--host-max-seq", type=int, default=65536,
                   help="run the host paths (shm, grpc) only up to this S (they move GBs)")
    p.add_argument("--out", default="", help="append JSON lines here")
    p.add_argument("--log-dir", default="",
                   help="the local cluster's daemon logs go here (default: a temporary folder)")
    return p


class Layer:
    """One S: the torch tensors, the local reference, and each way's step."""

    def __init__(self, a, client, seq, torch):
        import dfa
        self.a, self.client, self.seq, self.torch = a, client, seq, torch
        self.dt = {"bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
        g = torch.Generator(device="cuda").manual_seed(seq)
        mk = lambda h: torch.randn(a.batch, seq, h, a.head_dim, device="cuda",  # noqa: E731
                                   dtype=self.dt, generator=g)
        self.q, self.k, self.v, self.do = mk(a.heads), mk(a.kv_heads), mk(a.kv_heads), mk(a.heads)
        self.spec = dfa.AttentionSpec(batch=a.batch, seq_len=seq, q_heads=a.heads,
                                      kv_heads=a.kv_heads, head_dim=a.head_dim, causal=True,
                                      dtype=a.dtype)
        self.jobs = {}
        self.ref = None
        self.sdpa_backend = "cudnn"

    def sync(self):
        self.torch.cuda.synchronize()

    # How local SDPA runs, tried in this order until one has a kernel for the shape: cuDNN with
    # GQA, FlashAttention/efficient with GQA, cuDNN on K/V expanded to the query heads (inside
    # the timed step, gradients summed back by autograd).
    SDPA_WAYS = ("cudnn", "flash", "cudnn-expanded-kv")

    def local(self):
        torch = self.torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q, k, v = (t.transpose(1, 2).detach().requires_grad_() for t in (self.q, self.k, self.v))
        do = self.do.transpose(1, 2)
        backends = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION] \
            if self.sdpa_backend == "flash" else [SDPBackend.CUDNN_ATTENTION]
        expand = self.sdpa_backend == "cudnn-expanded-kv"
        group = self.a.heads // self.a.kv_heads
        self.sync()
        t = time.perf_counter()
        with sdpa_kernel(backends):
            ke, ve = (x.repeat_interleave(group, dim=1) for x in (k, v)) if expand else (k, v)
            o = F.scaled_dot_product_attention(q, ke, ve, is_causal=True,
                                               enable_gqa=not expand and group > 1)
            dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        self.sync()
        step = time.perf_counter() - t
        if self.ref is None:
            self.ref = tuple(x.transpose(1, 2).contiguous() for x in (o, dq, dk, dv))
        return {"step": step}

    def ipc(self):
        from dfa import _dfa
        from dfa.torch import _device
        job = self.jobs.get("ipc")
        if job is None:
            job = self.jobs["ipc"] = _dfa.DeviceAttentionJob(self.client._c, self.spec.as_dict())
        torch = self.torch
        if not hasattr(self, "ipc_out"):  # outputs reused across rounds, as a training loop's
            self.ipc_out = (torch.empty_like(self.q),) + tuple(
                torch.empty_like(t) for t in (self.q, self.k, self.v))
        o, dq, dk, dv = self.ipc_out
        ref = _device.ref
        self.sync()
        t = time.perf_counter()
        job.forward(ref(self.q), ref(self.k), ref(self.v), ref(o))
        f = job.last_times
        job.backward(ref(self.do), ref(dq), ref(dk), ref(dv))
        b = job.last_times
        step = time.perf_counter() - t
        r = {"step": step, "transfer": f["transfer"] + b["transfer"],
             "compute": f["compute"] + b["compute"], "control": f["control"] + b["control"],
             "engine": f["engine"] + b["engine"], "dispatch": f["dispatch"] + b["dispatch"],
             "ipc_bytes": f["bytes"] + b["bytes"], "requests": f["requests"] + b["requests"]}
        # What the client spent outside its rpcs (the copies inside the jobs are in "run").
        calls = r["transfer"] - f["job_transfer"] - b["job_transfer"]
        r["bind"] = calls  # the binding checks on the client (and any binding rpcs)
        r["client"] = max(0.0, step - calls - f["run"] - b["run"])
        r["error"] = self.error((o, dq, dk, dv))
        return r

    def nccl(self):
        from dfa.torch import _device
        job = self.jobs.get("nccl")
        if job is None:
            options = dict(num_workers=0, schedule="", max_retries=0, recovery_timeout=15.0)
            job = self.jobs["nccl"] = _device.new_job(self.client, self.spec, options, "nccl")
        torch = self.torch
        if not hasattr(self, "nccl_out"):  # outputs reused across rounds
            self.nccl_out = (torch.empty_like(self.q),) + tuple(
                torch.empty_like(t) for t in (self.q, self.k, self.v))
        o, dq, dk, dv = self.nccl_out
        ref = _device.ref
        self.sync()
        t = time.perf_counter()
        fwd = job.forward(ref(self.q), ref(self.k), ref(self.v), ref(o))
        f = job.last_times
        bwd = job.backward(ref(self.do), ref(dq), ref(dk), ref(dv))
        b = job.last_times
        step = time.perf_counter() - t
        return {"step": step, "transfer": f["transfer"] + b["transfer"],
                "compute": fwd["wall_seconds"] + bwd["wall_seconds"],
                "nccl_bytes": f["nccl_bytes"] + b["nccl_bytes"],
                "requests": f["requests"] + b["requests"],
                "error": self.error((o, dq, dk, dv))}

    def host(self, path):
        from dfa import _dfa
        from dfa.torch import _sessions
        job = self.jobs.get(path)
        if job is None:
            job = self.jobs[path] = _dfa.AttentionJob(self.client._c, self.spec.as_dict(),
                                                      path=path, download_lse=False)
        self.sync()
        t = time.perf_counter()
        hq, hk, hv = (_sessions.to_host(x) for x in (self.q, self.k, self.v))
        o, _, fwd = job.forward(hq, hk, hv)
        o = _sessions.from_host(o, self.q)
        dq, dk, dv, bwd = job.backward(_sessions.to_host(self.do))
        grads = tuple(_sessions.from_host(x, like) for x, like in
                      zip((dq, dk, dv), (self.q, self.k, self.v)))
        self.sync()
        step = time.perf_counter() - t
        compute = fwd["wall_seconds"] + bwd["wall_seconds"]
        return {"step": step, "compute": compute, "transfer": step - compute,
                "error": self.error((o,) + grads)}

    def error(self, outs):
        if self.ref is None:
            return None
        worst = 0.0
        for got, want in zip(outs, self.ref):
            d = (got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)
            worst = max(worst, d.item())
        return worst

    def release(self):
        for job in self.jobs.values():
            job.release()
        self.jobs.clear()


def summarize(rounds):
    steps = [r["step"] for r in rounds]
    best = min(rounds, key=lambda r: r["step"])
    out = dict(best)
    out["best"] = best["step"]
    out["median"] = statistics.median(steps)
    out["max_error"] = max((r.get("error") or 0.0) for r in rounds)
    return out


def run_seq(a, client, seq, torch, log):
    layer = Layer(a, client, seq, torch)
    ways = ["local"] + [p for p in a.paths.split(",") if p]
    ways = [w for w in ways if w in ("local", "ipc", "nccl") or seq <= a.host_max_seq]
    for i, way in enumerate(Layer.SDPA_WAYS):  # warm-up: plans, the reference outputs
        layer.sdpa_backend = way
        try:
            layer.local()
            break
        except RuntimeError as e:  # no kernel of that backend for this shape
            if i + 1 == len(Layer.SDPA_WAYS):
                raise
            log("  SDPA %s unavailable at S=%d (%s); trying %s" % (
                way, seq, str(e).splitlines()[0][:120], Layer.SDPA_WAYS[i + 1]))
    fns = {"local": layer.local, "ipc": layer.ipc, "nccl": layer.nccl,
           "shm": lambda: layer.host("shm"),
           "grpc": lambda: layer.host("grpc")}
    for w in ways[1:]:
        fns[w]()  # warm-up: session, mapped handles, plans
    results = {w: [] for w in ways}
    try:
        for _ in range(a.rounds):
            for w in ways:  # alternating
                results[w].append(fns[w]())
    finally:
        layer.release()
    return {w: summarize(rs) for w, rs in results.items()}, layer.sdpa_backend


def report(a, seq, res, backend, log, out):
    lo = res["local"]["best"]
    log("S=%-7d local SDPA (%s) %9.2f ms (median %.2f)" % (seq, backend, 1e3 * lo,
                                                         1e3 * res["local"]["median"]))
    for w, r in res.items():
        if w == "local":
            continue
        ratio = r["best"] / lo
        line = "  %-5s %9.2f ms (median %.2f) = %.3fx local | transfer %.2f ms" % (
            w, 1e3 * r["best"], 1e3 * r["median"], ratio, 1e3 * r["transfer"])
        if w == "ipc":
            line += " (binding %.2f)" % (1e3 * r["bind"])
        line += ", compute %.2f ms" % (1e3 * r["compute"])
        if w == "ipc":
            line += " (engine %.2f, dispatch %.2f)" % (1e3 * r["engine"], 1e3 * r["dispatch"])
            line += ", control plane %.2f ms, client %.2f ms, %.2f GB moved, %d transfer rpcs" % (
                1e3 * r["control"], 1e3 * r["client"], r["ipc_bytes"] / 1e9, r["requests"])
            t = target_for(seq)
            line += " | target <= %.2fx: %s" % (t, "met" if ratio <= t else "NOT met")
        if w == "nccl":
            line += ", %.2f GB moved (%.1f GB/s), %d transfer requests" % (
                r["nccl_bytes"] / 1e9, r["nccl_bytes"] / 1e9 / max(r["transfer"], 1e-9),
                r["requests"])
        line += " | max rel. error vs SDPA %.2e%s" % (
            r["max_error"], "" if r["max_error"] <= 2e-2 else " (TOO LARGE)")
        log(line)
        if out:
            rec = dict(seq=seq, way=w, local_ms=1e3 * lo, ratio=ratio, sdpa=backend,
                       heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim, dtype=a.dtype,
                       **{k: (1e3 * v if k in ("best", "median", "step", "transfer", "compute",
                                               "control", "client", "engine", "dispatch",
                                               "bind")
                              else v)
                          for k, v in r.items()})
            out.write(json.dumps(rec) + "\n")
            out.flush()


def _nccl_of_this_process():
    """The libnccl.so.2 mapped into this process, None without one."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and os.path.basename(fields[-1]).startswith("libnccl.so"):
                    return fields[-1]
    except OSError:
        pass
    return None


def main(argv=None):
    a = parser().parse_args(argv)
    import torch
    import dfa
    from dfa.torch import _device
    paths = [p for p in a.paths.split(",") if p]
    for p in paths:
        if p not in ("ipc", "nccl", "shm", "grpc"):
            raise SystemExit("python -m dfa bench --offload: --paths: %r is not ipc, nccl, shm "
                             "or grpc" % p)
    if not torch.cuda.is_available():
        raise SystemExit("python -m dfa bench --offload: no CUDA device visible to torch")
    if "ipc" in paths and not _device.available():
        raise SystemExit("--paths ipc: dfa._dfa was built without CUDA")
    if "nccl" in paths:
        from dfa import device_io
        if not device_io.nccl_available():
            raise SystemExit("--paths nccl: dfa._dfa was built without NCCL")
        if not a.coordinator and (a.worker_device == 0 or
                                  a.worker_device >= torch.cuda.device_count()):
            raise SystemExit("--paths nccl: the worker needs a GPU of its own (NCCL refuses two "
                             "ranks on one GPU): --worker-device N, 1 <= N < %d"
                             % torch.cuda.device_count())
    cluster = None
    if not a.coordinator:
        lib = _nccl_of_this_process()
        if lib:  # the worker inherits it: one NCCL version on every rank
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
                x for x in (os.path.dirname(lib), os.environ.get("LD_LIBRARY_PATH")) if x)
        cluster = dfa.LocalCluster(workers=1, backend=a.backend, bin_dir=a.bin_dir,
                                   log_dir=a.log_dir,
                                   worker_args=["--device=%d" % a.worker_device,
                                                "--device_memory_limit=%s" % a.worker_memory])
        a.coordinator = cluster.coordinator_address
    out = open(a.out, "a") if a.out else None
    try:
        client = dfa.Client(a.coordinator, rpc_timeout=120)
        w = client.list_workers()
        print("offload bench: %s; worker(s) %s; B=%d Hq=%d Hkv=%d D=%d %s causal, %d rounds "
              "alternating, best (median) per way" % (
                  torch.cuda.get_device_name(0),
                  ", ".join("%s %s %.1f GiB" % (x.get("backend"), x.get("device", ""),
                                                x.get("memory_limit_bytes", 0) / 2**30)
                            for x in w),
                  a.batch, a.heads, a.kv_heads, a.head_dim, a.dtype, a.rounds), flush=True)
        for seq in (int(x) for x in a.seq.split(",")):
            res, backend = run_seq(a, client, seq, torch, print)
            report(a, seq, res, backend, lambda s: print(s, flush=True), out)
    finally:
        if out:
            out.close()
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
