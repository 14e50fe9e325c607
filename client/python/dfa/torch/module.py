"""dfa.torch.Attention: attention through the service as an nn.Module that keeps one session.

    attn = dfa.torch.Attention(client, is_causal=True, layout="bhsd", enable_gqa=True)
    out = attn(q, k, v)           # like F.scaled_dot_product_attention(q, k, v, is_causal=True)

The module's session is created by its first forward and kept across steps: a training step
makes no CreateSession/Release calls. It is re-created when the shape changes, or when it was
lost (a worker lost: the C++ client's retry; a restarted coordinator: NOT_FOUND). Use one
module per layer: each holds its own session, so all layers are in flight at once (each
layer's forward state stays on the workers until its backward). Gradient accumulation works
as is; several forwards of one module before their backwards (micro-batches forwarded
together) are correct too, each backward first re-running its own forward (stats["reforwards"]).
Under torch.inference_mode (or no_grad) nothing is kept for a backward.

path: how the tensors move. "auto" (default): CUDA tensors by a device path (no host copy;
falling back to host memory for good when the workers refuse it, e.g. cpu workers), CPU tensors
by shared memory or gRPC; "ipc": a device path or an error; "shm", "grpc": through host memory.
device_path: which device path CUDA tensors take. "auto" (default): CUDA IPC when every worker
is on this host, NCCL otherwise (this process joins the session's workers as an extra NCCL
rank; one communicator per dfa.Client, reused across layers, sessions and steps); "ipc"; "nccl"
(dfa/torch/_device.py, dfa/device_io.py).

release() frees the session (also done when the module is garbage collected; the coordinator's
TTL covers a killed process). stats: sessions created, forwards, backwards, re-forwards,
retries after lost workers, lost sessions, bytes moved by CUDA IPC (ipc_bytes), by NCCL
(nccl_bytes) and through host memory (host_bytes), device-path fallbacks (ipc_fallbacks).
"""

import weakref

import torch

from dfa.torch import _ops, _sessions


class Attention(torch.nn.Module):
    def __init__(self, client, *, is_causal=False, scale=None, enable_gqa=False, layout="bshd",
                 window_size=(-1, -1), num_workers=0, schedule="", max_retries=1, path="auto",
                 recovery_timeout=15.0, device_path="auto"):
        super().__init__()
        _sessions.check_client(client)
        if layout not in _ops._LAYOUTS:
            _ops._bad("layout: must be 'bshd' or 'bhsd', got %r" % (layout,))
        self.is_causal = bool(is_causal)
        self.scale = scale
        self.enable_gqa = bool(enable_gqa)
        self.layout = layout
        _ops._check_mask(None, window_size, 1, 1)
        self.window_size = tuple(window_size)
        self._job = _sessions._LayerJob(client, num_workers=num_workers, schedule=schedule,
                                        max_retries=max_retries, path=path,
                                        recovery_timeout=recovery_timeout,
                                        device_path=device_path)
        self._handle = _sessions.register(self._job)
        self._finalizer = weakref.finalize(self, _sessions.unregister, self._handle)

    def forward(self, q, k, v, cu_seqlens=None):
        """cu_seqlens: this step's packed documents (dfa.torch.attention); a new document
        layout makes a new session."""
        return _ops.attention(q, k, v, is_causal=self.is_causal, scale=self.scale,
                              enable_gqa=self.enable_gqa, layout=self.layout,
                              cu_seqlens=cu_seqlens, window_size=self.window_size,
                              _handle=self._handle)

    @property
    def stats(self):
        return dict(self._job.stats)

    @property
    def last_jobs(self):
        """The last forward and backward jobs ("forward" / "backward": dicts with wall_seconds,
        flops, per-worker busy/idle seconds)."""
        return dict(self._job.last_jobs)

    @property
    def session_id(self):
        """The id of the session the layer holds ("" before its first forward)."""
        return self._job.session_id

    @property
    def shards(self):
        """The placement of the layer's session: one dict per worker with `owned`, the (begin,
        end) token ranges its plan gives that worker (a packed-document plan stripes a long
        document: a front range and its mirror), and its rank, worker_id, address, q_heads and
        kv_heads; () before the first forward and on the CUDA IPC path."""
        return self._job.shards

    def release(self):
        """Frees the layer's session now; the next forward creates a new one."""
        self._job.release()

    def extra_repr(self):
        return "is_causal=%s, layout=%r, enable_gqa=%s" % (self.is_causal, self.layout,
                                                          self.enable_gqa)
