"""The Python client of the DistFlashAttn Service: coordinator control plane and the worker
data plane, over the real gRPC protocol (proto/dfa/v1).

    client = dfa.Client("127.0.0.1:7000")
    with client.create_session(dfa.AttentionSpec(batch=1, seq_len=4096, q_heads=8,
                                                 head_dim=64, dtype="bf16")) as s:
        o, lse = s.forward(q, k, v)        # uploads Q, K, V straight to the owning workers
        dq, dk, dv = s.backward(do)        # uploads ONLY dO: the workers kept Q, K, V, O, LSE

Tensor bytes never pass through the coordinator: each shard goes to the worker that owns it
(ShardPlacement.address), one gRPC stream per worker, all workers in parallel.

Threads: a Client may be shared between threads (gRPC channels and stubs are thread-safe). A
Session is for one thread at a time; it runs one thread per worker inside a transfer.
Lifetime: a Session is released by release(), by leaving its `with` block, or when garbage
collected (best effort); the coordinator's session TTL covers a crashed client.
Errors: ValueError naming the field for bad inputs (nothing sent); DfaError for a gRPC status
from the service; JobFailedError for a failed or cancelled job.
"""

import concurrent.futures
import itertools
import os
import socket
import threading
import time
import weakref

import grpc
import numpy as np

from dfa import _proto
from dfa import shards as _shards
from dfa.errors import DfaError, JobFailedError, status_code
from dfa.spec import (DO, DQ, DK, DV, K, KIND_NAMES, LSE, O, Q, V, AttentionSpec, check_array)

attention_pb2, coordinator_pb2, coordinator_pb2_grpc, worker_pb2, worker_pb2_grpc = _proto.load()

_MAX_MESSAGE = 64 << 20
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                    ("grpc.max_send_message_length", _MAX_MESSAGE),
                    # Each worker gets its own TCP connection: parallel streams never share one.
                    ("grpc.use_local_subchannel_pool", 1)]
_FINAL = (coordinator_pb2.JOB_SUCCEEDED, coordinator_pb2.JOB_FAILED, coordinator_pb2.JOB_CANCELLED)
_ids = itertools.count()
_SCHEDULES = ("", "balanced", "ring", "distflash", "zigzag", "heads", "auto")


def _default_client_id():
    return "dfa-py-%s-%d-%d" % (socket.gethostname(), os.getpid(), next(_ids))


