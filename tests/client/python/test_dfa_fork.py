"""The Python package with fork() and FLOP counts, against real daemons (dfa.LocalCluster: a
coordinator with short client leases and 2 CPU workers).

  flops   AttentionSpec.forward_flops() equals the `flops` of the forward job the service ran
          (and 1/2.5 of the backward's) for dense causal and full masks, packed documents
          (one row for all, per row), windows (one- and two-sided, with and without causal) and
          GQA, and equals a brute-force count of the visible (query, key) pairs.
  fork    a multiprocessing child started with 'fork' that uses its parent's Client or
          Session, or makes a new Client, gets FAILED_PRECONDITION at once (no hang: gRPC does
          not survive fork), and dropping the parent's objects there releases nothing; the
          parent's lease is still its only one and its session still runs a job after several
          lease timeouts and graces. A child started with 'spawn' holds its own lease (the
          coordinator counts two while it holds a session) and gives it back on exit.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/client/python/test_dfa_fork.py
(ctest python_fork_test does that).
"""

import gc
import multiprocessing as mp
import time
import unittest

import numpy as np

import dfa

LEASE_ARGS = ["--client_lease_beat_ms=200", "--client_lease_timeout_ms=1000",
              "--client_lease_grace_ms=1000"]
CLUSTER = None
CLIENT = None


def setUpModule():
    global CLUSTER, CLIENT
    CLUSTER = dfa.LocalCluster(workers=2, threads_per_worker=1, coordinator_args=LEASE_ARGS)
    CLIENT = dfa.Client(CLUSTER.coordinator_address, rpc_timeout=20, job_timeout=60)


def tearDownModule():
    if CLUSTER:
        CLUSTER.stop()


def inputs(spec, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(spec.shape(kind), dtype=np.float32)
            for kind in (dfa.spec.Q, dfa.spec.K, dfa.spec.V)]


def visible_pairs(spec):
    """Brute force over every (row, query, key): same document, causal, window."""
    total = 0
    i = np.arange(spec.seq_len)[:, None]
    j = np.arange(spec.seq_len)[None, :]
    for b in range(spec.batch):
        offsets = (spec.doc_offsets[b] if len(spec.doc_offsets) > 1 else
                   spec.doc_offsets[0] if spec.doc_offsets else (0, spec.seq_len))
        doc = np.searchsorted(np.asarray(offsets), np.arange(spec.seq_len), side="right")
        ok = doc[:, None] == doc[None, :]
        if spec.causal:
            ok &= j <= i
        if spec.window_left >= 0:
            ok &= j >= i - spec.window_left
        if spec.window_right >= 0:
            ok &= j <= i + spec.window_right
        total += int(ok.sum())
    return total


class FlopsTest(unittest.TestCase):
    def test_forward_flops_is_the_jobs_count(self):
        S = 384
        cases = [
            dict(causal=True),
            dict(causal=False),
            dict(causal=True, doc_offsets=(0, 1, 100, 257, S)),
            dict(causal=False, doc_offsets=(0, 200, S)),
            dict(causal=True, window_left=64),
            dict(causal=False, window_left=32, window_right=16),
            dict(causal=True, doc_offsets=(0, 150, S), window_left=50),
            dict(batch=2, causal=True, doc_offsets=((0, 128, S), (0, 1, 2, S))),
            dict(q_heads=4, kv_heads=2, causal=False, window_left=-1, window_right=40),
        ]
        for fields in cases:
            with self.subTest(**{k: str(v) for k, v in fields.items()}):
                f = dict(batch=1, seq_len=S, q_heads=2, head_dim=16, dtype="f32")
                f.update(fields)
                spec = dfa.AttentionSpec(**f)
                # Causal counts the diagonal: S(S+1)/2 pairs per row, not S²/2.
                want = 4.0 * spec.q_heads * spec.head_dim * visible_pairs(spec)
                self.assertEqual(spec.forward_flops(), want)
                with CLIENT.create_session(spec) as s:
                    s.forward(*inputs(spec, 1), download_lse=False)
                    s.backward(inputs(spec, 2)[0])
                    self.assertEqual(s.last_jobs["forward"]["flops"], spec.forward_flops())
                    self.assertAlmostEqual(s.last_jobs["backward"]["flops"],
                                           2.5 * spec.forward_flops(), delta=1e-6 * want)
                if not spec.dense:
                    dense = dfa.AttentionSpec(**{k: v for k, v in f.items()
                                                 if k not in ("doc_offsets", "window_left",
                                                              "window_right")})
                    self.assertLess(spec.forward_flops(), dense.forward_flops())


