"""The same-host GPU path for PyTorch: hand CUDA tensors to a session's cuda workers by CUDA IPC
(Worker.DeviceTransfer, docs/gpu-service.md), so nothing is copied through host memory.

    from dfa import cuda_ipc
    cuda_ipc.upload_device(s, dfa.Q, q)          # q: torch CUDA tensor [B, S, Hq, D], any strides
    cuda_ipc.upload_device(s, dfa.K, k); cuda_ipc.upload_device(s, dfa.V, v)
    s.run(dfa.client.coordinator_pb2.JOB_FORWARD)
    cuda_ipc.download_device(s, dfa.O, o)        # o: preallocated CUDA tensor, written in place

Tensors: memory of PyTorch's default CUDA caching allocator (cudaMalloc blocks), on any GPU of
this host; heads and head_dim dense (stride(2) == head_dim, stride(3) == 1), rows and batch any
non-overlapping strides; LSE is fp32 [B, Hq, S]; dQ/dK/dV may be fp32 (unrounded gradients).
The handle comes from ``storage._share_cuda_()``, as torch.multiprocessing uses it. Keep the
tensors alive while the session may use them (the workers keep them mapped until release).
Ordering: uploads call torch.cuda.synchronize(device) first; downloads return after the workers'
copies completed. Errors: ValueError (not a CUDA tensor, wrong rank or sequence length),
DfaError with the worker's status (FAILED_PRECONDITION: another host or a cpu worker;
INVALID_ARGUMENT naming the tensor field; UNAVAILABLE: the handle cannot be opened).
"""

from dfa import _proto
from dfa.errors import DfaError
from dfa.spec import DK, DO, DV, K, KIND_NAMES, LSE, Q, V

attention_pb2, _, _, worker_pb2, _ = _proto.load()

_DTYPE_CODES = {"torch.float32": attention_pb2.DTYPE_F32, "torch.bfloat16": attention_pb2.DTYPE_BF16,
                "torch.float16": attention_pb2.DTYPE_F16}


def host_id():
    """This host's boot id: what the workers compare to know the client shares their host."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def make_requests(spec, kind, shape, strides, dtype_code, element_size, handle, offset, device,
                  ranges, upload, host, heads=None):
    """DeviceTransferRequests (session ids unset) for `ranges` [(begin, end)] of a whole-sequence
    tensor whose element [0, ...] is at byte `offset` of the allocation exported as `handle`;
    `heads` (h_begin, h_end) of this kind's heads (None: all) — a head-split shard's slice.
    Pure (tests use it). ValueError naming the field for a wrong rank or sequence length."""
    row_dim = 2 if kind == LSE else 1
    head_dim_index = 1 if kind == LSE else 2
    dims = 3 if kind == LSE else 4
    if len(shape) != dims or len(strides) != dims:
        raise ValueError("tensor: %s needs %d dimensions, got shape %s strides %s"
                         % (KIND_NAMES.get(kind, kind), dims, tuple(shape), tuple(strides)))
    if shape[row_dim] != spec.seq_len:
        raise ValueError("tensor.shape[%d]: %d differs from seq_len = %d"
                         % (row_dim, shape[row_dim], spec.seq_len))
    h0, h1 = heads if heads is not None else (0, shape[head_dim_index])
    if not 0 <= h0 < h1 <= shape[head_dim_index]:
        raise ValueError("heads: [%d, %d) outside the tensor's %d heads" % (h0, h1, shape[head_dim_index]))
    out = []
    for b, e in ranges:
        sizes = [e - b if i == row_dim else int(n) for i, n in enumerate(shape)]
        sizes[head_dim_index] = h1 - h0
        ref = worker_pb2.DeviceTensorRef(
            cuda_ipc_handle=bytes(handle),
            offset=offset + (b * strides[row_dim] + h0 * strides[head_dim_index]) * element_size,
            dtype=dtype_code, device=device,
            shape=sizes,
            strides=[int(s) for s in strides])
        out.append(worker_pb2.DeviceTransferRequest(
            kind=kind, rows=attention_pb2.RowRange(begin=b, end=e), upload=upload, tensor=ref,
            host_id=host))
    return out


def _kind_heads(kind, heads):
    """The (begin, end) of `kind`'s heads in one shard's ((q range), (kv range))."""
    return heads[1] if kind in (K, V, DK, DV) else heads[0]


def _share(tensor):
    """(64-byte handle, byte offset of tensor's first element in the allocation, device)."""
    info = tensor.untyped_storage()._share_cuda_()
    device, handle, storage_offset = info[0], info[1], info[3]
    return bytes(handle), storage_offset + tensor.storage_offset() * tensor.element_size(), device


def _transfer(session, kind, tensor, upload):
    import torch  # only for callers of this module
    session._check_open()
    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise ValueError("tensor: expected a CUDA torch.Tensor, got %s" % type(tensor).__name__)
    code = _DTYPE_CODES.get(str(tensor.dtype))
    if code is None:
        raise ValueError("tensor.dtype: %s is not float32, bfloat16 or float16" % tensor.dtype)
    if upload:
        torch.cuda.synchronize(tensor.device)
    handle, offset, device = _share(tensor)
    host = host_id()
    per_rank = [make_requests(session.spec, kind, tuple(tensor.shape), tuple(tensor.stride()),
                              code, tensor.element_size(), handle, offset, device,
                              session.ranges[rank], upload, host,
                              _kind_heads(kind, session.heads[rank]))
                for rank in range(session.num_workers)]

    def one(rank):
        shard = session.shards[rank]
        stub = session.client.worker_stub(shard.address)
        moved = 0
        for req in per_rank[rank]:
            req.session_id = session.id
            req.client_id = session.client.client_id
            try:
                moved += stub.DeviceTransfer(req, timeout=session.client.rpc_timeout).bytes
            except Exception as e:  # grpc.RpcError
                raise DfaError.from_rpc(e, "DeviceTransfer %s with worker %d (%s)"
                                        % (KIND_NAMES[kind], rank, shard.address)) from None
        return moved

    return sum(session._parallel(one))


def upload_device(session, kind, tensor):
    """Hands Q, K, V or dO (a whole-sequence CUDA tensor) to the workers. Returns bytes moved."""
    if kind not in (Q, K, V, DO):
        raise ValueError("kind: uploads take Q, K, V or dO, got %s" % KIND_NAMES.get(kind, kind))
    return _transfer(session, kind, tensor, True)


def download_device(session, kind, tensor):
    """Writes `kind` of every worker's rows into the preallocated CUDA tensor. Returns bytes."""
    return _transfer(session, kind, tensor, False)