class Client:
    """Connection to a dfa-coordinator (host:port). Does not wait for it; calls do.

    token: sent as 'authorization: Bearer <token>' when the coordinator runs with --auth_token.
    rpc_timeout: deadline (s) of each control call and each transfer stream.
    job_timeout: deadline (s) of a job's whole run (watch).
    """

    def __init__(self, coordinator, client_id=None, token=None, rpc_timeout=30.0,
                 job_timeout=1800.0):
        if not isinstance(coordinator, str) or ":" not in coordinator:
            raise ValueError("coordinator: expected host:port, got %r" % (coordinator,))
        self.coordinator = coordinator
        self.client_id = client_id or _default_client_id()
        self.rpc_timeout = float(rpc_timeout)
        self.job_timeout = float(job_timeout)
        self._metadata = (("authorization", "Bearer " + token),) if token else None
        self._channel = grpc.insecure_channel(coordinator, options=_CHANNEL_OPTIONS)
        self.stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._worker_channels = {}
        self._lock = threading.Lock()

    # -- control plane -------------------------------------------------------------------------
    def _call(self, what, method, request, timeout=None):
        try:
            return method(request, timeout=timeout or self.rpc_timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise DfaError.from_rpc(e, what) from None

    def wait_ready(self, workers=1, timeout=30.0):
        """Blocks until the coordinator lists at least `workers` live workers."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                alive = sum(w.alive for w in self.list_workers())
                if alive >= workers:
                    return alive
                last = "%d of %d workers alive" % (alive, workers)
            except DfaError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise DfaError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               "cluster not ready after %.1f s: %s" % (timeout, last),
                               "wait_ready")
            time.sleep(0.05)

    def list_workers(self):
        return list(self._call("ListWorkers", self.stub.ListWorkers,
                               coordinator_pb2.ListWorkersRequest()).workers)

    def status(self):
        return self._call("GetStatus", self.stub.GetStatus, coordinator_pb2.GetStatusRequest())

    def get_job(self, job_id):
        return self._call("GetJob", self.stub.GetJob,
                          coordinator_pb2.GetJobRequest(job_id=job_id, client_id=self.client_id))

    def cancel_job(self, job_id):
        return self._call("CancelJob", self.stub.CancelJob,
                          coordinator_pb2.GetJobRequest(job_id=job_id, client_id=self.client_id))

    def create_session(self, spec=None, num_workers=0, schedule="", ttl_seconds=0, **spec_fields):
        """Creates a session for `spec` (an AttentionSpec, or its fields as keywords).

        num_workers 0: all live workers. schedule: "" (coordinator default: balanced), "ring",
        "distflash", "zigzag", "balanced", "heads" (heads split across workers: each holds all
        rows of its heads; the scatter/gather slices heads) or "auto" (the cheaper of balanced
        and heads in the planner's cost model). Errors: ValueError for a bad spec or option;
        DfaError INVALID_ARGUMENT (the coordinator's limits), RESOURCE_EXHAUSTED (won't fit).
        """
        if spec is None:
            spec = AttentionSpec(**spec_fields)
        elif spec_fields:
            raise ValueError("create_session: pass either spec or its fields, not both")
        if not isinstance(spec, AttentionSpec):
            raise ValueError("spec: expected dfa.AttentionSpec, got %s" % type(spec).__name__)
        spec.validate()
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError("num_workers: must be an integer >= 0, got %r" % (num_workers,))
        if schedule not in _SCHEDULES:
            raise ValueError("schedule: %r is not one of %s" % (schedule, ", ".join(_SCHEDULES[1:])))
        if not isinstance(ttl_seconds, int) or ttl_seconds < 0:
            raise ValueError("ttl_seconds: must be an integer >= 0, got %r" % (ttl_seconds,))
        req = coordinator_pb2.CreateSessionRequest(
            spec=spec.to_proto(attention_pb2), num_workers=num_workers, schedule=schedule,
            client_id=self.client_id, ttl_seconds=ttl_seconds)
        info = self._call("CreateSession", self.stub.CreateSession, req)
        return Session(self, spec, info)

    # -- data plane ----------------------------------------------------------------------------
    def worker_stub(self, address):
        """A Worker stub on a channel of its own per worker address (made on first use)."""
        with self._lock:
            ch = self._worker_channels.get(address)
            if ch is None:
                ch = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
                self._worker_channels[address] = ch
            return worker_pb2_grpc.WorkerStub(ch)

    def close(self):
        with self._lock:
            for ch in self._worker_channels.values():
                ch.close()
            self._worker_channels.clear()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _release(stub, metadata, session_id, client_id, timeout):
    try:
        stub.ReleaseSession(coordinator_pb2.ReleaseSessionRequest(session_id=session_id,
                                                                  client_id=client_id),
                            timeout=timeout, metadata=metadata)
    except Exception:  # best effort (finalizer; the coordinator's TTL covers the rest)
        pass


class Session:
    """One session: its placement (`shards`), `plan`, and the transfers and jobs on it."""

    def __init__(self, client, spec, info):
        self.client = client
        self.spec = spec
        self.info = info
        self.id = info.session_id
        self.shards = list(info.shards)
        self.ranges = [[(r.begin, r.end) for r in s.owned] for s in self.shards]
        self.last_jobs = {}         # JobKind -> final Job of the last job of that kind
        self.uploaded_bytes = {}    # TensorKind -> bytes sent to workers (all uploads)
        self.released = False
        try:
            for rank, rs in enumerate(self.ranges):
                _shards.validate_owned(rs, spec.seq_len, "shards[%d].owned" % rank)
            # The heads each shard holds (all of them unless the plan splits heads: "heads").
            self.heads = _shards.head_ranges(self.shards, spec)
            _shards.check_head_cover(self.ranges, self.heads, spec)
        except ValueError as e:
            _release(client.stub, client._metadata, self.id, client.client_id, client.rpc_timeout)
            raise DfaError(grpc.StatusCode.INTERNAL, str(e), "CreateSession placement") from None
        self._finalizer = weakref.finalize(self, _release, client.stub, client._metadata, self.id,
                                           client.client_id, 5.0)

    @property
    def num_workers(self):
        return len(self.shards)

    def _check_open(self):
        if self.released:
            raise ValueError("session: %s was released" % self.id)

    def _parallel(self, fn):
        """Runs fn(rank) for every rank in parallel; raises the first error by rank."""
        if self.num_workers == 1:
            return [fn(0)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=self.num_workers) as ex:
            futs = [ex.submit(fn, r) for r in range(self.num_workers)]
            return [f.result() for f in futs]

    # -- transfers -----------------------------------------------------------------------------
    def upload(self, kind, array, chunk_bytes=_shards.DEFAULT_CHUNK_BYTES):
        """Sends the rows each worker owns of whole tensor `array` (Q, K, V or dO). Returns bytes."""
        self._check_open()
        if kind not in (Q, K, V, DO):
            raise ValueError("kind: uploads take Q, K, V or dO, got %s" % KIND_NAMES.get(kind, kind))
        a = check_array(self.spec, kind, array)
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes: must be >= 1, got %r" % (chunk_bytes,))

        def one(rank):
            shard = self.shards[rank]
            where = "Upload %s to worker %d (%s)" % (KIND_NAMES[kind], rank, shard.address)

            def requests():
                first = True
                ar = _shards.head_view(a, kind, self.heads[rank])
                for bi, b, e, data, crc in _shards.iter_chunks(ar, kind, self.ranges[rank], chunk_bytes):
                    chunk = attention_pb2.TensorChunk(
                        kind=kind, rows=attention_pb2.RowRange(begin=b, end=e), batch_index=bi,
                        data=data, crc32c=crc)
                    if first:
                        first = False
                        yield worker_pb2.UploadRequest(session_id=self.id,
                                                       client_id=self.client.client_id, chunk=chunk)
                    else:
                        yield worker_pb2.UploadRequest(chunk=chunk)

            return self._upload_stream(rank, requests(), where,
                                       sum((e - b) for b, e in self.ranges[rank]) * a.shape[0]
                                       * _shards.row_bytes(_shards.head_view(a, kind, self.heads[rank]),
                                                           kind))

        sent = sum(self._parallel(one))
        self.uploaded_bytes[kind] = self.uploaded_bytes.get(kind, 0) + sent
        return sent

    def _upload_stream(self, rank, requests, where, expect_bytes=None):
        stub = self.client.worker_stub(self.shards[rank].address)
        try:
            resp = stub.Upload(requests, timeout=self.client.rpc_timeout)
        except grpc.RpcError as e:
            raise DfaError.from_rpc(e, where) from None
        if expect_bytes is not None and resp.bytes_received != expect_bytes:
            raise DfaError(grpc.StatusCode.INTERNAL, "worker acknowledged %d bytes of %d sent"
                           % (resp.bytes_received, expect_bytes), where)
        return resp.bytes_received

    def upload_chunks(self, rank, chunks):
        """Sends caller-made TensorChunks to the worker of `rank` as one Upload stream (tests use
        it for malformed chunks). Returns the UploadResponse's bytes_received."""
        self._check_open()
        reqs = [worker_pb2.UploadRequest(chunk=c) for c in chunks]
        if reqs:
            reqs[0].session_id, reqs[0].client_id = self.id, self.client.client_id
        return self._upload_stream(rank, iter(reqs), "Upload to worker %d" % rank)

    def download(self, kind, chunk_bytes=_shards.DEFAULT_CHUNK_BYTES):
        """Gathers the whole tensor of `kind` (O, LSE, dQ, dK, dV) from the workers owning it."""
        self._check_open()
        if kind not in (O, LSE, DQ, DK, DV):
            raise ValueError("kind: downloads take O, LSE, dQ, dK or dV, got %s"
                             % KIND_NAMES.get(kind, kind))
        out = np.empty(self.spec.shape(kind), dtype=self.spec.host_dtype(kind))

        def one(rank):
            shard = self.shards[rank]
            where = "Download %s from worker %d (%s)" % (KIND_NAMES[kind], rank, shard.address)
            stub = self.client.worker_stub(shard.address)
            g = _shards.Gatherer(_shards.head_view(out, kind, self.heads[rank]), kind,
                                 self.ranges[rank], where)
            for b, e in self.ranges[rank]:
                req = worker_pb2.DownloadRequest(
                    session_id=self.id, client_id=self.client.client_id, kind=kind,
                    rows=attention_pb2.RowRange(begin=b, end=e), chunk_bytes=int(chunk_bytes))
                try:
                    for chunk in stub.Download(req, timeout=self.client.rpc_timeout):
                        g.apply(chunk)
                except grpc.RpcError as err:
                    raise DfaError.from_rpc(err, where) from None
                except _shards.ChecksumError as err:
                    raise DfaError(grpc.StatusCode.DATA_LOSS, str(err), where) from None
                except ValueError as err:
                    raise DfaError(grpc.StatusCode.INTERNAL, str(err), where) from None
            try:
                g.finish()
            except ValueError as err:
                raise DfaError(grpc.StatusCode.INTERNAL, str(err), where) from None
            return g.bytes

        self._parallel(one)
        return out

    def generate_inputs(self, seed, with_grad_output=False):
        """Every worker fills its shard of Q, K, V (and dO) from `seed` (benchmarks)."""
        self._check_open()

        def one(rank):
            stub = self.client.worker_stub(self.shards[rank].address)
            try:
                stub.GenerateInputs(worker_pb2.GenerateInputsRequest(
                    session_id=self.id, client_id=self.client.client_id, seed=int(seed),
                    with_grad_output=bool(with_grad_output)), timeout=self.client.rpc_timeout)
            except grpc.RpcError as e:
                raise DfaError.from_rpc(e, "GenerateInputs on worker %d" % rank) from None

        self._parallel(one)

    # -- jobs ----------------------------------------------------------------------------------
    def submit(self, kind):
        """Starts a job ("forward" / "backward" or a JobKind value); returns the Job."""
        self._check_open()
        kind = {"forward": coordinator_pb2.JOB_FORWARD,
                "backward": coordinator_pb2.JOB_BACKWARD}.get(kind, kind)
        if kind not in (coordinator_pb2.JOB_FORWARD, coordinator_pb2.JOB_BACKWARD):
            raise ValueError("kind: expected 'forward' or 'backward', got %r" % (kind,))
        return self.client._call("SubmitJob", self.client.stub.SubmitJob,
                                 coordinator_pb2.SubmitJobRequest(
                                     session_id=self.id, kind=kind,
                                     client_id=self.client.client_id))

    def watch(self, job_id, observer=None):
        """Follows a job to its final state (WatchJob stream; GetJob polling if the stream
        breaks). Returns the final Job; JobFailedError unless it succeeded."""
        c = self.client
        deadline = time.monotonic() + c.job_timeout
        job = None
        try:
            for job in c.stub.WatchJob(
                    coordinator_pb2.GetJobRequest(job_id=job_id, client_id=c.client_id),
                    timeout=c.job_timeout, metadata=c._metadata):
                if observer:
                    observer(job)
                if job.state in _FINAL:
                    break
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED,
                                grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL):
                raise DfaError.from_rpc(e, "WatchJob %s" % job_id) from None
        while job is None or job.state not in _FINAL:
            if time.monotonic() > deadline:
                raise DfaError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               "job not finished after %.0f s" % c.job_timeout, "job " + job_id)
            job = c.get_job(job_id)
            if observer:
                observer(job)
            if job.state not in _FINAL:
                time.sleep(0.02)
        self.last_jobs[job.kind] = job
        if job.state == coordinator_pb2.JOB_SUCCEEDED:
            return job
        name = coordinator_pb2.JobKind.Name(job.kind)
        if job.state == coordinator_pb2.JOB_CANCELLED:
            raise JobFailedError(job, grpc.StatusCode.CANCELLED, job.error_message or "cancelled",
                                 "%s job %s" % (name, job_id))
        raise JobFailedError(job, status_code(job.error_code), job.error_message,
                             "%s job %s" % (name, job_id))

    def run(self, kind, observer=None):
        """submit + watch."""
        return self.watch(self.submit(kind).job_id, observer)

    # -- the training flow ---------------------------------------------------------------------
    def forward(self, q, k, v, download_lse=True):
        """Uploads Q, K, V, runs the forward job, returns (O, LSE) (LSE None if not asked).
        The workers keep Q, K, V, O and LSE for backward()."""
        for kind, a in ((Q, q), (K, k), (V, v)):
            check_array(self.spec, kind, a)  # all three checked before anything is sent
        for kind, a in ((Q, q), (K, k), (V, v)):
            self.upload(kind, a)
        self.run("forward")
        o = self.download(O)
        return o, (self.download(LSE) if download_lse else None)

    def backward(self, do):
        """Uploads ONLY dO, runs the backward job (no forward recompute, no Q/K/V re-send),
        returns (dQ, dK, dV). FAILED_PRECONDITION before a forward."""
        check_array(self.spec, DO, do, "dO")
        self.upload(DO, do)
        self.run("backward")
        return self.download(DQ), self.download(DK), self.download(DV)

    def release(self):
        """Frees the session on the cluster. Idempotent."""
        if self.released:
            return
        self.released = True
        self._finalizer.detach()
        self.client._call("ReleaseSession", self.client.stub.ReleaseSession,
                          coordinator_pb2.ReleaseSessionRequest(session_id=self.id,
                                                                client_id=self.client.client_id))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.release()
        except DfaError:
            if exc[0] is None:
                raise
