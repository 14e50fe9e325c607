"""A one-host cluster of real processes on loopback (one dfa-coordinator, N dfa-worker), for
tests, examples and `python3 -m dfa demo`; the Python twin of client/local_cluster.h.

Binaries: `bin_dir` (a build folder, or a folder holding both), else $DFA_BIN_DIR, else the
repository's build/ next to this source tree. Ports are picked free on 127.0.0.1; readiness is
observed through the protocol (the coordinator lists N live workers). Logs go to
<log_dir>/{coordinator,worker-I}.log. stop() sends SIGTERM to all, waits, then SIGKILLs.
Not thread-safe (one owner). Errors: FileNotFoundError for missing binaries, RuntimeError with
the log tail for a daemon that exits or does not get ready.
"""

import os
import signal
import socket
import subprocess
import tempfile
import time

_REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A free loopback port below the kernel's ephemeral range (outgoing connections take their
    local ports from that range, so a port picked there can be taken before a daemon binds it);
    the kernel's own pick as the fallback."""
    import random
    high = _ephemeral_low()
    for _ in range(64 if high > 11000 else 0):
        port = random.randrange(10000, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_binary(component, name, bin_dir=None):
    dirs = [d for d in (bin_dir, os.environ.get("DFA_BIN_DIR"), os.path.join(_REPO, "build")) if d]
    tried = []
    for d in dirs:
        for p in (os.path.join(d, component, name), os.path.join(d, name)):
            if os.access(p, os.X_OK):
                return p
            tried.append(p)
    raise FileNotFoundError("%s not found (build it: cmake --build <dir> --target %s); tried: %s"
                            % (name, name, ", ".join(tried)))


def _tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class LocalCluster:
    def __init__(self, workers=2, threads_per_worker=1, bin_dir=None, log_dir=None,
                 coordinator_args=(), worker_args=(), start_timeout=30.0):
        if workers < 1:
            raise ValueError("workers: must be >= 1, got %d" % workers)
        self.coordinator_bin = find_binary("coordinator", "dfa-coordinator", bin_dir)
        self.worker_bin = find_binary("worker", "dfa-worker", bin_dir)
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="dfa-pycluster-")
        os.makedirs(self.log_dir, exist_ok=True)
        self.procs = []  # (name, Popen, log path)
        self.worker_addresses = []
        self.coordinator_address = None
        try:
            self._start(workers, threads_per_worker, list(coordinator_args), list(worker_args),
                        start_timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name, argv):
        log = os.path.join(self.log_dir, name + ".log")
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((name, p, log))
        return p

    def _check_alive(self):
        for name, p, log in self.procs:
            if p.poll() is not None:
                raise RuntimeError("%s exited with %s during start. Log tail:\n%s"
                                   % (name, p.returncode, _tail(log)))

    def _start(self, n, threads, coordinator_args, worker_args, timeout):
        from dfa.client import Client  # late: the stubs load only when a cluster is used
        self.coordinator_address = "127.0.0.1:%d" % free_port()
        self._spawn("coordinator", [self.coordinator_bin, "--listen=" + self.coordinator_address,
                                    "--metrics_port=-1"] + coordinator_args)
        for i in range(n):
            addr = "127.0.0.1:%d" % free_port()
            argv = [self.worker_bin, "--listen=" + addr, "--advertise=" + addr,
                    "--coordinator=" + self.coordinator_address, "--worker_id=worker-%d" % i,
                    "--backend=cpu", "--metrics_port=-1"]
            if threads > 0:
                argv.append("--threads=%d" % threads)
            self._spawn("worker-%d" % i, argv + worker_args)
            self.worker_addresses.append(addr)
        deadline = time.monotonic() + timeout
        with Client(self.coordinator_address, rpc_timeout=2.0) as c:
            while True:
                self._check_alive()
                try:
                    if sum(w.alive for w in c.list_workers()) >= n:
                        return
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("cluster not ready after %.0f s; logs in %s"
                                       % (timeout, self.log_dir))
                time.sleep(0.05)

    def stop(self, grace=10.0):
        """Stops every daemon; returns the names of those that did not exit cleanly."""
        unclean = []
        for _, p, _ in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, p, _ in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.returncode != 0:
                unclean.append("%s (exit %s)" % (name, p.returncode))
        self.procs = []
        return unclean

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
