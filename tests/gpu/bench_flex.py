#!/usr/bin/env python3
"""PyTorch flex attention (torch.compile'd, with a BlockMask, so empty blocks are skipped) on the
masked configs of `dfa-cuda-kernel-bench --masks`, FLOPs counted on the visible pairs alike:
dense causal, varlen causal (the bench's own document offsets, written by its --docs-out DIR),
causal windows of 4K and 32K; 32 heads, bf16, batch 1. CUDA-event timing after one warm-up (the
compile); backward = autograd.grad of the output. Prints a markdown table.
Usage: python3 bench_flex.py DOCS_DIR [--seq S ...] [--hdim D] [--reps N]
"""
import argparse
import os

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def timed(fn, reps):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("docs_dir")
    ap.add_argument("--seq", type=int, nargs="+", default=[65536])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    heads, d = 32, a.hdim
    flex = torch.compile(flex_attention, dynamic=False)
    print("| kernel | D | S | mask | visible pairs | fwd ms | fwd TFLOP/s | x dense | bwd ms | bwd TFLOP/s | x dense |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for s in a.seq:
        with open(os.path.join(a.docs_dir, f"docs_{s}.txt")) as f:
            offsets = [int(x) for x in f.read().split()]
        lengths = torch.tensor(offsets[1:], device="cuda") - torch.tensor(offsets[:-1], device="cuda")
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"), lengths)
        pos = torch.arange(s, device="cuda", dtype=torch.float64)
        configs = [("dense causal", lambda b, h, qi, ki: qi >= ki, s * (s + 1) / 2),
                   (f"varlen causal ({len(lengths)} docs)",
                    lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki),
                    float((lengths.double() * (lengths.double() + 1) / 2).sum()))]
        for w in (4096, 32768):
            configs.append((f"causal window {w // 1024}K",
                            lambda b, h, qi, ki, w=w: (qi >= ki) & (qi - ki <= w),
                            float(torch.clamp(pos, max=w).sum() + s)))
        q, k, v, do = (torch.randn(1, heads, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_()
        dense_f = dense_b = None
        for name, mask_mod, pairs in configs:
            try:
                bm = create_block_mask(mask_mod, 1, 1, s, s, device="cuda", _compile=True)
                fwd = timed(lambda: flex(q, k, v, block_mask=bm), a.reps)
                out = flex(q, k, v, block_mask=bm)
                bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), a.reps)
                flops = 4 * heads * pairs * d
                tf, tb = flops / fwd / 1e9, 2.5 * flops / bwd / 1e9
                if dense_f is None:
                    dense_f, dense_b = tf, tb
                print(f"| torch-flex | {d} | {s // 1024}K | {name} | {pairs:.3g} | {fwd:.3f} | {tf:.1f} | "
                      f"{tf / dense_f:.2f} | {bwd:.3f} | {tb:.1f} | {tb / dense_b:.2f} |", flush=True)
                del out
            except Exception as e:  # report and go on with the next config
                print(f"| torch-flex | {d} | {s // 1024}K | {name} | error: {str(e)[:80]} |", flush=True)
        del q, k, v, do
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
