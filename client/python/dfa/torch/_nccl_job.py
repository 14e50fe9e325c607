"""NcclJob: one dfa.torch layer's session over the NCCL device path (dfa/torch/_device.py
picks it): the C++ NcclTensorIo of the layer's dfa.Client (client/nccl_tensor_io.h) moves the
tensors, the jobs run through the coordinator, retries re-create the session."""

import time

from dfa import _dfa
from dfa.errors import DfaError
from dfa.spec import DK, DO, DQ, DV, K, O, Q, V

# Job failures that a new session on the live workers may cure (the C++ AttentionJob's).
_RETRIED = ("UNAVAILABLE", "NOT_FOUND")


class NcclJob:
    """One layer's session over the NCCL device path, with the interface of
    dfa._dfa.DeviceAttentionJob that _LayerJob uses: forward(q, k, v, o) sends Q, K, V (refs:
    (data_ptr, dtype, shape, strides)) through the client's NcclTensorIo, runs the forward job
    and receives O into `o` (None: not received); backward(dout, dq, dk, dv) sends only dO and
    receives the gradients (a backward whose forward state is gone — after another backward
    or a retry — re-runs the forward first). auto=True: each session's transfers take the C++
    UploadAuto / DownloadAuto (CUDA IPC when every shard is on this host, NCCL otherwise).

    Retries as the C++ AttentionJob: a call failing UNAVAILABLE or NOT_FOUND (a lost worker, a
    restarted coordinator) re-creates the session on the live workers (waiting up to
    recovery_timeout for one) and redoes the work from the caller's tensors — a backward
    re-runs the forward first without receiving O — at most max_retries times, each reason kept
    for take_retry_log(). The tensors passed to forward must stay allocated until the next
    forward or release (a retry re-reads them). One thread at a time (_LayerJob's lock).
    """

    def __init__(self, client, spec, options, auto=False):
        self.client = client
        self.spec = spec
        self.options = options
        self.auto = auto
        self.path = "auto-nccl" if auto else "nccl"
        self._session = None
        self._inputs = None
        self._forward_done = False
        self._session_path = "nccl"   # what this session's transfers take
        self._retry_log = []
        self.retries_done = 0
        self.last_times = self._no_times()

    @staticmethod
    def _no_times():
        """Of the last call: bytes moved (and by which path), transfer and run seconds,
        transfer requests."""
        return {"bytes": 0, "ipc_bytes": 0, "nccl_bytes": 0, "transfer": 0.0, "run": 0.0,
                "requests": 0}

    @property
    def session_id(self):
        return "" if self._session is None else self._session.id

    @property
    def num_workers(self):
        return 0 if self._session is None else self._session.num_workers

    def take_retry_log(self):
        log, self._retry_log = self._retry_log, []
        return log

    def _io(self):
        return self.client.nccl_tensor_io()

    def _new_session(self):
        deadline = time.monotonic() + self.options["recovery_timeout"]
        while True:
            try:
                self._session = self.client.create_session(
                    self.spec, num_workers=self.options["num_workers"],
                    schedule=self.options["schedule"])
                self._session_path = "nccl"
                if self.auto:
                    self._session_path = _dfa.choose_device_path(self._session.shards, None)
                return
            except DfaError as e:
                if e.code != "UNAVAILABLE" or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _drop_session(self):
        s, self._session = self._session, None
        self._forward_done = False
        if s is not None:
            try:
                s.release()
            except DfaError:
                pass  # best effort: the lost worker or coordinator may not answer

    def _move(self, kind, ref, upload):
        io = self._io()
        if self.auto:
            fn = io.upload_auto if upload else io.download_auto
        else:
            fn = io.upload if upload else io.download
        st = fn(self._session._s, kind, *ref)
        self.last_times["bytes"] += st["bytes"]
        self.last_times[self._session_path + "_bytes"] += st["bytes"]
        self.last_times["transfer"] += st["seconds"]
        self.last_times["requests"] += st["chunks"]

    def _run(self, job_kind):
        start = time.monotonic()
        job = self._session.run(job_kind)
        self.last_times["run"] += time.monotonic() - start
        return job

    def _forward_once(self, o):
        q, k, v = self._inputs
        for kind, ref in ((Q, q), (K, k), (V, v)):
            self._move(kind, ref, True)
        job = self._run("forward")
        self._forward_done = True
        if o is not None:
            self._move(O, o, False)
        return job

    def _with_retries(self, fn):
        self.last_times = self._no_times()
        attempt = 0
        while True:
            after_failure = attempt > 0
            try:
                if self._session is None:
                    self._new_session()
                return fn(after_failure)
            except DfaError as e:
                if e.code not in _RETRIED or attempt >= self.options["max_retries"]:
                    raise
                attempt += 1
                self.retries_done += 1
                self._retry_log.append(str(e))
                self._drop_session()

    def forward(self, q, k, v, o):
        self._inputs = (q, k, v)
        return self._with_retries(lambda after_failure: self._forward_once(o))

    def backward(self, dout, dq, dk, dv):
        if self._inputs is None:
            raise DfaError("FAILED_PRECONDITION", "backward: no forward on this job (call "
                           "forward first)")

        def once(after_failure):
            if after_failure or not self._forward_done:
                self._forward_once(None)
            self._move(DO, dout, True)
            job = self._run("backward")
            # The backward leaves the gradients in the workers' Q, K, V, O memory
            # (docs/memory.md): another backward re-runs the forward first.
            self._forward_done = False
            for kind, ref in ((DQ, dq), (DK, dk), (DV, dv)):
                self._move(kind, ref, False)
            return job
        return self._with_retries(once)

    def release(self):
        s, self._session = self._session, None
        self._forward_done = False
        self._inputs = None
        if s is not None:
            s.release()
