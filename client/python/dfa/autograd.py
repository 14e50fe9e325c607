"""PyTorch integration: attention offloaded to the DistFlashAttn Service as an autograd op.

    from dfa.autograd import DistributedAttention, distributed_attention
    out = distributed_attention(q, k, v, client, causal=True)      # q [B, S, Hq, D], k/v [B, S, Hkv, D]
    out.backward(grad)                                             # q.grad, k.grad, v.grad

forward: creates a session, uploads Q, K, V straight to the workers owning each shard, runs the
forward job and returns O (same dtype and device as q). The autograd graph keeps only the
session handle: no Q, K, V or O stay on the client for backward.
backward: uploads ONLY dO and runs the backward job, which reuses the Q, K, V, O and LSE the
workers kept (rematerialisation-aware: the forward is never recomputed, Q/K/V never re-sent),
then downloads dQ, dK, dV and releases the session. So do NOT wrap this op in
torch.utils.checkpoint: checkpointing would re-run the forward job for nothing; the op already
holds no activations on the client.

Tensors: bf16, f16 or f32, layout [batch, seq, heads, head_dim] (made contiguous here); on a GPU
they are staged through host memory. Errors: ValueError naming the field for bad inputs;
dfa.DfaError for the service's answers. A backward run twice on the same graph
(retain_graph=True) raises RuntimeError: the session was released after the first.
"""

import numpy as np
import torch

from dfa.spec import AttentionSpec

_TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def to_host(t, name):
    """Torch tensor -> contiguous numpy array of the service's host dtype (bf16 as uint16)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.dtype not in _TORCH_DTYPES:
        raise ValueError("%s: dtype %s not supported (bfloat16, float16, float32)" % (name, t.dtype))
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def from_host(a, like):
    """numpy array from the service -> torch tensor of `like`'s dtype and device."""
    if like.dtype == torch.bfloat16:
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(like.device)


def spec_for(q, k, v, causal, softmax_scale):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError("%s: expected a 4-d torch.Tensor [batch, seq, heads, head_dim], got %s"
                             % (name, getattr(t, "shape", type(t).__name__)))
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError("k, v: dtypes %s, %s differ from q's %s" % (k.dtype, v.dtype, q.dtype))
    if q.dtype not in _TORCH_DTYPES:
        raise ValueError("q: dtype %s not supported (bfloat16, float16, float32)" % q.dtype)
    b, s, hq, d = q.shape
    if k.shape != v.shape:
        raise ValueError("v: shape %s differs from k's %s" % (tuple(v.shape), tuple(k.shape)))
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, s, d):
        raise ValueError("k: shape %s does not match q's batch %d, seq %d, head_dim %d"
                         % (tuple(k.shape), b, s, d))
    return AttentionSpec(batch=b, seq_len=s, q_heads=hq, kv_heads=k.shape[2], head_dim=d,
                         causal=causal, dtype=_TORCH_DTYPES[q.dtype], softmax_scale=softmax_scale)


class DistributedAttention(torch.autograd.Function):
    """apply(q, k, v, client, causal=True, softmax_scale=0.0, schedule="", num_workers=0) -> O.

    `client` is a dfa.Client; softmax_scale 0 means 1/sqrt(head_dim); schedule "" is the
    coordinator's default; num_workers 0 means all live workers.
    """

    @staticmethod
    def forward(ctx, q, k, v, client, causal=True, softmax_scale=0.0, schedule="", num_workers=0):
        spec = spec_for(q, k, v, causal, softmax_scale)
        hq, hk, hv = to_host(q, "q"), to_host(k, "k"), to_host(v, "v")
        session = client.create_session(spec, num_workers=num_workers, schedule=schedule)
        try:
            o, _ = session.forward(hq, hk, hv, download_lse=False)
        except BaseException:
            session.release()
            raise
        del hq, hk, hv
        if any(ctx.needs_input_grad[:3]):
            ctx.session = session  # the workers hold Q, K, V, O, LSE for backward
        else:
            session.release()
            ctx.session = None
        ctx.like = (q.new_empty(0), k.new_empty(0), v.new_empty(0))
        return from_host(o, q)

    @staticmethod
    def backward(ctx, grad_out):
        session = ctx.session
        if session is None or session.released:
            raise RuntimeError("DistributedAttention: backward ran twice (retain_graph) or without "
                               "a forward session; the session is released after one backward")
        try:
            dq, dk, dv = session.backward(to_host(grad_out.to(ctx.like[0].dtype), "grad_out"))
        finally:
            session.release()
        lq, lk, lv = ctx.like
        return (from_host(dq, lq), from_host(dk, lk), from_host(dv, lv), None, None, None, None,
                None)


def distributed_attention(q, k, v, client, causal=True, softmax_scale=0.0, schedule="",
                          num_workers=0):
    """Keyword-friendly wrapper of DistributedAttention.apply."""
    return DistributedAttention.apply(q, k, v, client, causal, softmax_scale, schedule, num_workers)
