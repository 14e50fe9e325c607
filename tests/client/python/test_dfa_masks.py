"""Packed documents and sliding windows through the Python package against real daemons.

Starts one dfa-coordinator and 3 CPU dfa-workers from the build tree ($DFA_BIN_DIR), then checks
dfa.torch.attention(..., cu_seqlens=..., window_size=...) forward and backward against torch's
SDPA given the same mask as an explicit boolean attn_mask (fp32: within 1e-4), with documents
crossing the workers' shards, per-row documents, GQA and the bhsd layout; dfa.torch.Attention
with a document layout per step; the numpy path (dfa.AttentionSpec with doc_offsets); and the
argument checks (errors naming cu_seqlens / window_size / spec.doc_offsets). A long document
crossing the shards (S = 12288): the layer's session gets the packed-document plan (the long
document striped over the 3 workers, read from dfa.torch.Attention.shards) and matches causal
SDPA inside each document. A coordinator with --max_documents=4 refuses 5 documents, naming
spec.doc_offsets and the flag, from a session and from the op.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/client/python/test_dfa_masks.py
(ctest python_mask_test does that).
"""

import unittest

import numpy as np
import torch
import torch.nn.functional as F

import dfa
import dfa.torch
from dfa import reference as ref

CLUSTER = None
CLIENT = None


def setUpModule():
    global CLUSTER, CLIENT
    CLUSTER = dfa.LocalCluster(workers=3, threads_per_worker=1)
    CLIENT = dfa.Client(CLUSTER.coordinator_address, rpc_timeout=30, job_timeout=60)


def tearDownModule():
    if CLUSTER:
        CLUSTER.stop()


def bool_mask(seq, offsets, causal, window):
    """[S, S] True where query i may attend to key j: same document, causal, window."""
    i = torch.arange(seq).view(-1, 1)
    j = torch.arange(seq).view(1, -1)
    doc = torch.zeros(seq, dtype=torch.long)
    if offsets is not None:
        for o in list(offsets)[1:-1]:
            doc[int(o):] += 1
    m = doc.view(-1, 1) == doc.view(1, -1)
    if causal:
        m &= j <= i
    left, right = window
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    return m


def leaves(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(s, generator=g, dtype=torch.float32).mul(2).sub(1).to(dtype)
            .requires_grad_() for s in shapes]


