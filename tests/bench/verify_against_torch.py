#!/usr/bin/env python3
"""Checks a service job's results (written by dfa-service-io-dump) against PyTorch on the same
inputs.

  python3 tests/bench/verify_against_torch.py DIR

Reference: fp32 math SDPA on the GPU (inputs as given in bf16, upcast). Tolerance rule (as in
flash-attention's tests): the service's error against the fp32 reference must be at most
2x PyTorch's own bf16 SDPA error (cuDNN/flash backend, same inputs) plus a small floor.
Prints one line per tensor and exits 1 on a failure.
"""
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F


def load(d, name, meta):
    m = meta[name]
    raw = np.fromfile(f"{d}/{name}.bin", dtype=np.uint16 if m["dtype"] in ("bf16", "f16") else np.float32)
    if m["dtype"] == "bf16":
        t = torch.from_numpy(raw.astype(np.int32) << 16).view(torch.float32)
    elif m["dtype"] == "f16":
        t = torch.from_numpy(raw.view(np.float16).astype(np.float32))
    else:
        t = torch.from_numpy(raw)
    b, s, h, dd = m["shape"]
    if m["layout"] == "BHS":
        return t.reshape(b, h, s)
    return t.reshape(b, s, h, dd).transpose(1, 2).contiguous()  # -> [B, H, S, D]


def main():
    d = sys.argv[1]
    meta = json.load(open(f"{d}/meta.json"))
    dev = "cuda"
    x = {n: load(d, n, meta).to(dev) for n in ["q", "k", "v", "dout", "o", "lse", "dq", "dk", "dv"]}
    causal, scale = meta["causal"], meta["scale"]
    hq, hk = x["q"].shape[1], x["k"].shape[1]
    gqa = hq != hk

    def attn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)

    # fp32 reference (math backend) with gradients.
    q32, k32, v32 = (x[n].clone().requires_grad_(True) for n in ["q", "k", "v"])
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        o32 = attn(q32, k32, v32)
    o32.backward(x["dout"])
    # LSE reference, fp32: logsumexp over visible keys.
    s = x["q"].shape[2]
    kk = x["k"].repeat_interleave(hq // hk, dim=1) if gqa else x["k"]
    lse_ref = []
    for h0 in range(0, hq, 4):  # by head groups to bound memory
        sc = torch.matmul(x["q"][:, h0:h0 + 4], kk[:, h0:h0 + 4].transpose(-1, -2)) * scale
        if causal:
            sc = sc.masked_fill(torch.ones(s, s, device=dev, dtype=torch.bool).triu(1), float("-inf"))
        lse_ref.append(torch.logsumexp(sc, dim=-1))
    lse_ref = torch.cat(lse_ref, dim=1)
    # PyTorch's own bf16 result: the error budget.
    qb, kb, vb = (x[n].to(torch.bfloat16).requires_grad_(True) for n in ["q", "k", "v"])
    ob = attn(qb, kb, vb)
    ob.backward(x["dout"].to(torch.bfloat16))
    ours = {"o": x["o"], "dq": x["dq"], "dk": x["dk"], "dv": x["dv"]}
    ref = {"o": o32, "dq": q32.grad, "dk": k32.grad, "dv": v32.grad}
    torch_bf16 = {"o": ob.float(), "dq": qb.grad.float(), "dk": kb.grad.float(), "dv": vb.grad.float()}
    ok = True
    for n in ["o", "dq", "dk", "dv"]:
        r = ref[n].detach()
        err = (ours[n] - r).abs().max().item()
        budget = (torch_bf16[n] - r).abs().max().item()
        rel = ((ours[n] - r).norm() / r.norm()).item()
        good = err <= 2 * budget + 1e-5 * r.abs().max().item()
        ok &= good
        print(f"{n:4s} max|err| {err:.3e}  torch bf16 {budget:.3e}  rel L2 {rel:.2e}  {'ok' if good else 'FAIL'}")
    lse_err = (x["lse"] - lse_ref).abs().max().item()
    good = lse_err < 1e-2
    ok &= good
    print(f"lse  max|err| {lse_err:.3e}  {'ok' if good else 'FAIL'}")
    print("verify_against_torch:", "PASS" if ok else "FAIL",
          f"(S={s} Hq={hq} Hkv={hk} D={x['q'].shape[3]} {'causal' if causal else 'full'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
