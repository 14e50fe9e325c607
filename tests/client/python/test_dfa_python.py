"""Tests of the Python package `dfa` (client/python: the binding of the C++ client library)
against real daemons on loopback.

Starts one dfa-coordinator and 2 CPU dfa-workers from the build tree ($DFA_BIN_DIR) through
dfa.LocalCluster, then: the numpy path (forward + backward vs a numpy fp64 reference; bf16 GQA
causal, f32 full with the ring schedule, head splits, both data planes), rematerialisation
(backward uploads only dO), bad inputs (errors naming the argument; the service's codes), and the
torch API (dfa.torch.attention and dfa.torch.Attention against torch's SDPA: layouts, GQA,
sessions kept across steps, accumulation, inference_mode, torch.compile, autocast, threads).

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/integration/python_client_test.py
(ctest python_client_test does that). numpy and torch are required (./dfa.sh setup installs them).
"""

import os
import threading
import time
import unittest

import numpy as np
import torch
import torch.nn.functional as F

import dfa
import dfa.torch
from dfa import _dfa
from dfa import reference as ref

CLUSTER = None
CLIENT = None


def setUpModule():
    global CLUSTER, CLIENT
    CLUSTER = dfa.LocalCluster(workers=2, threads_per_worker=1)
    CLIENT = dfa.Client(CLUSTER.coordinator_address, rpc_timeout=30, job_timeout=60)


def tearDownModule():
    if CLUSTER:
        CLUSTER.stop()  # raises when a daemon did not stop cleanly


def random_inputs(spec, seed):
    rng = np.random.default_rng(seed)
    mk = lambda kind: dfa.from_float(rng.uniform(-1, 1, spec.shape(kind)), spec.dtype)
    return mk(dfa.Q), mk(dfa.K), mk(dfa.V), mk(dfa.DO)


