"""Tests of the Python package `dfa` (client/python) against real daemons on loopback.

Starts one dfa-coordinator and 2 CPU dfa-workers from the build tree ($DFA_BIN_DIR), then:
the numpy path (forward + backward vs a numpy fp64 reference; bf16 GQA causal and f32 full),
rematerialisation (backward uploads only dO), bad inputs (client-side ValueErrors naming the
field; the service's gRPC codes), and the torch autograd path when torch is importable.

Run: DFA_BIN_DIR=<build> PYTHONPATH=client/python python3 tests/client/python/test_dfa_python.py
Exit 77 (ctest: skipped) when grpcio / numpy are not installed (./dfa.sh setup installs them).
"""

import os
import sys
import threading
import unittest

try:
    import grpc
    import numpy as np
except ImportError as e:  # pragma: no cover
    print("SKIP: %s (./dfa.sh setup installs grpcio, grpcio-tools, numpy)" % e)
    sys.exit(77)

import dfa
from dfa import reference as ref
from dfa import shards
from dfa.cluster import LocalCluster, find_binary
from dfa.crc import crc32c

try:
    import torch
    from dfa.autograd import distributed_attention
    TORCH_WHY = None
except ImportError as e:
    torch = None
    TORCH_WHY = "torch not importable (%s); the torch path is tested where torch is installed" % e

CLUSTER = None
CLIENT = None
BINARIES_WHY = None
try:
    find_binary("coordinator", "dfa-coordinator")
    find_binary("worker", "dfa-worker")
except FileNotFoundError as e:
    BINARIES_WHY = str(e)


def setUpModule():
    global CLUSTER, CLIENT
    if BINARIES_WHY:
        return
    CLUSTER = LocalCluster(workers=2, threads_per_worker=1)
    CLIENT = dfa.Client(CLUSTER.coordinator_address, rpc_timeout=30, job_timeout=60)


def tearDownModule():
    if CLIENT:
        CLIENT.close()
    if CLUSTER:
        unclean = CLUSTER.stop()
        assert not unclean, "daemons did not stop cleanly: %s" % unclean


def random_inputs(spec, seed):
    rng = np.random.default_rng(seed)
    mk = lambda kind: dfa.from_float(rng.uniform(-1, 1, spec.shape(kind)), spec.dtype)
    return mk(dfa.Q), mk(dfa.K), mk(dfa.V), mk(dfa.DO)


