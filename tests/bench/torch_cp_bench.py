#!/usr/bin/env python3
"""PyTorch baseline: context parallelism (ring attention) on the GPUs of one host.

Run with torchrun, one process per GPU:
  torchrun --standalone --nproc_per_node=2 tests/bench/torch_cp_bench.py \
      --seq 32768,131072,262144 --masks causal,full --backends cudnn,flash --out cp.jsonl
With one process it times plain SDPA on the whole sequence (the one-GPU reference).

Per configuration it prints and appends one JSON line: per-GPU TFLOP/s of forward and of
forward+backward, peak GPU memory per GPU and its bytes per token per GPU. FLOPs are counted as
`dfa bench` counts them (forward 4*B*H*S^2*D, halved when causal; backward 2.5x), so the
figures compare. Inputs are seeded; timing uses CUDA events after warm-up.
`--longest S1,S2,...` tries causal forward+backward at growing S (first backend) and reports the
longest that fits. Load balancing: head-tail (PyTorch's _HeadTailLoadBalancer) unless
--no-load-balance. Rotation: all-to-all unless --rotate allgather.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def fwd_flops(b, h, s, d, causal):
    f = 4.0 * b * h * s * s * d
    return f / 2 if causal else f


def log(rank, *a):
    if rank == 0:
        print(*a, flush=True)


def cp_context(mesh, bufs, load_balance, rotate):
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options, set_rotate_method

    _cp_options.enable_load_balance = load_balance
    set_rotate_method(rotate)
    return context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * len(bufs))


def run_one(args, mesh, world, rank, s, causal, backend, warmup, iters):
    """Returns a result dict, or raises torch.OutOfMemoryError."""
    b, h, d = args.batch, args.heads, args.head_dim
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    shape = (b, h, s, d)  # SDPA layout [B, H, S, D]
    q = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen)
    dout = torch.randn(shape, device=dev, dtype=torch.bfloat16, generator=gen)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base_mem = torch.cuda.memory_allocated()
    # PyTorch's head-tail load balancer is for causal masks only (it refuses full attention,
    # which needs no balancing).
    balance = args.load_balance and causal
    ctx = cp_context(mesh, [q, k, v, dout], balance, args.rotate) if world > 1 else None
    times_f, times_fb = [], []
    with sdpa_kernel(BACKENDS[backend]):
        if ctx is not None:
            ctx.__enter__()
        try:
            q.requires_grad_(True)
            k.requires_grad_(True)
            v.requires_grad_(True)
            for it in range(warmup + iters):
                q.grad = k.grad = v.grad = None
                if world > 1:
                    dist.barrier()
                e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                e0.record()
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                e1.record()
                out.backward(dout)
                e2.record()
                torch.cuda.synchronize()
                if it >= warmup:
                    times_f.append(e0.elapsed_time(e1) / 1e3)
                    times_fb.append(e0.elapsed_time(e2) / 1e3)
                del out
        finally:
            # The context restores the buffers' shapes on exit, which autograd forbids on
            # tensors that require grad.
            for t in (q, k, v):
                t.grad = None
                t.requires_grad_(False)
            if ctx is not None:
                ctx.__exit__(None, None, None)
    peak = torch.cuda.max_memory_allocated()
    # Every rank's slowest time is the job's time.
    t = torch.tensor([sum(times_f) / len(times_f), sum(times_fb) / len(times_fb), peak],
                     device=dev, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    tf, tfb, peak = t.tolist()
    ff = fwd_flops(b, h, s, d, causal)
    return {
        "impl": "torch_cp" if world > 1 else "torch_sdpa",
        "gpus": world,
        "backend": backend,
        "load_balance": "head-tail" if (args.load_balance and causal and world > 1) else "none",
        "rotate": args.rotate if world > 1 else "",
        "seq": s,
        "mask": "causal" if causal else "full",
        "heads": h,
        "head_dim": d,
        "fwd_s": tf,
        "fwd_bwd_s": tfb,
        "fwd_tflops_per_gpu": ff / world / tf / 1e12,
        "fwd_bwd_tflops_per_gpu": 3.5 * ff / world / tfb / 1e12,
        "peak_mem_gib_per_gpu": peak / 2**30,
        "bytes_per_token_per_gpu": peak / s,
        "input_bytes_per_gpu": base_mem,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", default="32768,131072,262144")
    p.add_argument("--masks", default="causal,full")
    p.add_argument("--backends", default="cudnn,flash")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head_dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--no-load-balance", dest="load_balance", action="store_false")
    p.add_argument("--rotate", default="alltoall", choices=["alltoall", "allgather"])
    p.add_argument("--longest", default="", help="causal S values to probe, growing")
    p.add_argument("--out", default="")
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    mesh = None
    if world > 1:
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    out = open(args.out, "a") if (args.out and rank == 0) else None

    def emit(res):
        log(rank, "%-10s gpus=%d %-6s %-6s S=%-8d fwd %6.1f  fwd+bwd %6.1f TFLOP/s/GPU  "
            "peak %6.1f GiB/GPU (%.0f KB/token/GPU)" % (
                res["impl"], res["gpus"], res["backend"], res["mask"], res["seq"],
                res["fwd_tflops_per_gpu"], res["fwd_bwd_tflops_per_gpu"],
                res["peak_mem_gib_per_gpu"], res["bytes_per_token_per_gpu"] / 1e3))
        if out:
            out.write(json.dumps(res) + "\n")
            out.flush()

    seqs = [int(x) for x in args.seq.split(",") if x]
    for backend in [x for x in args.backends.split(",") if x]:
        for mask in [x for x in args.masks.split(",") if x]:
            for s in seqs:
                t0 = time.time()
                try:
                    res = run_one(args, mesh, world, rank, s, mask == "causal", backend,
                                  args.warmup, args.iters)
                    res["wall_s"] = time.time() - t0
                    emit(res)
                except Exception as e:  # noqa: BLE001 -- report and go on with the next shape
                    log(rank, f"FAILED {backend} {mask} S={s}: {type(e).__name__}: {e}"[:400])
                    torch.cuda.empty_cache()
                    if world > 1:
                        dist.barrier()
    longest = None
    for s in [int(x) for x in args.longest.split(",") if x]:
        backend = args.backends.split(",")[0]
        try:
            res = run_one(args, mesh, world, rank, s, True, backend, 0, 1)
            res["probe"] = "longest"
            emit(res)
            longest = res
        except torch.OutOfMemoryError as e:
            log(rank, f"longest: S={s} does not fit ({str(e)[:120]})")
            torch.cuda.empty_cache()
            break
    if longest is not None:
        log(rank, "longest that fits: S=%d at %.0f KB/token/GPU" % (
            longest["seq"], longest["bytes_per_token_per_gpu"] / 1e3))
    if out:
        out.close()
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
