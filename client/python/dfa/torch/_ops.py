"""The custom ops dfa::attention / dfa::attention_backward and the SDPA-style wrapper.

    out = dfa.torch.attention(q, k, v, is_causal=True, client=client)            # [B, S, H, D]
    out = dfa.torch.attention(q, k, v, is_causal=True, layout="bhsd", client=c)   # SDPA's layout
    out = dfa.torch.attention(q, k, v, is_causal=True, cu_seqlens=cu, window_size=(4096, 0),
                              client=c)    # packed documents, sliding window (flash-attn style)

dfa::attention(q, k, v, handle, is_causal, scale, need_grad, mask) -> (out, token) takes BSHD
contiguous tensors (the wrapper transposes "bhsd" around it, as ordinary traced ops) and the int
handle of a layer job or of a client (dfa.torch._sessions); `mask` is the documents and window
as one int list (_encode_mask). It is a torch.library.custom_op with
a fake implementation, so torch.compile(fullgraph=True) traces it as one opaque node, and an
autograd formula: setup_context saves q, k, v (as SDPA's backward does) and the int64 token
(handle, generation, client handle); the backward op dfa::attention_backward sends ONLY dO (the
workers kept Q, K, V, O, LSE) and uses q, k, v only to re-run a forward whose state the workers
no longer hold. Autocast: under torch.autocast the floating inputs are cast to the autocast dtype
before the op runs (an Autocast kernel for CPU and CUDA), as SDPA is.

CUDA tensors go to the workers and the results come back into CUDA tensors, device to device
(dfa/torch/_device.py): by CUDA IPC when the workers share this host, by NCCL otherwise
(device_path "auto"; "ipc" or "nccl" force one); cpu workers refuse both and the layer falls
back to host memory. CPU tensors go by shared memory or gRPC. Results are on the input's device.
"""

import torch

from dfa.device_io import check_device_path
from dfa.errors import InvalidArgumentError
from dfa.torch import _sessions

_LAYOUTS = ("bshd", "bhsd")


def _bad(message):
    raise InvalidArgumentError("INVALID_ARGUMENT", message)


@torch.library.custom_op("dfa::attention", mutates_args=())
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: int, is_causal: bool,
               scale: float, need_grad: bool,
               mask: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    job, job_handle = _sessions.layer_for(handle)
    spec = _spec(q, k, is_causal, scale, mask)
    o, generation = job.forward(spec, q, k, v, need_grad)
    if job.one_shot and not need_grad:
        _sessions.unregister(job_handle)  # released: nothing kept on the workers
    token = torch.tensor([job_handle, generation, handle], dtype=torch.int64)
    return o, token


@_attention.register_fake
def _attention_fake(q, k, v, handle, is_causal, scale, need_grad, mask):
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty(3, dtype=torch.int64)


@torch.library.custom_op("dfa::attention_backward", mutates_args=())
def _attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, token: torch.Tensor, is_causal: bool,
                        scale: float,
                        mask: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    job_handle, generation, origin = (int(x) for x in token.tolist())
    job = _sessions.lookup(job_handle)
    if job is None:
        # A one-shot job already released (a second backward through the same graph): run the
        # forward again on a new one from the saved inputs.
        job, job_handle = _sessions.layer_for(origin)
        generation = -1
    spec = _spec(q, k, is_causal, scale, mask)
    dq, dk, dv = job.backward(spec, generation, grad_out.to(q.dtype).contiguous(), q, k, v)
    if job.one_shot:
        _sessions.unregister(job_handle)
    return dq, dk, dv


@_attention_backward.register_fake
def _attention_backward_fake(grad_out, q, k, v, token, is_causal, scale, mask):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, handle, is_causal, scale, need_grad, mask = inputs
    ctx.save_for_backward(q, k, v, output[1])
    ctx.is_causal = is_causal
    ctx.scale = scale
    ctx.mask = mask


def _backward(ctx, grad_out, grad_token):
    q, k, v, token = ctx.saved_tensors
    dq, dk, dv = torch.ops.dfa.attention_backward(grad_out.contiguous(), q, k, v, token,
                                                  ctx.is_causal, ctx.scale, ctx.mask)
    return dq, dk, dv, None, None, None, None, None


def _double_backward(ctx, *grads):
    raise RuntimeError("dfa.torch.attention: double backward (create_graph=True, higher-order "
                       "gradients) is not supported: the service computes first-order gradients")


def _setup_backward_context(ctx, inputs, output):
    pass