class TorchMaskTest(unittest.TestCase):

    def grads(self, fn, q, k, v, g):
        out = fn(q, k, v)
        return (out,) + torch.autograd.grad(out, (q, k, v), g)

    def assertClose(self, got, want, tol, what):
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = (a.float() - b.float()).abs().max().item()
            self.assertLess(err, tol, "%s %s: max |err| %.3g" % (what, name, err))

    def sdpa_bshd(self, masks, gqa):
        """SDPA on bshd tensors with one [S, S] boolean mask per batch row."""
        def fn(q, k, v):
            m = torch.stack(masks).unsqueeze(1)  # [B, 1, S, S]
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), attn_mask=m, enable_gqa=gqa)
            return o.transpose(1, 2)
        return fn

    def check(self, what, b, s, hq, hkv, cu, causal, window, per_row=None):
        q, k, v = leaves((b, s, hq, 16), (b, s, hkv, 16), (b, s, hkv, 16), seed=s + hq)
        g = torch.randn_like(q)
        rows = per_row if per_row is not None else [cu] * b
        masks = [bool_mask(s, r, causal, window) for r in rows]
        arg = [torch.tensor(r, dtype=torch.int32) for r in per_row] if per_row else (
            None if cu is None else torch.tensor(cu, dtype=torch.int32))
        got = self.grads(lambda *a: dfa.torch.attention(
            *a, is_causal=causal, enable_gqa=hkv != hq, cu_seqlens=arg, window_size=window,
            client=CLIENT), q, k, v, g)
        want = self.grads(self.sdpa_bshd(masks, hkv != hq), q, k, v, g)
        self.assertClose(got, want, 1e-4, what)
        # The mask mattered: plain causal / full attention differs.
        dense = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=causal,
                                               enable_gqa=hkv != hq).transpose(1, 2)
        self.assertGreater((dense - got[0]).abs().max().item(), 1e-2, what)

    def test_documents_crossing_shards_causal(self):
        # 1-token documents and documents longer than a shard of 3 workers.
        self.check("docs causal", 1, 300, 4, 4, [0, 1, 130, 131, 260, 300], True, (-1, -1))

    def test_documents_and_window_full_gqa(self):
        self.check("docs window full gqa", 1, 256, 4, 2, [0, 100, 101, 256], False, (20, 7))

    def test_window_only_causal(self):
        self.check("window causal", 1, 200, 2, 2, None, True, (33, -1))

    def test_per_row_documents_batch2(self):
        self.check("per-row docs", 2, 192, 2, 1, None, True, (50, 0),
                   per_row=[[0, 64, 65, 192], [0, 1, 2, 100, 192]])

    def test_one_offsets_tensor_for_every_row_bhsd(self):
        q, k, v = leaves((2, 2, 128, 16), (2, 2, 128, 16), (2, 2, 128, 16), seed=5)
        g = torch.randn_like(q)
        cu = torch.tensor([0, 50, 128], dtype=torch.int64)
        m = bool_mask(128, [0, 50, 128], True, (-1, -1))
        got = self.grads(lambda *a: dfa.torch.attention(*a, is_causal=True, layout="bhsd",
                                                        cu_seqlens=cu, client=CLIENT), q, k, v, g)
        want = self.grads(lambda *a: F.scaled_dot_product_attention(*a, attn_mask=m), q, k, v, g)
        self.assertClose(got, want, 1e-4, "bhsd")

    def test_module_with_documents_per_step(self):
        attn = dfa.torch.Attention(CLIENT, is_causal=True, window_size=(40, 0))
        try:
            for step, cu in enumerate(([0, 64, 160], [0, 10, 100, 160])):
                q, k, v = leaves((1, 160, 2, 16), (1, 160, 2, 16), (1, 160, 2, 16), seed=step)
                g = torch.randn_like(q)
                got = self.grads(lambda *a: attn(*a, cu_seqlens=torch.tensor(cu)), q, k, v, g)
                want = self.grads(self.sdpa_bshd([bool_mask(160, cu, True, (40, 0))], False),
                                  q, k, v, g)
                self.assertClose(got, want, 1e-4, "module step %d" % step)
        finally:
            attn.release()

    def test_refusals_name_the_argument(self):
        q = torch.randn(1, 64, 2, 16)
        c = dfa.Client("127.0.0.1:1", rpc_timeout=1)  # nothing reaches a service

        def refuses(message, **kw):
            with self.assertRaises(ValueError) as cm:
                dfa.torch.attention(q, q, q, client=c, **kw)
            self.assertIn(message, str(cm.exception))

        refuses("cu_seqlens[3] = 30 is not greater than cu_seqlens[2] = 40",
                cu_seqlens=torch.tensor([0, 20, 40, 30, 64]))
        refuses("cu_seqlens[0] = 1: the first offset must be 0", cu_seqlens=torch.tensor([1, 64]))
        refuses("cu_seqlens[2] = 60: the last offset must be the sequence length 64",
                cu_seqlens=torch.tensor([0, 30, 60]))
        refuses("cu_seqlens[1] = 70: an inner offset must be less than the sequence length 64",
                cu_seqlens=torch.tensor([0, 70, 80]))
        refuses("cu_seqlens[2] = 70: the last offset must be the sequence length 64",
                cu_seqlens=torch.tensor([0, 30, 70]))
        refuses("cu_seqlens: expected an integer tensor, got dtype torch.float32",
                cu_seqlens=torch.tensor([0.0, 64.0]))
        refuses("cu_seqlens: expected a 1-D integer tensor (every batch row) or one per batch "
                "row (1)", cu_seqlens=[torch.tensor([0, 64])] * 2)
        refuses("cu_seqlens[0][1] = 0 is not greater than cu_seqlens[0][0] = 0",
                cu_seqlens=[torch.tensor([0, 0, 64])])
        refuses("window_size: must be (left, right), integers >= -1", window_size=(-2, 0))
        refuses("window_size: must be (left, right), integers >= -1", window_size=8)


