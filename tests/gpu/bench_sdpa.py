#!/usr/bin/env python3
"""PyTorch SDPA FlashAttention-2 and cuDNN backends, same configs and FLOP count as
dfa-cuda-kernel-bench: S = 4K, 16K, 64K; D = 64, 128; causal and full; 32 heads; batch 1; bf16.
CUDA-event timing after one warm-up; forward runs with requires_grad inputs (saves LSE, as a
training step does); backward = autograd.grad of the output. Prints a markdown table.
Usage: python3 bench_sdpa.py [--quick] [--hdim 64|128 (one head dim only)]
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


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
    quick = "--quick" in sys.argv
    hdims = (64, 128)
    if "--hdim" in sys.argv[:-1]:
        hdims = (int(sys.argv[sys.argv.index("--hdim") + 1]),)
    heads = 32
    print("| kernel | D | S | causal | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, backend in (("torch-fa2", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
        for d in hdims:
            for s in ((4096, 16384) if quick else (4096, 16384, 65536)):
                for causal in (True, False):
                    shape = (1, s, heads, d)
                    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                                   for _ in range(4))
                    for t in (q, k, v):
                        t.requires_grad_()
                    reps = 3 if s >= 65536 else (5 if s >= 16384 else 20)
                    flops = 4 * heads * s * s * d / (2 if causal else 1)
                    try:
                        with sdpa_kernel(backend):
                            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), reps)
                        print(f"| {name} | {d} | {s // 1024}K | {'yes' if causal else 'no'} | {fwd:.3f} | "
                              f"{flops / fwd / 1e9:.1f} | {bwd:.3f} | {2.5 * flops / bwd / 1e9:.1f} |", flush=True)
                    except RuntimeError as e:
                        print(f"| {name} | {d} | {s // 1024}K | {'yes' if causal else 'no'} | error: {str(e)[:60]} |")
                    del q, k, v, do
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
