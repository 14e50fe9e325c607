"""CUDA tensors to and from a session's GPU workers by a device path, never through host memory:
CUDA IPC to workers on this host (dfa.cuda_ipc, client/cuda_tensor_io.h) or NCCL to workers on
any host (client/nccl_tensor_io.h: this process joins the session's workers as one extra rank
of an NCCL communicator bootstrapped through the coordinator).

    from dfa import device_io
    device_io.upload_device(s, dfa.Q, q, device_path="auto")   # ... K, V: torch CUDA tensors
    s.run("forward")
    device_io.download_device(s, dfa.O, o, device_path="auto")  # o: preallocated, written

device_path: "auto" — CUDA IPC when every shard's worker is on this host, NCCL otherwise
(choose_device_path: the shards' host names against this host's); "ipc"; "nccl". Anything else
is dfa.InvalidArgumentError naming device_path.

NCCL: one dfa._dfa.NcclTensorIo per dfa.Client (Client.nccl_tensor_io(), made at the first NCCL
transfer), so its group is joined once and reused by every later session and step whose
workers are all in it; a failure (a worker refused or lost, a peer that never joined within
the client's nccl_init_timeout) drops the group and the next transfer joins a new one. The
NCCL path needs dense tensors (.contiguous()) of the session's dtype (LSE fp32), sessions whose
shards hold all heads, cuda/cudnn workers that can reach this host, and a CUDA device here
(FAILED_PRECONDITION naming cudaGetDeviceCount's answer otherwise). Builds without CUDA and
NCCL raise UNIMPLEMENTED naming what is missing (dfa._dfa.HAVE_NCCL).
"""

from dfa import _dfa
from dfa.errors import DfaError, InvalidArgumentError

DEVICE_PATHS = ("auto", "ipc", "nccl")
_DTYPES = {"torch.float32": "f32", "torch.bfloat16": "bf16", "torch.float16": "f16"}


def nccl_available():
    """Whether this build of the extension has the NCCL path."""
    return bool(getattr(_dfa, "HAVE_NCCL", False))


def check_device_path(device_path):
    """InvalidArgumentError naming device_path unless it is "auto", "ipc" or "nccl"."""
    if not isinstance(device_path, str) or device_path not in DEVICE_PATHS:
        raise InvalidArgumentError("INVALID_ARGUMENT", "device_path: must be 'auto', 'ipc' or "
                                   "'nccl', got %r" % (device_path,))
    return device_path


def choose_device_path(session, this_host=None):
    """"ipc" when every shard of `session` (a dfa.Session, or its shards: dicts with "host") is
    on `this_host` (default: this host's name), else "nccl" (ChooseDevicePath of the C++
    client)."""
    shards = session.shards if hasattr(session, "shards") else session
    return _dfa.choose_device_path(list(shards), this_host)


def resolve(session, device_path):
    """The path a transfer on `session` takes for `device_path` ("ipc" or "nccl")."""
    check_device_path(device_path)
    if device_path != "auto":
        return device_path
    if not nccl_available():
        return "ipc"
    return choose_device_path(session)


def _args(tensor, device_path):
    if type(tensor).__name__ != "Tensor" or not getattr(tensor, "is_cuda", False):
        raise InvalidArgumentError("INVALID_ARGUMENT", "tensor: device_path=%r needs a CUDA "
                                   "torch.Tensor, got one on %s"
                                   % (device_path, getattr(tensor, "device",
                                                           type(tensor).__name__)))
    dtype = _DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise InvalidArgumentError("INVALID_ARGUMENT", "tensor.dtype: %s is not float32, "
                                   "bfloat16 or float16" % tensor.dtype)
    return tensor.data_ptr(), dtype, list(tensor.shape), list(tensor.stride())


def _move(session, kind, tensor, device_path, upload):
    check_device_path(device_path)
    args = _args(tensor, device_path)
    session._check_open()
    path = resolve(session, device_path)
    if path == "ipc":
        if not _dfa.HAVE_CUDA:
            raise DfaError("UNIMPLEMENTED", "device_path='ipc': this build of dfa._dfa has no "
                           "CUDA path (built without CUDA)")
        fn = _dfa.upload_device if upload else _dfa.download_device
        return fn(session._s, kind, *args)
    io = session.client.nccl_tensor_io()
    st = (io.upload if upload else io.download)(session._s, kind, *args)
    return st["bytes"]


def upload_device(session, kind, tensor, device_path="auto"):
    """Hands Q, K, V or dO (a whole-sequence CUDA tensor) to the workers. Returns bytes moved."""
    return _move(session, kind, tensor, device_path, True)


def download_device(session, kind, tensor, device_path="auto"):
    """Writes `kind` (O, LSE, dQ, dK, dV) of every worker's rows into the preallocated CUDA
    tensor. Returns bytes moved."""
    return _move(session, kind, tensor, device_path, False)


def nccl_group(client):
    """The NCCL group `client` uses (dict: group_id, client_rank, size, workers), None before
    its first NCCL transfer or after a failure."""
    io = client._nccl_io
    return None if io is None else io.group