class OfflineTest(unittest.TestCase):
    """Pieces that need no cluster."""

    def test_crc32c_known_vector(self):
        self.assertEqual(crc32c(b"123456789"), 0xE3069283)

    def test_bf16_round_trip_and_rounding(self):
        x = np.array([1.0, -2.5, 3.140625, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.inf], np.float32)
        b = dfa.to_bf16(x)
        back = dfa.from_bf16(b)
        # 1+2^-8 is a tie -> even (1.0); 1+3*2^-8 is a tie -> even (1+2^-6).
        np.testing.assert_array_equal(back, [1.0, -2.5, 3.140625, 1.0, 1.0 + 2 ** -6, np.inf])
        self.assertTrue(np.isnan(dfa.from_bf16(dfa.to_bf16(np.array([np.nan], np.float32))))[0])

    def test_chunks_cover_owned_rows_once_and_gather(self):
        spec = dfa.AttentionSpec(batch=2, seq_len=50, q_heads=4, kv_heads=2, head_dim=8,
                                 dtype="f32")
        a = np.arange(np.prod(spec.shape(dfa.K)), dtype=np.float32).reshape(spec.shape(dfa.K))
        ranges = [(0, 7), (30, 50)]
        out = np.zeros_like(a)
        g = shards.Gatherer(out, dfa.K, ranges, "test")
        from dfa.client import attention_pb2
        n = 0
        for bi, b, e, data, crc in shards.iter_chunks(a, dfa.K, ranges, chunk_bytes=200):
            self.assertLessEqual(len(data), max(200, 64))
            g.apply(attention_pb2.TensorChunk(kind=dfa.K, rows=attention_pb2.RowRange(begin=b, end=e),
                                              batch_index=bi, data=data, crc32c=crc))
            n += 1
        g.finish()
        self.assertEqual(n, shards.count_chunks(a, dfa.K, ranges, 200))
        np.testing.assert_array_equal(out[:, 0:7], a[:, 0:7])
        np.testing.assert_array_equal(out[:, 30:50], a[:, 30:50])
        self.assertFalse(out[:, 7:30].any())

    def test_gatherer_rejects_bad_chunks(self):
        from dfa.client import attention_pb2
        out = np.zeros((1, 10, 1, 2), np.float32)
        g = shards.Gatherer(out, dfa.O, [(0, 10)], "test")
        data = np.ones((2, 1, 2), np.float32).tobytes()
        good = dict(kind=dfa.O, rows=attention_pb2.RowRange(begin=0, end=2), batch_index=0,
                    data=data, crc32c=crc32c(data))
        with self.assertRaisesRegex(shards.ChecksumError, "crc32c"):
            g.apply(attention_pb2.TensorChunk(**dict(good, crc32c=crc32c(data) ^ 1)))
        with self.assertRaisesRegex(ValueError, "chunk.rows"):
            g.apply(attention_pb2.TensorChunk(**dict(good, rows=attention_pb2.RowRange(begin=9, end=11))))
        with self.assertRaisesRegex(ValueError, "chunk.batch_index"):
            g.apply(attention_pb2.TensorChunk(**dict(good, batch_index=1)))
        with self.assertRaisesRegex(ValueError, "chunk.data"):
            g.apply(attention_pb2.TensorChunk(**dict(good, data=data[:4], crc32c=crc32c(data[:4]))))
        g.apply(attention_pb2.TensorChunk(**good))
        with self.assertRaisesRegex(ValueError, "row 2 arrived 0 times"):
            g.finish()

    def test_placement_cover(self):
        shards.check_cover([[(0, 5)], [(5, 9), (12, 16)], [(9, 12)]], 16)
        with self.assertRaisesRegex(ValueError, "uncovered"):
            shards.check_cover([[(0, 5)], [(6, 16)]], 16)
        with self.assertRaisesRegex(ValueError, "covered twice"):
            shards.check_cover([[(0, 6)], [(5, 16)]], 16)

    def test_head_placement_cover(self):
        class R:  # a HeadRange / ShardPlacement stand-in (the fields the client reads)
            def __init__(self, **kw):
                self.__dict__.update(kw)
        spec = dfa.AttentionSpec(batch=1, seq_len=10, q_heads=4, kv_heads=2, head_dim=8)
        split = [R(q_heads=R(begin=0, end=2), kv_heads=R(begin=0, end=1)),
                 R(q_heads=R(begin=2, end=4), kv_heads=R(begin=1, end=2))]
        heads = shards.head_ranges(split, spec)
        self.assertEqual(heads, [((0, 2), (0, 1)), ((2, 4), (1, 2))])
        shards.check_head_cover([[(0, 10)], [(0, 10)]], heads, spec)
        with self.assertRaisesRegex(ValueError, "covered twice"):
            shards.check_head_cover([[(0, 10)], [(0, 10)]], [heads[0], heads[0]][:1] * 2, spec)
        with self.assertRaisesRegex(ValueError, "kv heads \\[1, 2\\) held by no shard"):
            shards.check_head_cover([[(0, 10)]], heads[:1], spec)
        with self.assertRaisesRegex(ValueError, "shards\\[0\\].q_heads"):
            shards.head_ranges([R(q_heads=R(begin=0, end=1), kv_heads=R(begin=0, end=1))], spec)
        # A view at one shard's heads: K takes the kv range, Q and LSE the query range.
        q = np.arange(1 * 10 * 4 * 8).reshape(1, 10, 4, 8)
        k = np.arange(1 * 10 * 2 * 8).reshape(1, 10, 2, 8)
        lse = np.arange(40.0).reshape(1, 4, 10)
        self.assertTrue((shards.head_view(q, dfa.Q, heads[1]) == q[:, :, 2:4]).all())
        self.assertTrue((shards.head_view(k, dfa.K, heads[1]) == k[:, :, 1:2]).all())
        self.assertTrue((shards.head_view(lse, dfa.LSE, heads[1]) == lse[:, 2:4]).all())

    def test_reference_matches_finite_differences(self):
        rng = np.random.default_rng(3)
        q, k, v, do = (rng.standard_normal((1, 5, h, 3)) for h in (2, 1, 1, 2))
        dq, dk, dv = ref.attention_backward(q, k, v, do, causal=True)
        loss = lambda q_, k_, v_: (ref.attention_forward(q_, k_, v_, True)[0] * do).sum()
        eps = 1e-6
        for grad, arr, idx in ((dq, q, (0, 3, 1, 2)), (dk, k, (0, 1, 0, 0)), (dv, v, (0, 2, 0, 1))):
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args_p = [plus if x is arr else x for x in (q, k, v)]
            args_m = [minus if x is arr else x for x in (q, k, v)]
            fd = (loss(*args_p) - loss(*args_m)) / (2 * eps)
            self.assertAlmostEqual(grad[idx], fd, places=6)