class OfflineTest(unittest.TestCase):
    """Pieces that need no cluster."""

    def test_crc32c_known_vector(self):
        self.assertEqual(_dfa.crc32c(b"123456789"), 0xE3069283)

    def test_bf16_round_trip_and_rounding(self):
        x = np.array([1.0, -2.5, 3.140625, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, np.inf], np.float32)
        back = dfa.from_bf16(dfa.to_bf16(x))
        # 1+2^-8 is a tie -> even (1.0); 1+3*2^-8 is a tie -> even (1+2^-6).
        np.testing.assert_array_equal(back, [1.0, -2.5, 3.140625, 1.0, 1.0 + 2 ** -6, np.inf])
        self.assertTrue(np.isnan(dfa.from_bf16(dfa.to_bf16(np.array([np.nan], np.float32))))[0])

    def test_spec_errors_are_the_services(self):
        cases = [(dict(batch=0), "spec.batch: must be >= 1, got 0"),
                 (dict(seq_len=-4), "spec.seq_len: must be >= 1, got -4"),
                 (dict(q_heads=6, kv_heads=4), "spec.q_heads: must be a multiple of kv_heads (4), got 6"),
                 (dict(dtype="int8"), "spec.dtype: must be bf16, f16 or f32, got 'int8'"),
                 (dict(head_dim=2.5), "spec.head_dim: must be an integer, got 2.5"),
                 (dict(softmax_scale=-1.0), "spec.softmax_scale: must be finite and >= 0")]
        for override, message in cases:
            fields = dict(batch=1, seq_len=64, q_heads=2, head_dim=16)
            fields.update(override)
            with self.assertRaises(ValueError) as cm:
                dfa.AttentionSpec(**fields)
            self.assertIsInstance(cm.exception, dfa.InvalidArgumentError)
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
            self.assertIn(message, str(cm.exception))

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
            self.assertAlmostEqual(grad[idx], (loss(*args_p) - loss(*args_m)) / (2 * eps), places=6)

    def test_unreachable_coordinator_names_the_address_within_the_deadline(self):
        c = dfa.Client("127.0.0.1:1", rpc_timeout=2)
        t = time.monotonic()
        with self.assertRaises(dfa.DfaError) as cm:
            c.status()
        self.assertLess(time.monotonic() - t, 10)
        self.assertIn(cm.exception.code, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        self.assertIn("127.0.0.1:1", str(cm.exception))
        with self.assertRaisesRegex(ValueError, "^INVALID_ARGUMENT: coordinator: expected host:port"):
            dfa.Client("no-port")


class TorchArgumentTest(unittest.TestCase):
    """The op refuses inputs that do not match the declared layout, naming the argument; nothing
    reaches the service (the client below points nowhere)."""

    def setUp(self):
        self.c = dfa.Client("127.0.0.1:1", rpc_timeout=1)

    def refuses(self, message, *args, **kw):
        kw.setdefault("client", self.c)
        with self.assertRaises(ValueError) as cm:
            dfa.torch.attention(*args, **kw)
        self.assertIn(message, str(cm.exception))

    def test_refusals(self):
        q = torch.randn(1, 64, 4, 16)
        k = torch.randn(1, 64, 2, 16)
        sdpa = torch.randn(1, 8, 128, 16)  # [B, H, S, D] passed as the default "bshd"
        self.refuses("q: layout 'bshd' reads shape (1, 8, 128, 16) as 8 positions and 128 heads: "
                     "more heads than positions", sdpa, sdpa, sdpa)
        self.refuses("k: 3 key/value heads do not divide q's 4 heads", q, torch.randn(1, 64, 3, 16),
                     torch.randn(1, 64, 3, 16), enable_gqa=True)
        self.refuses("k: 2 key/value heads differ from q's 4 heads; pass enable_gqa=True", q, k, k)
        self.refuses("v: shape (1, 64, 2, 8) differs from k's (1, 64, 2, 16)", q, k,
                     torch.randn(1, 64, 2, 8), enable_gqa=True)
        self.refuses("k: shape (1, 32, 2, 16) does not match q's batch 1, 64 positions", q,
                     torch.randn(1, 32, 2, 16), torch.randn(1, 32, 2, 16), enable_gqa=True)
        self.refuses("k: dtype torch.float64 differs from q's torch.float32", q, k.double(), k,
                     enable_gqa=True)
        self.refuses("q: dtype torch.float64 is not supported", q.double(), k.double(), k.double(),
                     enable_gqa=True)
        self.refuses("q: expected 4 dimensions (bshd), got shape (64, 4, 16)", q[0], k, k)
        self.refuses("layout: must be 'bshd'", q, q, q, layout="sbhd")
        self.refuses("scale: must be a positive number or None", q, q, q, scale=-1.0)
        self.refuses("client: None; pass a dfa.Client", q, q, q, client=None)
        self.refuses("client: expected a dfa.Client, got str", q, q, q, client="127.0.0.1:1")
        if torch.cuda.is_available():
            self.refuses("k: device cuda:0 differs from q's cpu", q, k.cuda(), k, enable_gqa=True)


class ServiceTest(unittest.TestCase):

    def check_job(self, spec, schedule="", path="auto"):
        q, k, v, do = random_inputs(spec, seed=spec.seq_len)
        with CLIENT.create_session(spec, schedule=schedule) as s:
            self.assertEqual(s.num_workers, 2)
            if schedule == "heads":  # two head groups: each worker holds its own kv heads
                self.assertEqual(sorted(h[1] for h in s.heads),
                                 [(0, spec.kv_heads // 2), (spec.kv_heads // 2, spec.kv_heads)])
            for kind, a in ((dfa.Q, q), (dfa.K, k), (dfa.V, v)):
                s.upload(kind, a, path=path)
            fwd = s.run("forward")
            o, lse = s.download(dfa.O, path=path), s.download(dfa.LSE, path=path)
            s.upload(dfa.DO, do, path=path)
            s.run("backward")
            dq, dk, dv = (s.download(kind, path=path) for kind in (dfa.DQ, dfa.DK, dfa.DV))
            self.assertEqual(fwd["state"], "JOB_SUCCEEDED")
            self.assertEqual(len(fwd["workers"]), 2)
            self.assertGreater(fwd["flops"], 0)
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
            print("  %s %s %s: %s" % (spec.dtype, "causal" if spec.causal else "full", path,
                                      ref.format_result(r)))
            self.assertTrue(r["ok"], ref.format_result(r))

    def test_bf16_causal_gqa_forward_backward_shared_memory(self):
        self.check_job(dfa.AttentionSpec(batch=2, seq_len=192, q_heads=4, kv_heads=2, head_dim=32,
                                         causal=True, dtype="bf16"), path="shm")

    def test_bf16_causal_gqa_forward_backward_grpc(self):
        self.check_job(dfa.AttentionSpec(batch=2, seq_len=192, q_heads=4, kv_heads=2, head_dim=32,
                                         causal=True, dtype="bf16"), path="grpc")

    def test_f32_full_odd_length_ring_explicit_scale(self):
        self.check_job(dfa.AttentionSpec(batch=1, seq_len=131, q_heads=2, kv_heads=1, head_dim=16,
                                         causal=False, dtype="f32", softmax_scale=0.3),
                       schedule="ring", path="grpc")

    def test_bf16_causal_gqa_head_split(self):
        self.check_job(dfa.AttentionSpec(batch=2, seq_len=160, q_heads=4, kv_heads=2, head_dim=32,
                                         causal=True, dtype="bf16"), schedule="heads")

    def test_f32_full_head_split_auto(self):
        self.check_job(dfa.AttentionSpec(batch=1, seq_len=97, q_heads=6, kv_heads=2, head_dim=16,
                                         causal=False, dtype="f32"), schedule="auto", path="grpc")

    def test_torch_cpu_tensors_upload_in_place(self):
        # torch CPU tensors cross through DLPack without a copy; bf16 as torch.bfloat16.
        spec = dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=16, dtype="bf16")
        q, k, v = (torch.randn(spec.shape(dfa.Q)).bfloat16() for _ in range(3))
        with CLIENT.create_session(spec) as s:
            o, _ = s.forward(q, k, v, download_lse=False)
        want = F.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)),
                                              is_causal=True).transpose(1, 2)
        got = torch.from_numpy(o.view(np.int16)).view(torch.bfloat16).float()
        self.assertLess((got - want).abs().max().item(), 0.03)

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
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])

    # -- bad inputs --------------------------------------------------------------------------
    def test_bad_options_rejected_naming_the_argument(self):
        with self.assertRaisesRegex(ValueError, "schedule: 'fastest' is not one of"):
            CLIENT.create_session(batch=1, seq_len=64, q_heads=2, head_dim=16, schedule="fastest")
        with self.assertRaisesRegex(ValueError, "num_workers: must be >= 0, got -1"):
            CLIENT.create_session(batch=1, seq_len=64, q_heads=2, head_dim=16, num_workers=-1)

    def test_service_rejects_what_only_it_knows(self):
        with self.assertRaises(dfa.DfaError) as cm:
            CLIENT.create_session(batch=1, seq_len=64, q_heads=2, head_dim=1000)
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        self.assertIn("head_dim", cm.exception.details)
        with self.assertRaises(dfa.DfaError) as cm:
            CLIENT.create_session(batch=1, seq_len=1 << 30, q_heads=2, head_dim=16)
        self.assertIn(cm.exception.code, ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"))
        self.assertIn("seq_len", cm.exception.details)

    def test_bad_arrays_and_protocol_misuse(self):
        spec = dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=16, dtype="bf16")
        q, k, v, do = random_inputs(spec, 1)
        with CLIENT.create_session(spec) as s:
            with self.assertRaisesRegex(ValueError, r"K: shape \[1, 64, 2, 8\] does not match the "
                                                    r"session's \[1, 64, 2, 16\]"):
                s.forward(q, k[..., :8].copy(), v)
            self.assertEqual(s.uploaded_bytes, {})  # nothing was sent
            with self.assertRaisesRegex(ValueError, "Q: dtype float32 does not match the spec's "
                                                    "bfloat16"):
                s.upload(dfa.Q, q.astype(np.float32))
            with self.assertRaisesRegex(ValueError, "Q: must be C-contiguous"):
                s.upload(dfa.Q, np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3))
            with self.assertRaisesRegex(ValueError, "kind: uploads take Q, K, V or dO, got O"):
                s.upload(dfa.O, q)
            # Backward before forward: the coordinator refuses it.
            s.upload(dfa.DO, do)
            with self.assertRaises(dfa.DfaError) as cm:
                s.run("backward")
            self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
            # A chunk whose checksum does not match its data: DATA_LOSS from the worker.
            b, e = s.ranges[0][0]
            data = q[0, b:e].tobytes()
            with self.assertRaises(dfa.DfaError) as cm:
                s.upload_chunk(0, dfa.Q, 0, b, e, data, _dfa.crc32c(data) ^ 1)
            self.assertEqual(cm.exception.code, "DATA_LOSS")
            self.assertIn("crc32c", cm.exception.details)
            # Rows owned by the other worker.
            b1, e1 = s.ranges[1][0]
            data = q[0, b1:e1].tobytes()
            with self.assertRaises(dfa.DfaError) as cm:
                s.upload_chunk(0, dfa.Q, 0, b1, e1, data, _dfa.crc32c(data))
            self.assertIn(cm.exception.code, ("OUT_OF_RANGE", "INVALID_ARGUMENT"))
            self.assertIn("rows", cm.exception.details)
            # A foreign client may not use the session.
            other = dfa.Client(CLUSTER.coordinator_address)
            with self.assertRaises(dfa.DfaError) as cm:
                other.submit_job(s.id, "forward")
            self.assertIn(cm.exception.code, ("PERMISSION_DENIED", "NOT_FOUND"))
        with self.assertRaisesRegex(dfa.DfaError, "was released"):
            s.upload(dfa.Q, q)
        # The cluster still serves a good job afterwards.
        with CLIENT.create_session(spec) as s2:
            o, _ = s2.forward(q, k, v, download_lse=False)
            self.assertTrue(np.isfinite(dfa.from_bf16(o)).all())


