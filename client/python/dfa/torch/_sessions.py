"""The sessions behind dfa.torch: a registry of live layer jobs keyed by an int handle (custom ops
take tensors and simple types, so the op receives the handle), and _LayerJob, which keeps one
session per layer across steps.

A _LayerJob owns one dfa._dfa.AttentionJob per spec: the session is created by the first
forward and kept, so later steps make no CreateSession/Release calls; it is re-created only when
the shape (spec) changes or the session was lost (NOT_FOUND after a coordinator restart). Every
forward gets a generation number; the token tensor the op returns carries (handle, generation)
to the backward. A backward whose generation is not the one the workers hold (the same layer
ran another forward in between: gradient accumulation over micro-batches forwarded together, a
layer used twice) first re-runs that forward from the tensors autograd saved — counted in
stats["reforwards"] — so it is never computed from another forward's state.

Retries after a lost worker are the C++ AttentionJob's (a new session on the live workers,
inputs re-sent, at most max_retries); each is logged on the "dfa" logger and counted.

Paths: CUDA tensors take a device path (dfa/torch/_device.py, the tensors never leave the GPU)
when the extension has CUDA and path is "auto" or "ipc": CUDA IPC (a DeviceAttentionJob) or
NCCL (an NcclJob), as device_path says ("auto": IPC when the workers are on this host, NCCL
otherwise); everything else is staged through host memory for the C++ AttentionJob (shared
memory on the workers' host, gRPC elsewhere). stats["ipc_bytes"] counts what moved by CUDA IPC,
stats["nccl_bytes"] by NCCL, stats["host_bytes"] through host memory.
"""

import itertools
import logging
import threading
import weakref

import numpy as np
import torch

from dfa import _dfa
from dfa.device_io import check_device_path
from dfa.errors import DfaError, InvalidArgumentError
from dfa.spec import AttentionSpec
from dfa.torch import _device

log = logging.getLogger("dfa")

_TORCH_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_lock = threading.Lock()
_entries = {}
_ids = itertools.count(1)


def register(entry):
    with _lock:
        handle = next(_ids)
        _entries[handle] = entry
    return handle


def lookup(handle):
    with _lock:
        return _entries.get(handle)


def unregister(handle):
    with _lock:
        entry = _entries.pop(handle, None)
    if entry is not None and isinstance(entry, _LayerJob):
        entry.release(quiet=True)