@unittest.skipIf(BINARIES_WHY, BINARIES_WHY)
class ServiceTest(unittest.TestCase):

    def check_job(self, spec, schedule=""):
        q, k, v, do = random_inputs(spec, seed=spec.seq_len)
        with CLIENT.create_session(spec, schedule=schedule) as s:
            self.assertEqual(s.num_workers, 2)
            if schedule == "heads":  # two head groups: each worker holds its own kv heads
                self.assertEqual(sorted(h[1] for h in s.heads),
                                 [(0, spec.kv_heads // 2), (spec.kv_heads // 2, spec.kv_heads)])
            o, lse = s.forward(q, k, v)
            dq, dk, dv = s.backward(do)
            fwd = s.last_jobs[1]
            self.assertEqual(len(fwd.workers), 2)
            self.assertGreater(fwd.flops, 0)
            # Rematerialisation: the backward sent ONLY dO (Q, K, V once, at forward).
            elem = np.dtype(spec.host_dtype(dfa.Q)).itemsize
            self.assertEqual(s.uploaded_bytes, {
                dfa.Q: q.size * elem, dfa.K: k.size * elem, dfa.V: v.size * elem,
                dfa.DO: do.size * elem})
        f = lambda x: dfa.to_float(x, spec.dtype)
        O, L = ref.attention_forward(f(q), f(k), f(v), spec.causal, spec.scale)
        dQ, dK, dV = ref.attention_backward(f(q), f(k), f(v), f(do), spec.causal, spec.scale)
        for name, got, want, dt in (("O", f(o), O, spec.dtype), ("LSE", lse, L, "f32"),
                                    ("dQ", f(dq), dQ, spec.dtype), ("dK", f(dk), dK, spec.dtype),
                                    ("dV", f(dv), dV, spec.dtype)):
            r = ref.compare(name, got, want, dt)
            print("  %s %s: %s" % (spec.dtype, "causal" if spec.causal else "full",
                                   ref.format_result(r)))
            self.assertTrue(r["ok"], ref.format_result(r))

    def test_bf16_causal_gqa_forward_backward(self):
        self.check_job(dfa.AttentionSpec(batch=2, seq_len=192, q_heads=4, kv_heads=2, head_dim=32,
                                         causal=True, dtype="bf16"))

    def test_f32_full_odd_length_ring_explicit_scale(self):
        self.check_job(dfa.AttentionSpec(batch=1, seq_len=131, q_heads=2, kv_heads=1, head_dim=16,
                                         causal=False, dtype="f32", softmax_scale=0.3),
                       schedule="ring")

    def test_bf16_causal_gqa_head_split(self):
        # Schedule "heads": each worker holds all rows of half the kv heads; the client's scatter
        # and gather slice heads (ShardPlacement.q_heads / kv_heads).
        self.check_job(dfa.AttentionSpec(batch=2, seq_len=160, q_heads=4, kv_heads=2, head_dim=32,
                                         causal=True, dtype="bf16"), schedule="heads")

    def test_f32_full_head_split_auto(self):
        self.check_job(dfa.AttentionSpec(batch=1, seq_len=97, q_heads=6, kv_heads=2, head_dim=16,
                                         causal=False, dtype="f32"), schedule="auto")

    def test_f16_zigzag_two_clients_at_once(self):
        errors = []

        def run(seed):
            try:
                c = dfa.Client(CLUSTER.coordinator_address, job_timeout=60)
                spec = dfa.AttentionSpec(batch=1, seq_len=128, q_heads=2, head_dim=16, dtype="f16")
                q, k, v, do = random_inputs(spec, seed)
                with c.create_session(spec, schedule="zigzag") as s:
                    o, _ = s.forward(q, k, v)
                f = lambda x: dfa.to_float(x, "f16")
                r = ref.compare("O", f(o), ref.attention_forward(f(q), f(k), f(v))[0], "f16")
                if not r["ok"]:
                    errors.append(ref.format_result(r))
                c.close()
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])

    # -- bad inputs --------------------------------------------------------------------------
    def test_bad_specs_rejected_on_client_naming_field(self):
        cases = [(dict(batch=0), "batch"), (dict(seq_len=-4), "seq_len"),
                 (dict(q_heads=6, kv_heads=4), "q_heads"), (dict(dtype="int8"), "dtype"),
                 (dict(head_dim=2.5), "head_dim"), (dict(softmax_scale=-1.0), "softmax_scale")]
        for override, field in cases:
            fields = dict(batch=1, seq_len=64, q_heads=2, head_dim=16)
            fields.update(override)
            with self.assertRaisesRegex(ValueError, "^" + field + ":"):
                CLIENT.create_session(**fields)
        with self.assertRaisesRegex(ValueError, "^schedule:"):
            CLIENT.create_session(batch=1, seq_len=64, q_heads=2, head_dim=16, schedule="fastest")
        with self.assertRaisesRegex(ValueError, "^coordinator:"):
            dfa.Client("no-port")

    def test_service_rejects_what_only_it_knows(self):
        with self.assertRaises(dfa.DfaError) as cm:
            CLIENT.create_session(batch=1, seq_len=64, q_heads=2, head_dim=1000)
        self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("head_dim", cm.exception.details)
        with self.assertRaises(dfa.DfaError) as cm:
            CLIENT.create_session(batch=1, seq_len=1 << 30, q_heads=2, head_dim=16)
        self.assertIn(cm.exception.code, (grpc.StatusCode.INVALID_ARGUMENT,
                                          grpc.StatusCode.RESOURCE_EXHAUSTED))
        self.assertIn("seq_len", cm.exception.details)

    def test_bad_arrays_and_protocol_misuse(self):
        spec = dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=16, dtype="bf16")
        q, k, v, do = random_inputs(spec, 1)
        with CLIENT.create_session(spec) as s:
            with self.assertRaisesRegex(ValueError, r"^K: shape \(1, 64, 2, 8\)"):
                s.forward(q, k[..., :8].copy(), v)
            self.assertEqual(s.uploaded_bytes, {})  # nothing was sent
            with self.assertRaisesRegex(ValueError, "^Q: dtype float32"):
                s.upload(dfa.Q, q.astype(np.float32))
            with self.assertRaisesRegex(ValueError, "^kind:"):
                s.upload(dfa.O, q)
            # Backward before forward: the coordinator refuses it.
            s.upload(dfa.DO, do)
            with self.assertRaises(dfa.DfaError) as cm:
                s.run("backward")
            self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
            # A chunk whose checksum does not match its data: DATA_LOSS from the worker.
            from dfa.client import attention_pb2
            b, e = s.ranges[0][0]
            data = q[0, b:e].tobytes()
            chunk = attention_pb2.TensorChunk(kind=dfa.Q, rows=attention_pb2.RowRange(begin=b, end=e),
                                              batch_index=0, data=data, crc32c=crc32c(data) ^ 1)
            with self.assertRaises(dfa.DfaError) as cm:
                s.upload_chunks(0, [chunk])
            self.assertEqual(cm.exception.code, grpc.StatusCode.DATA_LOSS)
            self.assertIn("crc32c", cm.exception.details)
            # Rows owned by the other worker.
            b1, e1 = s.ranges[1][0]
            data = q[0, b1:e1].tobytes()
            chunk = attention_pb2.TensorChunk(kind=dfa.Q, rows=attention_pb2.RowRange(begin=b1, end=e1),
                                              batch_index=0, data=data, crc32c=crc32c(data))
            with self.assertRaises(dfa.DfaError) as cm:
                s.upload_chunks(0, [chunk])
            self.assertIn(cm.exception.code, (grpc.StatusCode.OUT_OF_RANGE,
                                              grpc.StatusCode.INVALID_ARGUMENT))
            self.assertIn("rows", cm.exception.details)
            # A foreign client may not use the session.
            other = dfa.Client(CLUSTER.coordinator_address)
            with self.assertRaises(dfa.DfaError) as cm:
                _foreign(s, other).submit("forward")
            self.assertIn(cm.exception.code, (grpc.StatusCode.PERMISSION_DENIED,
                                              grpc.StatusCode.NOT_FOUND))
            other.close()
        with self.assertRaisesRegex(ValueError, "was released"):
            s.upload(dfa.Q, q)
        # The cluster still serves a good job afterwards.
        with CLIENT.create_session(spec) as s2:
            o, _ = s2.forward(q, k, v, download_lse=False)
            self.assertTrue(np.isfinite(dfa.from_bf16(o)).all())

    # -- torch ---------------------------------------------------------------------------------
    def test_torch_autograd_function(self):
        if torch is None:
            print("SKIP test_torch_autograd_function: " + TORCH_WHY)
            self.skipTest(TORCH_WHY)
        spec = dfa.AttentionSpec(batch=1, seq_len=96, q_heads=4, kv_heads=2, head_dim=16,
                                 dtype="bf16")
        qn, kn, vn, don = random_inputs(spec, 7)
        to_t = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).requires_grad_()
        q, k, v = to_t(qn), to_t(kn), to_t(vn)
        do = torch.from_numpy(don.view(np.int16)).view(torch.bfloat16)
        before = CLIENT.status().sessions
        out = distributed_attention(q, k, v, CLIENT, causal=True)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertEqual(tuple(out.shape), spec.shape(dfa.O))
        out.backward(do)
        self.assertEqual(CLIENT.status().sessions, before)  # released after backward
        f = lambda x: dfa.to_float(x, "bf16")
        tf = lambda t: t.detach().float().numpy().astype(np.float64)
        O, _ = ref.attention_forward(f(qn), f(kn), f(vn), True)
        dQ, dK, dV = ref.attention_backward(f(qn), f(kn), f(vn), f(don), True)
        for name, got, want in (("O", tf(out), O), ("dQ", tf(q.grad), dQ), ("dK", tf(k.grad), dK),
                                ("dV", tf(v.grad), dV)):
            r = ref.compare(name, got, want, "bf16")
            print("  torch " + ref.format_result(r))
            self.assertTrue(r["ok"], ref.format_result(r))
        with self.assertRaisesRegex(ValueError, "^k, v: dtypes"):
            distributed_attention(q, k.float(), v, CLIENT)
        if torch.cuda.is_available():  # GPU tensors are staged through host memory
            qc, kc, vc = (t.detach().cuda().requires_grad_() for t in (q, k, v))
            outc = distributed_attention(qc, kc, vc, CLIENT, causal=True)
            outc.backward(do.cuda())
            self.assertEqual(qc.grad.device, qc.device)
            for name, got, want in (("O", outc, out), ("dQ", qc.grad, q.grad),
                                    ("dK", kc.grad, k.grad), ("dV", vc.grad, v.grad)):
                self.assertTrue(torch.equal(got.cpu(), want), name + " on cuda differs from cpu")
            print("  torch cuda tensors: O, dQ, dK, dV equal to the cpu-tensor run")


def _foreign(session, other_client):
    """The same session id driven by another client (a different client_id)."""
    s = object.__new__(dfa.Session)
    s.__dict__.update(session.__dict__)
    s.client = other_client
    return s


if __name__ == "__main__":
    print("dfa python tests: binaries %s; torch %s" % (
        "found" if not BINARIES_WHY else "MISSING (" + BINARIES_WHY + ")",
        torch.__version__ if torch else "absent"))
    unittest.main(verbosity=2)
