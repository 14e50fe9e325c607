"""Faults seen from Python, on real daemons (dfa.LocalCluster from the build tree):

* a worker SIGKILLed between training steps: the next step of dfa.torch.Attention succeeds on a
  new session on the live workers (the C++ AttentionJob's retry, inputs re-sent from the
  client's tensors), the retry is logged on the "dfa" logger, and the gradients are still SDPA's;
* the coordinator killed and restarted on its address between steps: the next step makes a
  new session (the old one is unknown: NOT_FOUND, or UNAVAILABLE while it restarts) and goes on;
* Ctrl-C (SIGINT) during a long forward: KeyboardInterrupt within a bound, the job cancelled and
  the session released on the coordinator; the next call works; a SIGINT handler of the
  program's own runs during a call and stops it; calls leave Python's SIGINT handler in place;
* mTLS and the token from Python: a client with the cluster's certificates and token works; one
  without the token is refused UNAUTHENTICATED; one without TLS cannot connect; a bad
  certificate file is INVALID_ARGUMENT naming --tls_cert.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/client/python/test_dfa_faults.py
"""

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import torch
import torch.nn.functional as F

import dfa
import dfa.torch


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def leaves(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).requires_grad_() for _ in range(3)]


class LostWorkerTest(unittest.TestCase):
    def test_training_step_survives_a_killed_worker(self):
        with dfa.LocalCluster(workers=3, coordinator_args=["--lease_ms=600"]) as cluster:
            client = dfa.Client(cluster.coordinator_address, rpc_timeout=10)
            attn = dfa.torch.Attention(client, is_causal=True, layout="bhsd", max_retries=2)
            q, k, v = leaves((1, 2, 96, 16), 0)
            g = torch.randn_like(q)
            want = torch.autograd.grad(sdpa(q, k, v), (q, k, v), g)
            got = torch.autograd.grad(attn(q, k, v), (q, k, v), g)
            self.assertEqual(len(client.list_workers()), 3)
            first = attn.session_id
            cluster.kill_worker(1)  # no goodbye: only the lease can tell
            with self.assertLogs("dfa", level="WARNING") as logs:
                got = torch.autograd.grad(attn(q, k, v), (q, k, v), g)
            for a, b in zip(got, want):
                self.assertLess((a - b).abs().max().item(), 1e-5)
            st = attn.stats
            self.assertGreaterEqual(st["retries"], 1, st)
            self.assertEqual(st["sessions"], 2, st)
            self.assertNotEqual(attn.session_id, first)
            self.assertTrue(any("retried on a new session after: UNAVAILABLE" in m
                                for m in logs.output), logs.output)
            # Later steps run on the new session, without retries.
            got = torch.autograd.grad(attn(q, k, v), (q, k, v), g)
            self.assertLess((got[0] - want[0]).abs().max().item(), 1e-5)
            self.assertEqual(attn.stats["retries"], st["retries"])
            self.assertEqual(attn.stats["sessions"], 2)
            attn.release()
            cluster.stop(check=False)  # the killed worker did not exit cleanly


class CoordinatorRestartTest(unittest.TestCase):
    def test_training_step_after_a_coordinator_restart(self):
        with dfa.LocalCluster(workers=2) as cluster:
            client = dfa.Client(cluster.coordinator_address, rpc_timeout=10)
            attn = dfa.torch.Attention(client, is_causal=True, layout="bhsd")
            q, k, v = leaves((1, 2, 64, 16), 1)
            g = torch.randn_like(q)
            want = torch.autograd.grad(sdpa(q, k, v), (q, k, v), g)
            torch.autograd.grad(attn(q, k, v), (q, k, v), g)
            first = attn.session_id
            cluster.restart_coordinator()  # the new one knows no session
            with self.assertLogs("dfa", level="WARNING"):
                got = torch.autograd.grad(attn(q, k, v), (q, k, v), g)
            for a, b in zip(got, want):
                self.assertLess((a - b).abs().max().item(), 1e-5)
            self.assertNotEqual(attn.session_id, first)
            st = attn.stats
            self.assertEqual(st["sessions"], 2, st)
            self.assertGreaterEqual(st["lost_sessions"] + st["retries"], 1, st)
            got = torch.autograd.grad(attn(q, k, v), (q, k, v), g)  # and on, without retries
            self.assertLess((got[0] - want[0]).abs().max().item(), 1e-5)
            self.assertEqual(attn.stats["sessions"], 2)
            attn.release()