def to_host(t):
    """A CPU, C-contiguous view of `t` the extension reads in place (bf16 as torch.bfloat16)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous()


def from_host(a, like):
    """numpy array from the extension (owning its bytes) -> torch tensor of `like`'s dtype and
    device; no copy on the CPU."""
    t = torch.from_numpy(a)
    if like.dtype == torch.bfloat16:
        t = t.view(torch.int16).view(torch.bfloat16) if a.dtype == np.uint16 else t
    if t.device != like.device:
        t = t.to(like.device)
    return t


def spec_of(q, k, is_causal, scale, doc_offsets=(), window_left=-1, window_right=-1):
    """The AttentionSpec of BSHD q [B, S, Hq, D] and k [B, S, Hkv, D] (and the mask's documents
    and window)."""
    b, s, hq, d = q.shape
    return AttentionSpec(batch=b, seq_len=s, q_heads=hq, kv_heads=k.shape[2], head_dim=d,
                         causal=bool(is_causal), dtype=_TORCH_DTYPES[q.dtype],
                         softmax_scale=float(scale), doc_offsets=doc_offsets,
                         window_left=window_left, window_right=window_right)


class ClientEntry:
    """A dfa.Client registered for the functional form: each call gets a one-shot _LayerJob."""

    def __init__(self, client, options):
        self.client = client
        self.options = options


class _LayerJob:
    """One layer's session across steps (see the module docstring). Thread-safe."""

    def __init__(self, client, num_workers=0, schedule="", max_retries=1, path="auto",
                 recovery_timeout=15.0, one_shot=False, device_path="auto"):
        if path not in ("auto", "ipc", "shm", "grpc"):
            raise InvalidArgumentError("INVALID_ARGUMENT", "path: must be 'auto', 'ipc', 'shm' "
                                       "or 'grpc', got %r" % (path,))
        check_device_path(device_path)
        self.client = client
        self.path = path
        self.device_path = device_path
        self._host_only = False    # "auto" after the workers refused the device path
        self._to_nccl = False      # device_path "auto" after a worker on another host refused IPC
        self.options = dict(num_workers=num_workers, schedule=schedule, max_retries=max_retries,
                            path=path, recovery_timeout=float(recovery_timeout))
        self.one_shot = one_shot
        self._job = None
        self._device = False       # False (host AttentionJob) or the device job's kind()
        self._spec = None
        self._generation = 0
        self._live = None          # generation whose forward state the workers hold
        self._session_id = ""
        self._lock = threading.Lock()
        self.last_jobs = {}        # "forward" / "backward" -> the last job (a dict)
        self.stats = {"sessions": 0, "forwards": 0, "backwards": 0, "reforwards": 0,
                      "retries": 0, "lost_sessions": 0, "ipc_bytes": 0, "nccl_bytes": 0,
                      "host_bytes": 0, "ipc_fallbacks": 0}

    @property
    def session_id(self):
        return self._session_id

    @property
    def shards(self):
        """The held session's placement (one dict per worker: rank, worker_id, address, owned,
        q_heads, kv_heads); () before the first forward and on the CUDA IPC path."""
        with self._lock:
            if self._job is None or self._device == "ipc":
                return ()
            if self._device:
                session = self._job._session
                return () if session is None else tuple(session.shards)
            return tuple(self._job.shards)

    def _device_kind(self):
        """The device job a new session gets: "ipc", "nccl" or "auto-nccl" (_device.kind)."""
        if self._to_nccl:
            return "auto-nccl"
        return _device.kind(self.client, self.device_path)

    def _ensure(self, spec, device=False):
        if self._job is not None and self._spec == spec and bool(self._device) == device:
            return
        self._drop()
        if device:
            self._device = self._device_kind()
            self._job = _device.new_job(self.client, spec, self.options, self._device)
        else:
            options = dict(self.options)
            if options["path"] == "ipc":
                options["path"] = "auto"
            self._job = _dfa.AttentionJob(self.client._c, spec.as_dict(), **options)
            self._device = False
        self._spec = spec

    def uses_ipc(self, t):
        """Whether tensors like `t` go by CUDA IPC (see the module docstring)."""
        if self.path == "ipc":
            _device.check("q", t, self.path, self.device_path)
            return True
        return not self._host_only and _device.wants(self.path, t)

    def _drop(self):
        if self._job is not None:
            try:
                self._job.release()
            except DfaError as e:  # best effort: a lost worker or coordinator may not answer
                log.warning("dfa.torch: releasing session %s: %s", self._session_id, e)
        self._job = None
        self._live = None
        self._session_id = ""

    def _note(self):
        for reason in self._job.take_retry_log():
            self.stats["retries"] += 1
            log.warning("dfa.torch: retried on a new session after: %s", reason)
        sid = self._job.session_id
        if sid and sid != self._session_id:
            self.stats["sessions"] += 1
            self._session_id = sid

    def _forward_locked(self, spec, q, k, v, o=None):
        """Host path: O (numpy) of host arrays. Device path (o given or q a CUDA tensor): writes
        O into `o` (None: a re-forward, O not written) and returns it."""
        device = self._device_inputs(q)
        self._ensure(spec, device)
        for attempt in range(2):
            try:
                if device:
                    job = self._job.forward(_device.ref(q), _device.ref(k), _device.ref(v),
                                            None if o is None else _device.ref(o))
                    self._count_device_bytes()
                else:
                    o, _, job = self._job.forward(q, k, v)
                    self.stats["host_bytes"] += q.nbytes + k.nbytes + v.nbytes + o.nbytes
                self.last_jobs["forward"] = job
                break
            except DfaError as e:
                self._note()
                # A coordinator that restarted no longer knows the session: a new one, once.
                if e.code != "NOT_FOUND" or attempt == 1:
                    self._live = None
                    raise
                self.stats["lost_sessions"] += 1
                log.warning("dfa.torch: session %s lost (%s); creating a new one",
                            self._session_id, e.details)
                self._drop()
                self._ensure(spec, device)
        self._note()
        return o

    def _count_device_bytes(self):
        times = self._job.last_times
        if self._device == "ipc":
            self.stats["ipc_bytes"] += times["bytes"]
        else:
            self.stats["ipc_bytes"] += times["ipc_bytes"]
            self.stats["nccl_bytes"] += times["nccl_bytes"]

    @staticmethod
    def _device_inputs(q):
        return isinstance(q, torch.Tensor) and q.is_cuda

    def _fallback(self, e):
        """The workers refused the device path: "nccl" when IPC was refused by a worker on
        another host under device_path="auto" (NCCL from now on); True under path="auto" for
        the other refusals (the host paths from now on); False otherwise (raise)."""
        if (self.device_path == "auto" and self._device == "ipc" and not self._to_nccl and
                _device.other_host(e)):
            log.warning("dfa.torch: a worker is on another host (%s); moving CUDA tensors by "
                        "NCCL from now on", e.details)
            self._to_nccl = True
            self._drop()
            return "nccl"
        if self.path != "auto" or not _device.refused(e):
            return False
        log.warning("dfa.torch: the workers cannot take CUDA IPC (%s); staging CUDA tensors "
                    "through host memory from now on", e.details)
        self.stats["ipc_fallbacks"] += 1
        self._host_only = True
        self._drop()
        return True

    def forward(self, spec, q, k, v, need_grad):
        """O of q, k, v (torch tensors, BSHD contiguous) on q's device; the generation for the
        backward."""
        with self._lock:
            if self.uses_ipc(q):
                out = torch.empty_like(q)
                while True:
                    try:
                        self._forward_locked(spec, q, k, v, out)
                        break
                    except DfaError as e:
                        fallback = self._fallback(e)
                        if fallback == "nccl":
                            continue  # once: _to_nccl is set now
                        if not fallback:
                            raise
                        out = None
                        break
            else:
                out = None
            if out is None:
                out = from_host(self._forward_locked(spec, to_host(q), to_host(k), to_host(v)),
                                q)
                if not need_grad:
                    self._job.forget_inputs()  # nothing kept for a backward
            self.stats["forwards"] += 1
            self._generation += 1
            self._live = self._generation
            return out, self._generation

    def backward(self, spec, generation, grad_out, q, k, v):
        """(dQ, dK, dV) torch tensors on q's device, of torch tensors grad_out, q, k, v (BSHD
        contiguous); re-runs the forward of `generation` from q, k, v when the workers hold
        another one's state (or none)."""
        with self._lock:
            device = self._device_inputs(q) and self.uses_ipc(q)
            like = (q, k, v)
            if device:
                self._ensure(spec, True)  # a layer that fell back meanwhile re-forwards below
            else:
                q, k, v, grad_out = to_host(q), to_host(k), to_host(v), to_host(grad_out)
                self._ensure(spec, False)
            if self._live != generation or self._job is None or self._spec != spec:
                self.stats["reforwards"] += 1
                self._forward_locked(spec, q, k, v)
                self._live = generation
            for attempt in range(2):
                try:
                    if device:
                        dq, dk, dv = (torch.empty_like(t) for t in like)
                        job = self._job.backward(_device.ref(grad_out), _device.ref(dq),
                                                 _device.ref(dk), _device.ref(dv))
                        self._count_device_bytes()
                    else:
                        dq, dk, dv, job = self._job.backward(grad_out)
                        self.stats["host_bytes"] += grad_out.nbytes + dq.nbytes + dk.nbytes + \
                            dv.nbytes
                        dq, dk, dv = (from_host(a, t) for a, t in zip((dq, dk, dv), like))
                    self.last_jobs["backward"] = job
                    break
                except DfaError as e:
                    self._note()
                    if e.code != "NOT_FOUND" or attempt == 1:
                        raise
                    self.stats["lost_sessions"] += 1
                    log.warning("dfa.torch: session %s lost (%s); re-running the forward on a "
                                "new one", self._session_id, e.details)
                    self._drop()
                    self._forward_locked(spec, q, k, v)
                    self._live = generation
            self._note()
            # The backward leaves the gradients in the workers' Q, K, V and O memory
            # (docs/memory.md): a second backward of this generation re-runs its forward.
            self._live = None
            self.stats["backwards"] += 1
            return dq, dk, dv

    def release(self, quiet=False):
        with self._lock:
            if quiet:
                self._drop()
            else:
                job, self._job = self._job, None
                self._live, self._session_id = None, ""
                if job is not None:
                    job.release()


