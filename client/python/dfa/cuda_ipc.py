"""The same-host GPU path for PyTorch: hand CUDA tensors to a session's cuda workers by CUDA IPC
(Worker.DeviceTransfer; the C++ client/cuda_tensor_io.h through the extension), so nothing is
copied through host memory.

    from dfa import cuda_ipc
    cuda_ipc.upload_device(s, dfa.Q, q)          # q: torch CUDA tensor [B, S, Hq, D], any strides
    cuda_ipc.upload_device(s, dfa.K, k); cuda_ipc.upload_device(s, dfa.V, v)
    s.run("forward")
    cuda_ipc.download_device(s, dfa.O, o)        # o: preallocated CUDA tensor, written in place

Available where the extension was built with CUDA (a repository build with nvcc;
dfa._dfa.HAVE_CUDA); `pip install client/python` builds the CPU client unless given
-C cmake.define.DFA_WITH_CUDA=ON. Tensors: memory of PyTorch's default CUDA caching allocator,
heads and head_dim dense, rows and batch any non-overlapping strides; LSE is fp32 [B, Hq, S].
Keep the tensors alive while the session may use them (the workers keep them mapped until
release). Uploads synchronise the tensor's device first; downloads return after the workers'
copies completed. Errors: dfa.InvalidArgumentError naming the tensor field, DfaError with the
worker's status (FAILED_PRECONDITION: another host or a cpu worker).
"""

from dfa import _dfa
from dfa.errors import DfaError, InvalidArgumentError

_DTYPES = {"torch.float32": "f32", "torch.bfloat16": "bf16", "torch.float16": "f16"}


def available():
    return bool(_dfa.HAVE_CUDA)


def _args(tensor):
    if not available():
        raise DfaError("UNIMPLEMENTED", "dfa.cuda_ipc: this build of the extension has no CUDA "
                       "path (built without CUDA)")
    if type(tensor).__name__ != "Tensor" or not getattr(tensor, "is_cuda", False):
        raise InvalidArgumentError("INVALID_ARGUMENT", "tensor: expected a CUDA torch.Tensor, "
                                   "got %s" % getattr(tensor, "device", type(tensor).__name__))
    dtype = _DTYPES.get(str(tensor.dtype))
    if dtype is None:
        raise InvalidArgumentError("INVALID_ARGUMENT", "tensor.dtype: %s is not float32, "
                                   "bfloat16 or float16" % tensor.dtype)
    return tensor.data_ptr(), dtype, list(tensor.shape), list(tensor.stride())


def upload_device(session, kind, tensor):
    """Hands Q, K, V or dO (a whole-sequence CUDA tensor) to the workers. Returns bytes moved."""
    args = _args(tensor)
    session._check_open()
    return _dfa.upload_device(session._s, kind, *args)


def download_device(session, kind, tensor):
    """Writes `kind` of every worker's rows into the preallocated CUDA tensor. Returns bytes."""
    args = _args(tensor)
    session._check_open()
    return _dfa.download_device(session._s, kind, *args)