def sdpa(q, k, v, is_causal, layout="bhsd"):
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o.transpose(1, 2) if layout == "bshd" else o


def leaves(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype).requires_grad_() for s in shapes]


class TorchTest(unittest.TestCase):
    """dfa.torch against torch's own SDPA on the same tensors (fp32: within 1e-5)."""

    def grads(self, fn, q, k, v, g):
        out = fn(q, k, v)
        return (out,) + torch.autograd.grad(out, (q, k, v), g)

    def assertClose(self, got, want, tol, what):
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = (a.float() - b.float()).abs().max().item()
            self.assertLess(err, tol, "%s %s: max |err| %.3g" % (what, name, err))

    def test_functional_layouts_gqa_masks(self):
        for layout, causal, shapes in (("bhsd", True, ((2, 4, 80, 16), (2, 2, 80, 16))),
                                       ("bshd", False, ((1, 96, 4, 16), (1, 96, 1, 16)))):
            q, k, v = leaves(*shapes, shapes[1])
            g = torch.randn_like(q)
            before = CLIENT.status()["sessions"]
            got = self.grads(lambda *a: dfa.torch.attention(*a, is_causal=causal, enable_gqa=True,
                                                            layout=layout, client=CLIENT), q, k, v, g)
            want = self.grads(lambda *a: sdpa(*a, causal, layout), q, k, v, g)
            self.assertClose(got, want, 1e-5, "%s causal=%s" % (layout, causal))
            self.assertEqual(CLIENT.status()["sessions"], before)  # released after backward

    def test_bf16_and_explicit_scale(self):
        q, k, v = leaves((1, 2, 64, 32), (1, 2, 64, 32), (1, 2, 64, 32), dtype=torch.bfloat16)
        g = torch.randn_like(q)
        got = self.grads(lambda *a: dfa.torch.attention(*a, scale=0.2, layout="bhsd",
                                                        client=CLIENT), q, k, v, g)
        want = self.grads(lambda *a: F.scaled_dot_product_attention(
            *(t.float() for t in a), scale=0.2), q, k, v, g.float())
        self.assertEqual(got[0].dtype, torch.bfloat16)
        self.assertEqual(got[1].dtype, torch.bfloat16)
        self.assertClose(got, want, 0.05, "bf16")

    def test_module_keeps_one_session_across_steps_and_accumulates(self):
        attn = dfa.torch.Attention(CLIENT, is_causal=True, layout="bhsd", enable_gqa=True)
        q, k, v = leaves((2, 4, 64, 16), (2, 2, 64, 16), (2, 2, 64, 16))
        g = torch.randn_like(q)
        want = self.grads(lambda *a: sdpa(*a, True), q, k, v, g)
        sessions = CLIENT.status()["sessions"]
        ids = set()
        for _ in range(3):
            self.assertClose(self.grads(attn, q, k, v, g), want, 1e-5, "step")
            ids.add(attn.session_id)
            self.assertEqual(CLIENT.status()["sessions"], sessions + 1)
        self.assertEqual(len(ids), 1)
        # Gradient accumulation: two micro-batches into .grad.
        for t in (q, k, v):
            t.grad = None
        for _ in range(2):
            attn(q, k, v).backward(g)
        self.assertClose((want[0], q.grad / 2, k.grad / 2, v.grad / 2), want, 1e-5, "accumulated")
        # The same module twice in one graph: the first backward re-runs its own forward.
        q2, k2, v2 = leaves((2, 4, 64, 16), (2, 2, 64, 16), (2, 2, 64, 16), seed=1)
        out = attn(q, k, v) + attn(q2, k2, v2)
        got = torch.autograd.grad(out, (q, k, v, q2, k2, v2), g)
        ref1 = torch.autograd.grad(sdpa(q, k, v, True) + sdpa(q2, k2, v2, True),
                                   (q, k, v, q2, k2, v2), g)
        for a, b in zip(got, ref1):
            self.assertLess((a - b).abs().max().item(), 1e-5)
        st = attn.stats
        self.assertEqual(st["sessions"], 1)
        self.assertEqual(st["reforwards"], 1)
        # inference_mode: forward only, nothing kept for a backward.
        with torch.inference_mode():
            self.assertLess((attn(q, k, v) - want[0]).abs().max().item(), 1e-5)
        self.assertEqual(attn.stats["sessions"], 1)
        attn.release()
        self.assertEqual(CLIENT.status()["sessions"], sessions)

    def test_two_layers_in_flight_and_in_parallel_threads(self):
        layers = [dfa.torch.Attention(CLIENT, is_causal=True, layout="bhsd") for _ in range(2)]
        q, k, v = leaves((1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 16))
        # Layer 1 runs on layer 0's output: both forward states live until the backward.
        out = layers[1](layers[0](q, k, v), k, v)
        got = torch.autograd.grad(out.sum(), (q, k, v))
        want = torch.autograd.grad(sdpa(sdpa(q, k, v, True), k, v, True).sum(), (q, k, v))
        for a, b in zip(got, want):
            self.assertLess((a - b).abs().max().item(), 1e-5)
        results = {}

        def run(i):
            results[i] = layers[i](q, k, v)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        for i in range(2):
            self.assertLess((results[i] - sdpa(q, k, v, True)).abs().max().item(), 1e-5)
        for m in layers:
            m.release()

    def test_compile_fullgraph_and_autocast(self):
        attn = dfa.torch.Attention(CLIENT, is_causal=True, layout="bhsd")
        q, k, v = leaves((1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 16))
        g = torch.randn_like(q)
        want = self.grads(lambda *a: sdpa(*a, True), q, k, v, g)

        def step(q, k, v):
            return attn(q, k, v) * 2.0

        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        got = self.grads(compiled, q, k, v, g)
        self.assertClose([t / 2 for t in got], want, 1e-5, "compiled")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attn(q, k, v)
        self.assertEqual(out.dtype, torch.bfloat16)
        self.assertLess((out.float() - want[0]).abs().max().item(), 0.03)
        grads = torch.autograd.grad(out.float(), (q, k, v), g)
        self.assertEqual(grads[0].dtype, torch.float32)  # back through the cast to fp32
        self.assertLess((grads[0] - want[1]).abs().max().item(), 0.05)
        attn.release()

    def test_double_backward_says_so(self):
        q, k, v = leaves((1, 2, 32, 16), (1, 2, 32, 16), (1, 2, 32, 16))
        out = dfa.torch.attention(q, k, v, layout="bhsd", client=CLIENT)
        (dq,) = torch.autograd.grad(out.sum(), q, create_graph=True)
        with self.assertRaisesRegex(RuntimeError, "double backward .* is not supported"):
            dq.sum().backward()

    def test_cuda_tensors_staged_through_host(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device here; the CPU-tensor cases above cover the op")
        q, k, v = leaves((1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 16))
        qc, kc, vc = (t.detach().cuda().requires_grad_() for t in (q, k, v))
        g = torch.randn_like(q)
        got = self.grads(lambda *a: dfa.torch.attention(*a, is_causal=True, layout="bhsd",
                                                        client=CLIENT), qc, kc, vc, g.cuda())
        self.assertEqual(got[1].device, qc.device)
        want = self.grads(lambda *a: sdpa(*a, True), q, k, v, g)
        self.assertClose([t.cpu() for t in got], want, 1e-5, "cuda")


if __name__ == "__main__":
    print("dfa python tests: torch %s, bin dir %s" % (torch.__version__, os.environ.get("DFA_BIN_DIR")))
    unittest.main(verbosity=2)