class InterruptTest(unittest.TestCase):
    def test_ctrl_c_cancels_the_job_and_releases_the_session(self):
        with dfa.LocalCluster(workers=2) as cluster:
            client = dfa.Client(cluster.coordinator_address)
            attn = dfa.torch.Attention(client, layout="bhsd")
            # ~80 GFLOP of forward: seconds on one thread per worker. SIGINT once it runs.
            q, k, v = (torch.randn(1, 4, 12288, 64) for _ in range(3))
            watcher = dfa.Client(cluster.coordinator_address)
            sent = []

            def interrupt_when_running():
                deadline = time.monotonic() + 30
                while not watcher.status()["jobs_running"] and time.monotonic() < deadline:
                    time.sleep(0.01)
                sent.append(time.monotonic())
                os.kill(os.getpid(), signal.SIGINT)

            timer = threading.Thread(target=interrupt_when_running)
            t = time.monotonic()
            timer.start()
            with self.assertRaises(KeyboardInterrupt):
                attn(q, k, v)
            done = time.monotonic()
            timer.join()
            elapsed = done - sent[0]
            self.assertLess(elapsed, 5.0)
            print("  KeyboardInterrupt %.2f s after SIGINT (%.2f s into the call)"
                  % (elapsed, sent[0] - t))
            status = client.status()
            self.assertEqual(status["sessions"], 0, status)  # released
            deadline = time.monotonic() + 10
            while client.status()["jobs_running"] and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertEqual(client.status()["jobs_running"], 0)  # cancelled
            small = [t[:, :, :64] for t in (q, k, v)]
            self.assertLess((attn(*small) - F.scaled_dot_product_attention(*small)).abs().max(),
                            1e-5)
            attn.release()


    def test_ctrl_c_under_a_custom_sigint_handler(self):
        # A SIGINT handler of the program's own runs during the call (the binding polls for it)
        # and what it raises stops the call as KeyboardInterrupt does.
        class Stop(Exception):
            pass

        def handler(signum, frame):
            raise Stop()

        with dfa.LocalCluster(workers=2) as cluster:
            client = dfa.Client(cluster.coordinator_address)
            attn = dfa.torch.Attention(client, layout="bhsd")
            q, k, v = (torch.randn(1, 4, 12288, 64) for _ in range(3))
            watcher = dfa.Client(cluster.coordinator_address)

            def interrupt_when_running():
                deadline = time.monotonic() + 30
                while not watcher.status()["jobs_running"] and time.monotonic() < deadline:
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGINT)

            old = signal.signal(signal.SIGINT, handler)
            try:
                timer = threading.Thread(target=interrupt_when_running)
                timer.start()
                t = time.monotonic()
                with self.assertRaises(Stop):
                    attn(q, k, v)
                self.assertLess(time.monotonic() - t, 30.0)
                timer.join()
            finally:
                signal.signal(signal.SIGINT, old)
            self.assertEqual(client.status()["sessions"], 0)  # released
            attn.release()

    def test_calls_leave_the_default_sigint_handler_in_place(self):
        # Calls on the main thread arm a C handler for their duration only: afterwards Ctrl-C is
        # Python's own again (KeyboardInterrupt in Python code), also after an interrupted call.
        with dfa.LocalCluster(workers=1) as cluster:
            client = dfa.Client(cluster.coordinator_address)
            for _ in range(3):
                client.status()
            self.assertIs(signal.getsignal(signal.SIGINT), signal.default_int_handler)
            with self.assertRaises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            # A call from another thread runs without Ctrl-C handling and works.
            out = []
            t = threading.Thread(target=lambda: out.append(client.status()))
            t.start()
            t.join(30)
            self.assertEqual(out[0]["live_workers"], 1)


def openssl(dir_, *args):
    subprocess.run(["openssl", *args], cwd=dir_, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


@unittest.skipIf(shutil.which("openssl") is None, "the openssl command is not installed")
class SecurityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dfa-pytls-")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        openssl(cls.dir, "req", "-x509", *ec, "-days", "2", "-subj", "/CN=ca", "-keyout",
                "ca.key", "-out", "ca.pem")
        with open(os.path.join(cls.dir, "node.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                    "extendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n")
        openssl(cls.dir, "req", *ec, "-subj", "/CN=node", "-keyout", "node.key", "-out",
                "node.csr")
        openssl(cls.dir, "x509", "-req", "-days", "2", "-in", "node.csr", "-CA", "ca.pem",
                "-CAkey", "ca.key", "-CAcreateserial", "-extfile", "node.ext", "-out", "node.pem")
        p = lambda n: os.path.join(cls.dir, n)
        cls.tls = dict(tls_cert=p("node.pem"), tls_key=p("node.key"), tls_ca=p("ca.pem"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_mtls_and_token(self):
        with dfa.LocalCluster(workers=2, token="s3cret", **self.tls) as cluster:
            client = dfa.Client(**cluster.client_kwargs())
            self.assertEqual(client.status()["live_workers"], 2)
            q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
            out = dfa.torch.attention(q, k, v, layout="bhsd", client=client)
            self.assertLess((out - F.scaled_dot_product_attention(q, k, v)).abs().max(), 1e-5)
            no_token = dfa.Client(cluster.coordinator_address, **self.tls)
            with self.assertRaises(dfa.DfaError) as cm:
                no_token.status()
            self.assertEqual(cm.exception.code, "UNAUTHENTICATED")
            plaintext = dfa.Client(cluster.coordinator_address, token="s3cret", rpc_timeout=3)
            with self.assertRaises(dfa.DfaError) as cm:
                plaintext.status()
            self.assertIn(cm.exception.code, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
            with self.assertRaisesRegex(ValueError, "--tls_cert"):
                dfa.Client(cluster.coordinator_address, tls_cert=os.path.join(self.dir, "node.ext"),
                           tls_key=self.tls["tls_key"], tls_ca=self.tls["tls_ca"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