SPEC = dfa.AttentionSpec(batch=1, seq_len=256, q_heads=2, head_dim=16, dtype="f32")


def child_uses_parent(client, session, out):
    """In a fork()ed child: every use of the parent's objects, and a new Client, is refused."""
    results = {}
    t = time.monotonic()
    for name, call in (("status", lambda: client.status()),
                       ("create_session", lambda: client.create_session(SPEC)),
                       ("run", lambda: session.run("forward")),
                       ("new_client", lambda: dfa.Client(client.coordinator))):
        try:
            call()
            results[name] = "ok"
        except dfa.DfaError as e:
            results[name] = "%s: %s" % (e.code, e)
    session.release()  # the parent's: nothing happens
    del session, client
    gc.collect()       # nor when they are dropped here
    results["seconds"] = time.monotonic() - t
    out.put(results)


def child_own_client(address, out, go):
    client = dfa.Client(address)
    s = client.create_session(SPEC)
    out.put(client.status()["client_leases"])
    go.get(timeout=60)  # holds its session until the parent has looked
    s.release()


class ForkTest(unittest.TestCase):
    def test_forked_child_refused_and_parent_lease_kept(self):
        with CLIENT.create_session(SPEC) as s:
            q, k, v = inputs(SPEC, 3)
            o, _ = s.forward(q, k, v, download_lse=False)
            self.assertEqual(CLIENT.status()["client_leases"], 1)
            ctx = mp.get_context("fork")
            out = ctx.Queue()
            p = ctx.Process(target=child_uses_parent, args=(CLIENT, s, out))
            p.start()
            p.join(30)
            alive = p.is_alive()
            if alive:
                p.kill()
                p.join()
            self.assertFalse(alive, "the fork()ed child hung using the parent's client")
            self.assertEqual(p.exitcode, 0)
            r = out.get(timeout=5)
            for name in ("status", "create_session", "run", "new_client"):
                self.assertTrue(r[name].startswith("FAILED_PRECONDITION"), (name, r[name]))
                self.assertIn("fork", r[name])
                self.assertIn("spawn", r[name])
            self.assertLess(r["seconds"], 5.0)
            # Several lease timeouts + graces later the parent's lease and session are intact.
            time.sleep(3.0)
            st = CLIENT.status()
            self.assertEqual(st["client_leases"], 1, st)
            self.assertEqual(st["sessions"], 1, st)
            o2, _ = s.forward(q, k, v, download_lse=False)
            np.testing.assert_array_equal(o, o2)

    def test_spawned_child_holds_its_own_lease(self):
        with CLIENT.create_session(SPEC):
            ctx = mp.get_context("spawn")
            out, go = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=child_own_client, args=(CLUSTER.coordinator_address, out, go))
            p.start()
            try:
                self.assertEqual(out.get(timeout=60), 2)  # the parent's and the child's
                st = CLIENT.status()
                self.assertEqual((st["client_leases"], st["sessions"]), (2, 2), st)
            finally:
                go.put(1)
                p.join(30)
            self.assertEqual(p.exitcode, 0)
            # The child's lease closed on exit; the parent's stays.
            deadline = time.monotonic() + 10
            while CLIENT.status()["client_leases"] != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            st = CLIENT.status()
            self.assertEqual((st["client_leases"], st["sessions"]), (1, 1), st)


if __name__ == "__main__":
    unittest.main(verbosity=2)
