"""A crashed training job gives its memory back within seconds (Coordinator.HoldLease).

Real processes (dfa.LocalCluster: a coordinator with --client_lease_grace_ms=1500 and 2 CPU
workers): a child Python process, using the dfa package as a training job does, creates a
session, uploads Q, K, V over shared memory and runs a forward job; then it is SIGKILLed.
Within the grace + a few seconds the coordinator holds only the live client's session again,
and the workers' memory (as they report it) and shared-memory segments (their memfds) are what
they were before the child started. The live client in this process is untouched: its tensors
come back as sent and a forward job runs on its session.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/fault/client_lease_python_test.py
"""

import os
import signal
import subprocess
import sys
import time
import unittest

import numpy as np

import dfa

GRACE_S = 1.5
LEASE_ARGS = ["--client_lease_beat_ms=200", "--client_lease_timeout_ms=1000",
              "--client_lease_grace_ms=%d" % int(GRACE_S * 1000)]

CHILD = r"""
import sys, time
import numpy as np
import dfa
client = dfa.Client(sys.argv[1])
spec = dfa.AttentionSpec(batch=1, seq_len=4096, q_heads=4, kv_heads=4, head_dim=64,
                         causal=True, dtype="f32")
s = client.create_session(spec)
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 4096, 4, 64), dtype=np.float32) for _ in range(3))
s.forward(q, k, v)   # uploads over shared memory (same host), a forward job, downloads
print("READY", s.id, flush=True)
time.sleep(600)      # holds the session until killed
"""


def worker_pids(addresses):
    """The pids of the dfa-worker processes listening on `addresses`."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        for a in addresses:
            if ("--listen=%s" % a).encode() in argv:
                pids[a] = int(entry)
    return [pids[a] for a in addresses]


def segments(pid):
    """Shared-memory segments a worker holds: its memfds (worker/shm_mappings.cc names them)."""
    n = 0
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith("/memfd:dfa-shm"):
                n += 1
        except OSError:
            pass
    return n


class KilledTrainingJobTest(unittest.TestCase):
    def test_sigkilled_client_gives_back_its_session_and_segments(self):
        with dfa.LocalCluster(workers=2, coordinator_args=LEASE_ARGS) as cluster:
            addr = cluster.coordinator_address
            live = dfa.Client(addr, rpc_timeout=10)
            live.wait_ready(workers=2)
            pids = worker_pids(cluster.worker_addresses)
            spec = dfa.AttentionSpec(batch=1, seq_len=256, q_heads=2, kv_heads=1, head_dim=32,
                                     causal=True, dtype="f32")
            mine = live.create_session(spec)
            rng = np.random.default_rng(1)
            q = rng.standard_normal((1, 256, 2, 32), dtype=np.float32)
            k, v = (rng.standard_normal((1, 256, 1, 32), dtype=np.float32) for _ in range(2))
            o_before, _ = mine.forward(q, k, v)  # over shared memory: same host

            def workers():
                used = sum(w["memory_used_bytes"] for w in live.list_workers())
                return used, sum(segments(p) for p in pids)

            # The workers report memory at each heartbeat: wait for a steady figure.
            time.sleep(1.5)
            before = workers()
            self.assertGreaterEqual(before[1], 2, "the live session's segments")
            self.assertEqual(live.status()["sessions"], 1)

            child = subprocess.Popen([sys.executable, "-c", CHILD, addr],
                                     stdout=subprocess.PIPE, env=os.environ.copy())
            try:
                line = child.stdout.readline().decode()
                self.assertTrue(line.startswith("READY"), line)
                self.assertEqual(live.status()["sessions"], 2)
                self.assertGreater(workers()[1], before[1], "the child's segments")
                child.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                child.wait(10)
            finally:
                if child.poll() is None:
                    child.kill()
            sessions_back = None
            while time.monotonic() - killed < GRACE_S + 5:
                if sessions_back is None and live.status()["sessions"] == 1:
                    sessions_back = time.monotonic() - killed
                if sessions_back is not None and workers() == before:
                    break
                time.sleep(0.05)
            workers_back = time.monotonic() - killed
            print("session back after %.2f s, workers' memory and segments after %.2f s "
                  "(grace %.1f s)" % (sessions_back or -1, workers_back, GRACE_S))
            self.assertIsNotNone(sessions_back, "the killed client's session is kept")
            self.assertGreaterEqual(sessions_back, GRACE_S - 0.1)
            self.assertEqual(workers(), before)

            # The live client's session is untouched: the workers still hold its Q, K, V.
            mine.run("forward")
            np.testing.assert_array_equal(mine.download(dfa.O), o_before)
            mine.release()
            self.assertEqual(live.status()["sessions"], 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