def layer_for(handle):
    """The _LayerJob behind `handle`, or a new one-shot job for a registered client (returned with
    its own handle). RuntimeError when the handle is not live."""
    entry = lookup(handle)
    if entry is None:
        raise RuntimeError("dfa.torch: handle %d is not a live layer or client (released?)"
                           % handle)
    if isinstance(entry, ClientEntry):
        job = _LayerJob(entry.client, one_shot=True, **entry.options)
        return job, register(job)
    return entry, handle


def register_client(client, options):
    """The handle of `client` for the functional form (one per client and options, kept while
    the client lives)."""
    key = tuple(sorted(options.items()))
    cache = _client_handles.setdefault(id(client), {})
    handle = cache.get(key)
    if handle is None or lookup(handle) is None:
        handle = register(ClientEntry(client, dict(options)))
        cache[key] = handle
        weakref.finalize(client, _forget_client, id(client))
    return handle


_client_handles = {}


def _forget_client(client_id):
    for handle in _client_handles.pop(client_id, {}).values():
        unregister(handle)


def check_client(client):
    from dfa.client import Client
    if client is None:
        raise InvalidArgumentError("INVALID_ARGUMENT", "client: None; pass a dfa.Client "
                                   "(dfa.Client('host:port')) or use dfa.torch.Attention(client)")
    if not isinstance(client, Client):
        raise InvalidArgumentError("INVALID_ARGUMENT", "client: expected a dfa.Client, got %s"
                                   % type(client).__name__)
