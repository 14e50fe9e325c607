"""Client and Session: the C++ client library (client/client.h) through the extension dfa._dfa.

    client = dfa.Client("127.0.0.1:7000")
    with client.create_session(dfa.AttentionSpec(batch=1, seq_len=4096, q_heads=8,
                                                 head_dim=64, dtype="bf16")) as s:
        o, lse = s.forward(q, k, v)        # uploads Q, K, V straight to the owning workers
        dq, dk, dv = s.backward(do)        # uploads ONLY dO: the workers kept Q, K, V, O, LSE

Tensor bytes never pass through the coordinator: each shard goes to the worker that owns it,
all workers in parallel, by shared memory for workers on this host and gRPC chunks (CRC32C)
otherwise (path="auto"; "grpc" or "shm" force one). Inputs are numpy arrays or torch CPU
tensors, C-contiguous, of the spec's dtype (bf16: torch.bfloat16 or uint16 bit patterns); they
are read in place (no copy). Outputs are numpy arrays that own the bytes the download wrote.

Threads: a Client may be shared between threads. A Session is for one thread at a time.
Every call releases the GIL while it waits; Ctrl-C in the main thread cancels a running job.
Lifetime: a Session is released by release(), by leaving its `with` block, or when garbage
collected; the coordinator's session TTL covers a crashed client.
Errors: dfa.DfaError with the status code's name; dfa.InvalidArgumentError (a ValueError)
naming the argument or field for bad inputs, before anything is sent.
fork(): gRPC connections do not survive it (a call in the child hangs and corrupts the
parent's streams, losing the parent's client lease and sessions). In a fork()ed child of a
process that made a Client, every call on the parent's Clients and Sessions, and a new Client,
is FAILED_PRECONDITION before anything is sent, and the parent's objects are never released
from the child; the parent's lease and sessions stay the parent's. Use Clients in processes
that are started, not forked (multiprocessing's 'spawn' or 'forkserver'); each holds its own
lease.
"""

import ctypes
import os
import threading
import weakref

from dfa import _dfa
from dfa.spec import DO, DQ, DK, DV, K, LSE, O, Q, V, AttentionSpec  # noqa: F401

_SCHEDULES = ("", "balanced", "ring", "distflash", "zigzag", "heads", "auto")


# The process whose Clients and Sessions these are (the first to make a Client), and the live
# ones, pinned in a fork()ed child so that none is destroyed there (their destructors would call
# the cluster through the parent's connections).
_owner_pid = None
_live = weakref.WeakSet()


def _pin_after_fork():
    for obj in list(_live):
        native = getattr(obj, "_c", None) or getattr(obj, "_s", None)
        if native is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(native))


os.register_at_fork(after_in_child=_pin_after_fork)


def _forked_child():
    return _owner_pid is not None and os.getpid() != _owner_pid


def _check_process(what):
    """FAILED_PRECONDITION naming `what` in a fork()ed child of the process that made Clients."""
    if _forked_child():
        from dfa.errors import DfaError
        raise DfaError("FAILED_PRECONDITION",
                       "%s: this process (%d) was fork()ed from %d, which uses the dfa client; "
                       "gRPC connections do not survive fork() (using them here would break the "
                       "parent's client lease and sessions): use the Client in a process that is "
                       "started, not forked (multiprocessing 'spawn' or 'forkserver')"
                       % (what, os.getpid(), _owner_pid))


def _check_schedule(schedule):
    if schedule not in _SCHEDULES:
        from dfa.errors import InvalidArgumentError
        raise InvalidArgumentError("INVALID_ARGUMENT", "schedule: %r is not one of %s"
                                   % (schedule, ", ".join(_SCHEDULES[1:])))


