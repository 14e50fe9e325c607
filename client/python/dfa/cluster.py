"""A one-host cluster of real processes on loopback: one dfa-coordinator and N dfa-worker
daemons (client/local_cluster.h, through the extension), for examples, tests and benchmarks.

    with dfa.LocalCluster(workers=2) as cluster:
        client = dfa.Client(cluster.coordinator_address)

Defaults (None): those of the C++ LocalClusterOptions, shared with `dfa cluster`, `dfa demo`
and deploy/local/cluster.sh (LocalCluster.defaults(): 2 cpu workers, 1 thread each).
Binaries: `bin_dir` (a build folder, or a folder holding both), else $DFA_BIN_DIR. Ports are
picked free on 127.0.0.1; readiness is observed through the protocol (the coordinator lists N
live workers). Logs go to <log_dir>/{coordinator,worker-I}.log. stop() sends SIGTERM to all,
waits, then SIGKILLs; it raises DfaError when a daemon did not exit cleanly. Not thread-safe.
With tls_* / token set, every daemon runs with mTLS and the coordinator requires the token;
client_kwargs() gives what a dfa.Client needs to reach it.
"""

import os
import signal

from dfa import _dfa
from dfa.errors import InvalidArgumentError


def bin_dir_or_env(bin_dir=None):
    """`bin_dir`, else $DFA_BIN_DIR; InvalidArgumentError naming both when neither is set."""
    d = bin_dir or os.environ.get("DFA_BIN_DIR", "")
    if not d:
        raise InvalidArgumentError("INVALID_ARGUMENT", "bin_dir: not given and DFA_BIN_DIR is "
                                   "not set (the build folder holding coordinator/dfa-coordinator "
                                   "and worker/dfa-worker)")
    return d


class LocalCluster:
    @staticmethod
    def defaults():
        """The C++ defaults (client/local_cluster.h: LocalClusterOptions) as a dict: workers,
        backend, threads_per_worker, memory_limit_bytes, start_timeout."""
        return dict(_dfa.LocalCluster.defaults())

    def __init__(self, workers=None, threads_per_worker=None, backend=None,
                 memory_limit_bytes=None, bin_dir=None, log_dir="", coordinator_args=(),
                 worker_args=(), start_timeout=None, tls_cert="", tls_key="", tls_ca="",
                 tls_server_name="", token=""):
        d = self.defaults()
        pick = lambda value, key: d[key] if value is None else value  # noqa: E731
        workers = pick(workers, "workers")
        threads_per_worker = pick(threads_per_worker, "threads_per_worker")
        backend = pick(backend, "backend")
        memory_limit_bytes = pick(memory_limit_bytes, "memory_limit_bytes")
        start_timeout = pick(start_timeout, "start_timeout")
        self._security = dict(tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                              tls_server_name=tls_server_name, token=token)
        self._c = _dfa.LocalCluster.start(
            workers, backend, threads_per_worker, memory_limit_bytes, bin_dir_or_env(bin_dir),
            log_dir or "", float(start_timeout), list(coordinator_args), list(worker_args),
            **self._security)
        self.coordinator_address = self._c.coordinator_address
        self.worker_addresses = list(self._c.worker_addresses)
        self.log_dir = self._c.log_dir
        self.workers, self.backend, self.threads_per_worker = workers, backend, threads_per_worker
        self._stopped = False

    def client_kwargs(self):
        """Keyword arguments of dfa.Client that reach this cluster (address and security)."""
        return dict(coordinator=self.coordinator_address, **self._security)

    def add_worker(self):
        """Starts one more worker and waits until the coordinator lists it alive."""
        self._c.add_worker()
        self.worker_addresses = list(self._c.worker_addresses)

    def kill_worker(self, index, sig=signal.SIGKILL):
        """Sends `sig` to worker `index` without waiting (fault tests)."""
        self._c.signal_worker(index, int(sig))

    def restart_coordinator(self):
        """Kills the coordinator and starts a new one on the same address; returns once the
        workers have re-registered (fault tests)."""
        self._c.restart_coordinator()

    def worker_running(self, index):
        return self._c.worker_running(index)

    def stop(self, check=True):
        """Stops every daemon (workers first). Idempotent. check: raise DfaError when one did not
        exit cleanly (a worker a test killed exits uncleanly: pass check=False then)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self._c.stop()
        except Exception:
            if check:
                raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
