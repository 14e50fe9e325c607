"""The same-host GPU path of dfa.torch: a layer's CUDA tensors go to the session's workers and
its outputs come back by CUDA IPC (dfa._dfa.DeviceAttentionJob, the C++
client/device_attention_job.h), device to device, never through host memory.

Which path a layer takes (_LayerJob's `path`): "ipc" always this one (an error when it cannot
be used); "auto" this one for CUDA tensors when the extension has CUDA, falling back to the
host paths (shared memory, gRPC) for good when the workers refuse it — a cpu worker or one on
another host answers FAILED_PRECONDITION before anything moved; "shm" / "grpc" the host paths.

The workers map each allocation once (the handle of PyTorch's whole cudaMalloc block, so the
caching allocator's sub-ranges share it) and keep it mapped for the session's life: a training
loop that reuses its memory opens nothing after its first steps.
"""

from dfa import _dfa
from dfa.errors import DfaError

_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}

# FAILED_PRECONDITION messages of a worker that cannot take CUDA IPC at all (worker/gpu/
# device_transfer.h): the layer falls back to the host paths under path="auto".
_REFUSALS = ("host_id = ", "cpu backend")


def available():
    return bool(getattr(_dfa, "HAVE_CUDA", False))


def wants(path, tensor):
    """Whether a layer with `path` moves `tensor` by CUDA IPC."""
    if path == "ipc":
        return True
    return path == "auto" and tensor.is_cuda and available()


def refused(error):
    """A DfaError saying the workers cannot take CUDA IPC (so "auto" falls back)."""
    return (isinstance(error, DfaError) and error.code == "FAILED_PRECONDITION" and
            any(r in error.details for r in _REFUSALS))


def ref(t):
    """(data_ptr, dtype, shape, strides) of a CUDA tensor, as the extension takes it."""
    return (t.data_ptr(), _DTYPES[str(t.dtype)], list(t.shape), list(t.stride()))


def check(name, t, path):
    """A clear error before anything is sent when path="ipc" cannot work for `t`."""
    if not available():
        raise DfaError("UNIMPLEMENTED", "path='ipc': this build of dfa._dfa has no CUDA path "
                       "(built without CUDA); use path='auto'", name)
    if not t.is_cuda:
        from dfa.errors import InvalidArgumentError
        raise InvalidArgumentError("INVALID_ARGUMENT", "%s: path='ipc' needs a CUDA tensor, got "
                                   "one on %s" % (name, t.device))


def new_job(client, spec, options):
    return _dfa.DeviceAttentionJob(client._c, spec.as_dict(),
                                   num_workers=options["num_workers"],
                                   schedule=options["schedule"],
                                   max_retries=options["max_retries"],
                                   recovery_timeout=options["recovery_timeout"])
