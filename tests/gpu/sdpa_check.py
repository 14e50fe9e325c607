#!/usr/bin/env python3
"""Compares the CUDA backend's outputs (written by dfa_sdpa_cases DIR) with PyTorch on the GPU.

For each case: an fp64 reference (explicit mask at the global offsets, GQA by repeating K/V for
the reference only) gives out, LSE, dQ, dK, dV. Our error ||ours - ref|| / ||ref|| must be at
most 2x the error of PyTorch SDPA run in the same low precision on the same inputs (plus a
small floor), the FlashAttention tolerance rule. Rows that see no key must have out 0, LSE -inf.
Usage: python3 sdpa_check.py DIR   (exit status 1 when any case fails)
"""
import sys

import numpy as np
import torch
import torch.nn.functional as F


def load(dir_, cid, name, dtype, shape):
    raw = np.fromfile(f"{dir_}/case{cid}_{name}.bin", dtype=np.int16 if dtype != "f32" else np.float32)
    t = torch.from_numpy(raw.copy()).cuda()
    if dtype == "bf16":
        t = t.view(torch.bfloat16)
    elif dtype == "f16":
        t = t.view(torch.float16)
    return t.reshape(shape)


def rel(a, ref):
    mask = torch.isfinite(ref)
    a, ref = a[mask].double(), ref[mask].double()
    if not torch.isfinite(a).all():
        return float("inf")
    den = ref.norm().item()
    return (a - ref).norm().item() / (den if den > 0 else 1.0)


def main(dir_):
    torch.manual_seed(0)
    failures = 0
    for line in open(f"{dir_}/cases.txt"):
        cid, dt, d, b, m, n, hq, hk, q0, k0, causal, scale = line.split()
        d, b, m, n, hq, hk, q0, k0, causal = map(int, (d, b, m, n, hq, hk, q0, k0, causal))
        scale = float(scale)
        q = load(dir_, cid, "q", dt, (b, m, hq, d))
        k = load(dir_, cid, "k", dt, (b, n, hk, d))
        v = load(dir_, cid, "v", dt, (b, n, hk, d))
        do = load(dir_, cid, "do", dt, (b, m, hq, d))
        ours = {x: load(dir_, cid, x, "f32", s) for x, s in
                (("out", (b, m, hq, d)), ("lse", (b, hq, m)), ("dq", (b, m, hq, d)),
                 ("dk", (b, n, hk, d)), ("dv", (b, n, hk, d)))}
        vis = torch.ones(m, n, dtype=torch.bool, device="cuda")
        if causal:
            i = torch.arange(m, device="cuda")[:, None] + q0
            j = torch.arange(n, device="cuda")[None, :] + k0
            vis = j <= i
        rows_ok = vis.any(1)  # rows with at least one visible key

        def attention(qq, kk, vv, dtype):
            # BSHD -> BHSD; GQA by repeating K/V heads (reference and baseline only).
            qh = qq.to(dtype).transpose(1, 2).detach().requires_grad_()
            kh = kk.to(dtype).transpose(1, 2).detach().requires_grad_()
            vh = vv.to(dtype).transpose(1, 2).detach().requires_grad_()
            kr = kh.repeat_interleave(hq // hk, 1)
            vr = vh.repeat_interleave(hq // hk, 1)
            if dtype == torch.float64:
                s = (qh @ kr.transpose(-1, -2)) * scale
                s = s.masked_fill(~vis, float("-inf"))
                lse = torch.logsumexp(s, -1)
                p = torch.where(vis, torch.exp(s - torch.where(torch.isinf(lse), 0, lse)[..., None]), 0)
                o = p @ vr
            else:  # PyTorch SDPA in the low precision (boolean mask; empty rows zeroed after)
                o = F.scaled_dot_product_attention(qh, kr, vr, attn_mask=vis, scale=scale)
                o = torch.where(rows_ok[None, None, :, None], o, 0)
                lse = None
            o.backward(do.to(dtype).transpose(1, 2))
            g = lambda t: t.grad.transpose(1, 2)
            return o.transpose(1, 2), lse, g(qh), g(kh), g(vh)

        ro, rlse, rdq, rdk, rdv = attention(q, k, v, torch.float64)
        lo, _, ldq, ldk, ldv = attention(q, k, v, q.dtype)
        errs = {}
        for name, r, base in (("out", ro, lo), ("dq", rdq, ldq), ("dk", rdk, ldk), ("dv", rdv, ldv)):
            e_ours, e_base = rel(ours[name], r), rel(base, r)
            ok = e_ours <= 2 * e_base + 1e-4
            errs[name] = (e_ours, e_base, ok)
        lse_err = (ours["lse"].double() - rlse)[torch.isfinite(rlse)].abs().max().item()
        empty_ok = bool(torch.isneginf(ours["lse"][..., ~rows_ok]).all()) and \
            bool((ours["out"][:, ~rows_ok] == 0).all())
        ok = all(x[2] for x in errs.values()) and lse_err < 1e-2 and empty_ok
        failures += not ok
        desc = f"case {cid} {dt} D={d} B={b} m={m} n={n} Hq={hq} Hkv={hk} q0={q0} k0={k0} causal={causal}"
        parts = " ".join(f"{k_}={v_[0]:.2e}(sdpa {v_[1]:.2e})" for k_, v_ in errs.items())
        print(f"{'PASS' if ok else 'FAIL'} {desc}: {parts} lse_maxerr={lse_err:.1e} empty_rows_ok={empty_ok}")
    print(f"sdpa_check: {failures} failing case(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
