"""One causal GQA attention layer in torch, shared by the GPU tests that send it through the
service (torch_ipc_test.py, torch_nccl_test.py): its inputs, local SDPA's outputs and gradients,
and the error measure they are compared with."""

import torch
import torch.nn.functional as F


def layer_inputs(s, hq=32, hkv=8, d=128, seed=0):
    """Q, K, V (BSHD, bf16, on the current CUDA device, requiring grad) and dO for S = s."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16,  # noqa: E731
                               generator=g).requires_grad_()
    return mk(hq), mk(hkv), mk(hkv), torch.randn(1, s, hq, d, device="cuda",
                                                  dtype=torch.bfloat16, generator=g)


def sdpa_reference(q, k, v, do):
    """Local SDPA in BSHD with GQA: O, dQ, dK, dV."""
    qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
    dq, dk, dv = torch.autograd.grad(o, (qs, ks, vs), do.transpose(1, 2))
    return tuple(t.transpose(1, 2) for t in (o, dq, dk, dv))


def max_rel(a, b):
    """max |a - b| / max |b|."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