torch.library.register_autograd("dfa::attention", _backward, setup_context=_setup_context)
torch.library.register_autograd("dfa::attention_backward", _double_backward,
                                setup_context=_setup_backward_context)


def _register_autocast(device_type):
    """Under torch.autocast(device_type): cast q, k, v to the autocast dtype, then run the op with
    autocast off (torch.library.register_autocast with the dtype read at call time)."""
    key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    key = getattr(torch._C.DispatchKey, key_name)
    op = torch.ops.dfa.attention.default

    def cast_and_call(q, k, v, *rest):
        dtype = torch.get_autocast_dtype(device_type)
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*(t.to(dtype) if t.is_floating_point() else t for t in (q, k, v)), *rest)

    op.py_impl(key)(cast_and_call)
    _lib.impl("attention", lambda _keyset, *args: cast_and_call(*args), key_name,
              with_keyset=True)


_lib = torch.library.Library("dfa", "FRAGMENT")
for _device in ("cpu", "cuda"):
    if torch._C._is_autocast_available(_device):
        _register_autocast(_device)


def _check(q, k, v, layout, enable_gqa):
    if layout not in _LAYOUTS:
        _bad("layout: must be 'bshd' ([batch, seq, heads, head_dim]) or 'bhsd' (SDPA's "
             "[batch, heads, seq, head_dim]), got %r" % (layout,))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _bad("%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.dim() != 4:
            _bad("%s: expected 4 dimensions (%s), got shape %s"
                 % (name, layout, tuple(t.shape)))
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            _bad("%s: dtype %s differs from q's %s" % (name, t.dtype, q.dtype))
        if t.device != q.device:
            _bad("%s: device %s differs from q's %s" % (name, t.device, q.device))
    if q.dtype not in _sessions._TORCH_DTYPES:
        _bad("q: dtype %s is not supported (bfloat16, float16, float32)" % q.dtype)
    seq_dim, head_dim_ = (1, 2) if layout == "bshd" else (2, 1)
    b, s, hq, d = q.shape[0], q.shape[seq_dim], q.shape[head_dim_], q.shape[3]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[head_dim_] > t.shape[seq_dim]:
            _bad("%s: layout %r reads shape %s as %d positions and %d heads: more heads than "
                 "positions, so the tensor is probably in the other layout (pass layout=%r)"
                 % (name, layout, tuple(t.shape), t.shape[seq_dim], t.shape[head_dim_],
                    "bhsd" if layout == "bshd" else "bshd"))
    if k.shape != v.shape:
        _bad("v: shape %s differs from k's %s" % (tuple(v.shape), tuple(k.shape)))
    if k.shape[0] != b or k.shape[seq_dim] != s or k.shape[3] != d:
        _bad("k: shape %s does not match q's batch %d, %d positions and head_dim %d (layout %r; "
             "queries and keys must cover the same positions)" % (tuple(k.shape), b, s, d, layout))
    hkv = k.shape[head_dim_]
    if hq % hkv != 0:
        _bad("k: %d key/value heads do not divide q's %d heads" % (hkv, hq))
    if hkv != hq and not enable_gqa:
        _bad("k: %d key/value heads differ from q's %d heads; pass enable_gqa=True for grouped-"
             "query attention" % (hkv, hq))
    if not d:
        _bad("q: head_dim is 0")


def _spec(q, k, is_causal, scale, mask):
    """The AttentionSpec of the op's BSHD tensors and encoded mask."""
    docs, left, right = _decode_mask(mask)
    return _sessions.spec_of(q, k, is_causal, scale, doc_offsets=docs, window_left=left,
                             window_right=right)


def _encode_mask(doc_offsets, window):
    """[left, right, n_0, offsets of row 0..., n_1, ...]: the op's one int-list mask argument."""
    out = [int(window[0]), int(window[1])]
    for row in doc_offsets:
        out.append(len(row))
        out.extend(int(o) for o in row)
    return out


def _decode_mask(mask):
    left, right = int(mask[0]), int(mask[1])
    docs, i = [], 2
    while i < len(mask):
        n = int(mask[i])
        docs.append(tuple(int(o) for o in mask[i + 1:i + 1 + n]))
        i += 1 + n
    return tuple(docs), left, right


def _int_list(x, name):
    """A 1-D integer tensor or sequence as a list of ints; INVALID_ARGUMENT naming `name`."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 1:
            _bad("%s: expected a 1-D integer tensor of offsets, got shape %s"
                 % (name, tuple(x.shape)))
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            _bad("%s: expected an integer tensor, got dtype %s" % (name, x.dtype))
        return [int(o) for o in x.tolist()]
    if isinstance(x, (list, tuple)) and all(isinstance(o, int) and not isinstance(o, bool)
                                            for o in x):
        return [int(o) for o in x]
    _bad("%s: expected a 1-D integer tensor (or list) of offsets, got %r" % (name, x))


def _check_mask(cu_seqlens, window_size, batch, seq):
    """The documents and window of attention(); errors name cu_seqlens / window_size."""
    if window_size is None:
        window_size = (-1, -1)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or
            not all(isinstance(w, int) and not isinstance(w, bool) and w >= -1
                    for w in window_size)):
        _bad("window_size: must be (left, right), integers >= -1 (-1: unbounded), got %r"
             % (window_size,))
    if cu_seqlens is None:
        return (), tuple(window_size)
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1:
        rows, names = [_int_list(cu_seqlens, "cu_seqlens")], ["cu_seqlens"]
    else:
        if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 2:
            cu_seqlens = list(cu_seqlens)
        if not isinstance(cu_seqlens, (list, tuple)) or len(cu_seqlens) != batch:
            _bad("cu_seqlens: expected a 1-D integer tensor (every batch row) or one per batch "
                 "row (%d), got %r" % (batch, cu_seqlens))
        names = ["cu_seqlens[%d]" % b for b in range(batch)]
        rows = [_int_list(r, n) for r, n in zip(cu_seqlens, names)]
    for row, name in zip(rows, names):
        if len(row) < 2:
            _bad("%s: expected at least 2 offsets [0, ..., %d], got %r" % (name, seq, row))
        if row[0] != 0:
            _bad("%s[0] = %d: the first offset must be 0" % (name, row[0]))
        for i in range(1, len(row)):
            if row[i] <= row[i - 1]:
                _bad("%s[%d] = %d is not greater than %s[%d] = %d"
                     % (name, i, row[i], name, i - 1, row[i - 1]))
            if i + 1 < len(row) and row[i] >= seq:
                _bad("%s[%d] = %d: an inner offset must be less than the sequence length %d"
                     % (name, i, row[i], seq))
        if row[-1] != seq:
            _bad("%s[%d] = %d: the last offset must be the sequence length %d"
                 % (name, len(row) - 1, row[-1], seq))
    return tuple(tuple(r) for r in rows), tuple(window_size)


def attention(q, k, v, *, is_causal=False, scale=None, enable_gqa=False, layout="bshd",
              cu_seqlens=None, window_size=(-1, -1), client=None, device_path="auto",
              _handle=None):
    """Exact attention softmax(scale·QKᵀ + mask)·V computed by the service.

    q: [B, S, Hq, D] (layout "bshd") or [B, Hq, S, D] ("bhsd", as
    torch.nn.functional.scaled_dot_product_attention); k, v: the same with Hkv heads (Hkv < Hq
    needs enable_gqa=True and must divide Hq). bfloat16, float16 or float32, on one device.
    scale None: 1/sqrt(D). client: a dfa.Client; each call then makes its own session (created
    and released per call); dfa.torch.Attention keeps one per layer across steps instead.
    cu_seqlens (flash-attn's varlen offsets): packed documents, attention only inside each; a
    1-D integer tensor [0, o_1, ..., S] for every batch row (B = 1: the one row), or one such
    tensor per batch row; any lengths. window_size (left, right): query i sees keys
    i - left .. i + right (-1: unbounded; is_causal caps right at 0), as flash-attn's.
    device_path: how CUDA tensors move ("auto": CUDA IPC to workers on this host, NCCL
    otherwise; "ipc"; "nccl"; dfa.torch.Attention's). Returns the output in q's layout, dtype and
    device.
    """
    _check(q, k, v, layout, enable_gqa)
    seq_dim = 1 if layout == "bshd" else 2
    docs, window = _check_mask(cu_seqlens, window_size, q.shape[0], q.shape[seq_dim])
    mask = _encode_mask(docs, window)
    if scale is not None and (not isinstance(scale, (int, float)) or not scale > 0):
        _bad("scale: must be a positive number or None (1/sqrt(head_dim)), got %r" % (scale,))
    check_device_path(device_path)
    if _handle is None:
        _sessions.check_client(client)
        options = {} if device_path == "auto" else {"device_path": device_path}
        _handle = _sessions.register_client(client, options)
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                             v.requires_grad)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out, _ = torch.ops.dfa.attention(q.contiguous(), k.contiguous(), v.contiguous(), _handle,
                                     bool(is_causal), float(scale or 0.0), need_grad, mask)
    return out.transpose(1, 2) if layout == "bhsd" else out