class NumpyMaskTest(unittest.TestCase):
    """dfa.AttentionSpec with documents and a window: the session computes the masked attention
    (checked here against numpy on the same bool mask) and the service's own checks word the
    errors."""

    def test_session_forward_backward_under_documents(self):
        offsets = ((0, 3, 90, 91, 128), (0, 64, 128))  # per batch row
        spec = dfa.AttentionSpec(batch=2, seq_len=128, q_heads=2, kv_heads=1, head_dim=8,
                                 dtype="f32", causal=True, doc_offsets=offsets, window_left=30)
        rng = np.random.default_rng(3)
        q, k, v, do = (rng.uniform(-1, 1, spec.shape(kind)).astype(np.float32)
                       for kind in (dfa.Q, dfa.K, dfa.V, dfa.DO))
        with CLIENT.create_session(spec, num_workers=3) as s:
            o, lse = s.forward(q, k, v)
            dq, dk, dv = s.backward(do)
        # The numpy reference's mask is the torch test's.
        np.testing.assert_array_equal(ref.mask_of(2, 128, True, offsets, (30, -1))[0, 0],
                                      bool_mask(128, offsets[0], True, (30, -1)).numpy())
        want_o, want_lse = ref.attention_forward(q, k, v, True, spec.scale, offsets, (30, -1))
        grads = ref.attention_backward(q, k, v, do, True, spec.scale, offsets, (30, -1))
        for name, got, want in (("O", o, want_o), ("LSE", lse, want_lse), ("dQ", dq, grads[0]),
                                ("dK", dk, grads[1]), ("dV", dv, grads[2])):
            r = ref.compare(name, got, want, "f32")
            self.assertTrue(r["ok"], ref.format_result(r))
        dense_o, _ = ref.attention_forward(q, k, v, True, spec.scale)
        self.assertGreater(np.abs(dense_o - want_o).max(), 1e-2)  # the mask mattered

    def test_spec_errors_are_the_services(self):
        with self.assertRaises(ValueError) as cm:
            dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=8,
                              doc_offsets=((0, 40, 30, 64),))
        self.assertIn("spec.doc_offsets[0][2]: must be greater than doc_offsets[0][1] = 40, got 30",
                      str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=8,
                              doc_offsets=((0, 70, 80, 90),))
        self.assertIn("spec.doc_offsets[0][1]: must be less than seq_len = 64, got 70",
                      str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=8, window_left=-2)
        self.assertIn("spec.window_left: must be >= 0 (or -1: unbounded), got -2",
                      str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=8, window_right=-4)
        self.assertIn("spec.window_right: must be >= 0 (or -1: unbounded), got -4",
                      str(cm.exception))
        spec = dfa.AttentionSpec(batch=2, seq_len=64, q_heads=2, head_dim=8,
                                 doc_offsets=[0, 10, 64])  # one row: every batch row
        self.assertEqual(spec.doc_offsets, ((0, 10, 64),))
        self.assertFalse(spec.dense)


def per_document_sdpa(cu, gqa):
    """Causal attention inside each document of `cu` (bshd): SDPA per document, concatenated;
    the mask of bool_mask(S, cu, True, (-1, -1)) without building an S x S mask."""
    def fn(q, k, v):
        outs = []
        for a, b in zip(cu[:-1], cu[1:]):
            outs.append(F.scaled_dot_product_attention(
                q[:, a:b].transpose(1, 2), k[:, a:b].transpose(1, 2), v[:, a:b].transpose(1, 2),
                is_causal=True, enable_gqa=gqa).transpose(1, 2))
        return torch.cat(outs, 1)
    return fn