class Client:
    """Connection to a dfa-coordinator (host:port). Does not wait for it; calls do.

    token: sent as 'authorization: Bearer <token>' (coordinator --auth_token).
    tls_cert, tls_key, tls_ca: PEM files for mTLS with the coordinator and the workers (all
    three or none); tls_server_name: the name the servers' certificates are checked against.
    rpc_timeout: deadline (s) of each control call and each transfer. job_timeout: of a job.
    nccl_init_timeout, nccl_transfer_timeout: the NCCL device path's bounds (s): every worker of
    the group joined by then, one transfer's NCCL part (dfa.device_io; nccl_tensor_io()).
    """

    def __init__(self, coordinator, client_id="", token="", tls_cert="", tls_key="", tls_ca="",
                 tls_server_name="", rpc_timeout=30.0, job_timeout=1800.0,
                 nccl_init_timeout=60.0, nccl_transfer_timeout=60.0):
        global _owner_pid
        if not isinstance(coordinator, str):
            from dfa.errors import InvalidArgumentError
            raise InvalidArgumentError("INVALID_ARGUMENT", "coordinator: expected a 'host:port' "
                                       "string, got %s" % type(coordinator).__name__)
        _check_process("dfa.Client")
        if _owner_pid is None:
            _owner_pid = os.getpid()
        _live.add(self)
        self._c = _dfa.Client.connect(coordinator, client_id=client_id or "",
                                      rpc_timeout=float(rpc_timeout),
                                      job_timeout=float(job_timeout), tls_cert=tls_cert or "",
                                      tls_key=tls_key or "", tls_ca=tls_ca or "",
                                      tls_server_name=tls_server_name or "", token=token or "")
        for name, value in (("nccl_init_timeout", nccl_init_timeout),
                            ("nccl_transfer_timeout", nccl_transfer_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                from dfa.errors import InvalidArgumentError
                raise InvalidArgumentError("INVALID_ARGUMENT", "%s: must be a positive number "
                                           "of seconds, got %r" % (name, value))
        self._nccl_timeouts = (float(nccl_init_timeout), float(nccl_transfer_timeout))
        self._nccl_io = None
        self._nccl_lock = threading.Lock()

    coordinator = property(lambda self: self._c.coordinator)
    client_id = property(lambda self: self._c.client_id)

    def list_workers(self):
        """The coordinator's workers, as dicts (worker_id, address, host, backend, alive, ...)."""
        _check_process("Client.list_workers")
        return self._c.list_workers()

    def status(self):
        """ClusterStatus as a dict (live_workers, sessions, jobs_running, ...)."""
        _check_process("Client.status")
        return self._c.status()

    def get_job(self, job_id):
        _check_process("Client.get_job")
        return self._c.get_job(job_id)

    def cancel_job(self, job_id):
        _check_process("Client.cancel_job")
        return self._c.cancel_job(job_id)

    def wait_ready(self, workers=1, timeout=30.0):
        """Blocks until the coordinator answers and lists at least `workers` live workers."""
        import time
        from dfa.errors import DfaError, DeadlineExceededError
        _check_process("Client.wait_ready")
        deadline = time.monotonic() + timeout
        self._c.wait_for_coordinator(timeout)
        while True:
            try:
                alive = sum(1 for w in self.list_workers() if w["alive"])
                if alive >= workers:
                    return alive
                last = "%d of %d workers alive" % (alive, workers)
            except DfaError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise DeadlineExceededError("DEADLINE_EXCEEDED", "cluster %s not ready after "
                                            "%.1f s: %s" % (self.coordinator, timeout, last))
            time.sleep(0.05)

    def create_session(self, spec=None, num_workers=0, schedule="", ttl_seconds=0, **spec_fields):
        """A Session for `spec` (an AttentionSpec, or its fields as keywords).

        num_workers 0: all live workers. schedule: "" (the coordinator's default, balanced),
        "ring", "distflash", "zigzag", "balanced", "heads" or "auto".
        """
        if spec is None:
            spec = AttentionSpec(**spec_fields)
        elif spec_fields:
            raise TypeError("create_session: pass either spec or its fields, not both")
        if not isinstance(spec, AttentionSpec):
            raise TypeError("spec: expected dfa.AttentionSpec, got %s" % type(spec).__name__)
        _check_schedule(schedule)
        _check_process("Client.create_session")
        s = self._c.create_session(**spec.as_dict(), num_workers=num_workers, schedule=schedule,
                                   ttl_seconds=ttl_seconds)
        return Session(self, spec, s)

    def nccl_tensor_io(self):
        """This client's dfa._dfa.NcclTensorIo (the NCCL device path, dfa.device_io), made at the
        first call and kept: its group is reused across sessions and steps. UNIMPLEMENTED where
        the extension has no NCCL path."""
        _check_process("Client.nccl_tensor_io")
        with self._nccl_lock:
            if self._nccl_io is None:
                init, transfer = self._nccl_timeouts
                self._nccl_io = _dfa.NcclTensorIo(self._c, init_timeout=init,
                                                  transfer_timeout=transfer)
            return self._nccl_io

    def submit_job(self, session_id, kind):
        """SubmitJob on `session_id` as this client (a session of another client is refused)."""
        _check_process("Client.submit_job")
        return self._c.submit_job(session_id, kind)

    def close(self):
        """Nothing to free eagerly (channels close when the last Session goes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Session:
    """One session: its placement (`shards`), and the transfers and jobs on it."""

    def __init__(self, client, spec, native):
        self.client = client
        self.spec = spec
        self._s = native
        _live.add(self)
        self.id = native.id
        self.shards = native.shards
        self.ranges = [s["owned"] for s in self.shards]
        self.heads = [(s["q_heads"], s["kv_heads"]) for s in self.shards]
        self.last_jobs = {}         # "forward"/"backward" -> final job dict
        self.uploaded_bytes = {}    # TensorKind -> bytes sent to workers
        self.released = False

    @property
    def num_workers(self):
        return len(self.shards)

    def _check_open(self):
        _check_process("session %s" % self.id)
        if self.released:
            from dfa.errors import DfaError
            raise DfaError("FAILED_PRECONDITION", "session: %s was released" % self.id)

    def upload(self, kind, array, path="auto", chunk_bytes=4 << 20):
        """Sends the rows each worker owns of whole tensor `array` (Q, K, V or dO)."""
        self._check_open()
        st = self._s.upload(kind, array, path=path, chunk_bytes=int(chunk_bytes))
        self.uploaded_bytes[kind] = self.uploaded_bytes.get(kind, 0) + st["bytes"]
        return st["bytes"]

    def download(self, kind, path="auto", chunk_bytes=4 << 20):
        """Gathers the whole tensor of `kind` (O, LSE, dQ, dK, dV) from the workers."""
        self._check_open()
        return self._s.download(kind, path=path, chunk_bytes=int(chunk_bytes))

    def upload_chunk(self, rank, kind, batch_index, begin, end, data, crc32c):
        """Sends one caller-made chunk to the worker of `rank` (tests: malformed chunks)."""
        self._check_open()
        return self._s.upload_chunk(rank, kind, batch_index, begin, end, bytes(data), crc32c)

    def generate_inputs(self, seed, with_grad_output=True):
        self._check_open()
        self._s.generate_inputs(seed, with_grad_output)

    def run(self, kind):
        """Submits a job ("forward" | "backward") and follows it to its end; the final job dict.
        Ctrl-C cancels the job."""
        self._check_open()
        job = self._s.run(self.client._c, kind)
        self.last_jobs[kind] = job
        return job

    def submit(self, kind):
        self._check_open()
        return self._s.submit(kind)

    def watch(self, job_id):
        _check_process("session %s" % self.id)
        return self._s.watch(job_id)

    def forward(self, q, k, v, download_lse=True):
        """Uploads Q, K, V, runs the forward job, returns (O, LSE or None). All three arrays are
        checked before anything is sent."""
        for kind, a in ((Q, q), (K, k), (V, v)):
            self._s.check_input(kind, a)
        for kind, a in ((Q, q), (K, k), (V, v)):
            self.upload(kind, a)
        self.run("forward")
        o = self.download(O)
        return o, (self.download(LSE) if download_lse else None)

    def backward(self, do):
        """Uploads ONLY dO, runs the backward job, returns (dQ, dK, dV)."""
        self._s.check_input(DO, do)
        self.upload(DO, do)
        self.run("backward")
        return self.download(DQ), self.download(DK), self.download(DV)

    def release(self):
        """Frees the session on the cluster. Idempotent. In a fork()ed child: nothing (the
        session is the parent's)."""
        if self.released or _forked_child():
            return
        self.released = True
        self._s.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        from dfa.errors import DfaError
        try:
            self.release()
        except DfaError:
            if exc[0] is None:
                raise
