"""The device paths of dfa.torch: a layer's CUDA tensors go to the session's workers and its
outputs come back into CUDA tensors, device to device, never through host memory — by CUDA IPC
to workers on this host (dfa._dfa.DeviceAttentionJob, the C++ client/device_attention_job.h) or
by NCCL to workers on any host (dfa/torch/_nccl_job.py over the client's
dfa._dfa.NcclTensorIo, client/nccl_tensor_io.h).

Whether a layer takes a device path (_LayerJob's `path`): "ipc" always (an error when it cannot
be used); "auto" for CUDA tensors when the extension has CUDA, falling back to the host paths
(shared memory, gRPC) for good when the workers refuse it — a cpu worker answers
FAILED_PRECONDITION before anything moved; "shm" / "grpc" the host paths.

Which device path (_LayerJob's `device_path`, kind()): "ipc"; "nccl"; "auto" — CUDA IPC when
every live worker is on this host, else NcclJob with the C++ client's ChooseDevicePath per
session (IPC when every shard of that session is on this host, NCCL otherwise); a layer on IPC
whose workers answer that they are on another host moves to NCCL (where the extension has it).

IPC: the workers map each allocation once (the handle of PyTorch's whole cudaMalloc block, so
the caching allocator's sub-ranges share it) and keep it mapped for the session's life: a
training loop that reuses its memory opens nothing after its first steps. NCCL: one
NcclTensorIo per dfa.Client, its group joined by the first transfer and reused by every layer's
session and step on the same workers.
"""

from dfa import _dfa
from dfa.device_io import nccl_available
from dfa.errors import DfaError
from dfa.torch._nccl_job import NcclJob

_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}

# FAILED_PRECONDITION messages of workers that cannot take a device path at all: a cpu worker
# refusing CUDA IPC (worker/gpu/device_transfer.h), the coordinator refusing an NCCL group for
# cpu workers (coordinator/client_groups.cc); the layer falls back to the host paths under
# path="auto". _OTHER_HOST: a worker on another host refusing CUDA IPC (NCCL can serve it).
_OTHER_HOST = "host_id = "
_REFUSALS = (_OTHER_HOST, "cpu backend", "not NCCL (cpu workers)")


def available():
    return bool(getattr(_dfa, "HAVE_CUDA", False))


def wants(path, tensor):
    """Whether a layer with `path` moves `tensor` by CUDA IPC."""
    if path == "ipc":
        return True
    return path == "auto" and tensor.is_cuda and available()


def refused(error):
    """A DfaError saying the workers cannot take this device path (so "auto" falls back)."""
    return (isinstance(error, DfaError) and error.code == "FAILED_PRECONDITION" and
            any(r in error.details for r in _REFUSALS))


def other_host(error):
    """A CUDA IPC refusal because a worker is on another host (NCCL can serve it)."""
    return refused(error) and _OTHER_HOST in error.details and nccl_available()


def kind(client, device_path):
    """"ipc" or "nccl" (NcclJob, strict) or "auto-nccl" (NcclJob choosing per session) for a
    new layer job with `device_path` (see the module docstring)."""
    if device_path != "auto":
        return device_path
    if not nccl_available():
        return "ipc"
    here = _dfa.host_name()
    live = [w for w in client.list_workers() if w["alive"]]
    if live and all(w["host"] == here for w in live):
        return "ipc"
    return "auto-nccl"


def ref(t):
    """(data_ptr, dtype, shape, strides) of a CUDA tensor, as the extension takes it."""
    return (t.data_ptr(), _DTYPES[str(t.dtype)], list(t.shape), list(t.stride()))


def check(name, t, path, device_path="auto"):
    """A clear error before anything is sent when path="ipc" cannot work for `t`."""
    if not available():
        raise DfaError("UNIMPLEMENTED", "path='ipc': this build of dfa._dfa has no CUDA path "
                       "(built without CUDA); use path='auto'", name)
    if not t.is_cuda:
        from dfa.errors import InvalidArgumentError
        raise InvalidArgumentError("INVALID_ARGUMENT", "%s: path='ipc' (device_path=%r) needs a "
                                   "CUDA tensor, got one on %s" % (name, device_path, t.device))


def new_job(client, spec, options, job_kind="ipc"):
    if job_kind != "ipc":
        return NcclJob(client, spec, options, auto=job_kind == "auto-nccl")
    return _dfa.DeviceAttentionJob(client._c, spec.as_dict(),
                                   num_workers=options["num_workers"],
                                   schedule=options["schedule"],
                                   max_retries=options["max_retries"],
                                   recovery_timeout=options["recovery_timeout"])