def striped_holders(shards, begin, end):
    """How many workers hold rows of document [begin, end) when each holds a front range of it
    and that range's mirror (the middle one a single centred range), at least one both: the
    striped ring of the packed-document plan inside the document. 0 when not so."""
    holders, two = 0, False
    for shard in shards:
        inside = []
        for a, b in sorted(shard["owned"]):
            a, b = max(a, begin), min(b, end)
            if a >= b:
                continue
            if inside and inside[-1][1] == a:
                inside[-1] = (inside[-1][0], b)
            else:
                inside.append((a, b))
        if not inside:
            continue
        holders += 1
        (f0, f1), (b0, b1) = inside[0], inside[-1]
        if len(inside) > 2 or f0 - begin != end - b1:
            return 0
        if len(inside) == 2:
            if f1 - begin != end - b0:
                return 0
            two = True
    return holders if two else 0


class TorchDocumentPlanTest(unittest.TestCase):
    """A long document crossing the shards of the 3 workers, short and 1-token ones around it:
    the coordinator's balanced plan for the layer's session is the packed-document plan (the
    long document striped over the workers), and the op's forward and backward equal causal
    SDPA inside each document (fp32)."""

    def test_long_document_is_striped_and_exact(self):
        lengths = (37, 1, 10240, 500, 1, 1200, 309)
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        s = cu[-1]
        q, k, v = leaves((1, s, 2, 16), (1, s, 1, 16), (1, s, 1, 16), seed=11)
        g = torch.randn_like(q)
        attn = dfa.torch.Attention(CLIENT, is_causal=True, enable_gqa=True)
        try:
            self.assertEqual(attn.shards, ())
            out = attn(q, k, v, cu_seqlens=torch.tensor(cu, dtype=torch.int32))
            got = (out,) + torch.autograd.grad(out, (q, k, v), g)
            shards = attn.shards
        finally:
            attn.release()
        self.assertEqual(len(shards), 3)
        longest = lengths.index(max(lengths))
        holders = striped_holders(shards, cu[longest], cu[longest + 1])
        self.assertGreaterEqual(holders, 2, [sh["owned"] for sh in shards])
        # Contiguous shards (a sequence plan) would not stripe it.
        self.assertEqual(striped_holders([{"owned": [(0, 5000)]}, {"owned": [(5000, 8000)]},
                                          {"owned": [(8000, s)]}], cu[longest],
                                         cu[longest + 1]), 0)

        ref = per_document_sdpa(cu, gqa=True)(q, k, v)
        want = (ref,) + torch.autograd.grad(ref, (q, k, v), g)
        for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
            err = (a - b).abs().max().item()
            self.assertLess(err, 1e-4, "packed documents P=3 %s: max |err| %.3g" % (name, err))


class ServiceLimitTest(unittest.TestCase):
    """The coordinator's --max_documents, from Python: more packed documents than it allows is
    INVALID_ARGUMENT naming spec.doc_offsets and the flag, from a session and from the op."""

    def test_too_many_documents(self):
        cluster = dfa.LocalCluster(workers=1, threads_per_worker=1,
                                   coordinator_args=["--max_documents=4"])
        try:
            client = dfa.Client(cluster.coordinator_address, rpc_timeout=30, job_timeout=60)
            message = "spec.doc_offsets: must hold <= 4 documents in all (max_documents), got 5"
            offsets = (0, 10, 20, 30, 40, 64)
            spec = dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, head_dim=8, dtype="f32",
                                     doc_offsets=offsets)
            with self.assertRaises(dfa.InvalidArgumentError) as cm:
                client.create_session(spec)
            self.assertIn(message, str(cm.exception))
            q = torch.randn(1, 64, 2, 8)
            with self.assertRaises(dfa.InvalidArgumentError) as cm:
                dfa.torch.attention(q, q, q, cu_seqlens=torch.tensor(offsets), client=client)
            self.assertIn(message, str(cm.exception))
            # At the limit: computed.
            out = dfa.torch.attention(q, q, q, cu_seqlens=torch.tensor((0, 10, 20, 30, 64)),
                                      client=client)
            want = F.scaled_dot_product_attention(
                q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2),
                attn_mask=bool_mask(64, (0, 10, 20, 30, 64), False, (-1, -1))).transpose(1, 2)
            self.assertLess((out - want).abs().max().item(), 1e-4)
            client.close()
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
