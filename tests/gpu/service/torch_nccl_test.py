"""The NCCL device path from Python on two GPUs of one host: this process is the client rank on
GPU 0 (torch CUDA tensors), one cuda dfa-worker (a process of this build) on GPU 1. NCCL refuses
two ranks of one communicator on one GPU, hence two GPUs.

  * dfa.device_io with device_path="nccl": Q, K, V, dO sent and O, LSE, dQ, dK, dV received by
    NCCL, equal to local SDPA (bf16, causal, GQA) within bf16 tolerance; the client's one
    NcclTensorIo joins one group and a second session reuses it;
  * dfa.torch.Attention(device_path="nccl"): forward + backward of a layer from torch CUDA
    tensors for two steps against SDPA, every byte by NCCL (stats nccl_bytes > 0, ipc_bytes and
    host_bytes 0), one session, the client's group still the first;
  * device_path="auto" with the worker on this host: CUDA IPC (ipc_bytes > 0, nccl_bytes 0);
  * a worker that never answers its join (SIGSTOPped): the first NCCL transfer fails within
    the client's rpc and init timeouts (DEADLINE_EXCEEDED or UNAVAILABLE), and once it runs again
    a layer over NCCL is correct.

NCCL refuses a communicator whose ranks run different NCCL versions, so the workers are started
with the libnccl.so.2 this process loaded (torch's, dfa/_preload.py) first on LD_LIBRARY_PATH.

Skips (exit 77, ctest SKIP_RETURN_CODE) without torch, two visible GPUs or an extension built
with NCCL. Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3
tests/gpu/service/torch_nccl_test.py (ctest python_nccl_gpu_test).
"""

import os
import signal
import sys
import time
import unittest

try:
    import torch
    from torch_layer import layer_inputs, max_rel, sdpa_reference  # this directory
except ImportError:
    torch = None

import dfa
import dfa.torch
from dfa import _dfa, device_io

CLIENT_GPU = 0
WORKER_GPU = 1


def skip_reason():
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return "fewer than two CUDA devices visible to torch"
    if not getattr(_dfa, "HAVE_NCCL", False):
        return "dfa._dfa was built without NCCL"
    return ""


def nccl_of_this_process():
    """The path of the libnccl.so.2 mapped into this process (None: none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and os.path.basename(fields[-1]).startswith("libnccl.so"):
                return fields[-1]
    return None


class NcclGpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.cuda.set_device(CLIENT_GPU)
        lib = nccl_of_this_process()
        if lib:  # the daemons inherit it: the same NCCL on every rank
            os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
                p for p in (os.path.dirname(lib), os.environ.get("LD_LIBRARY_PATH")) if p)
            print("NCCL of this process and its workers: %s" % lib)
        cls.cluster = dfa.LocalCluster(
            workers=1, backend="cuda", start_timeout=90,
            worker_args=["--device=%d" % WORKER_GPU, "--device_memory_limit=0.25"])
        cls.client = dfa.Client(cls.cluster.coordinator_address, rpc_timeout=60,
                                nccl_init_timeout=30, nccl_transfer_timeout=30)
        cls.client.wait_ready(workers=1, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop(check=False)

    def check_layer(self, attn, s, seed=0):
        q, k, v, do = layer_inputs(s, hq=8, hkv=4, seed=seed)
        o = attn(q, k, v)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        ro, rdq, rdk, rdv = sdpa_reference(q, k, v, do)
        for name, got, want in (("O", o, ro), ("dQ", dq, rdq), ("dK", dk, rdk), ("dV", dv, rdv)):
            self.assertEqual(got.device, q.device, name)
            self.assertLess(max_rel(got, want), 2e-2, name)

    def test_attention_module_over_nccl_matches_sdpa(self):
        attn = dfa.torch.Attention(self.client, is_causal=True, enable_gqa=True,
                                   device_path="nccl")
        try:
            for step in range(2):
                self.check_layer(attn, 2048, seed=step)
            st = attn.stats
            self.assertGreater(st["nccl_bytes"], 0, st)
            self.assertEqual((st["ipc_bytes"], st["host_bytes"]), (0, 0), st)
            self.assertEqual(st["sessions"], 1, st)
            self.assertEqual(self.client.nccl_tensor_io().groups_joined, 1)
        finally:
            attn.release()

    def test_auto_takes_ipc_for_a_worker_on_this_host(self):
        attn = dfa.torch.Attention(self.client, is_causal=True, enable_gqa=True)
        try:
            self.check_layer(attn, 1024)
            st = attn.stats
            self.assertGreater(st["ipc_bytes"], 0, st)
            self.assertEqual((st["nccl_bytes"], st["host_bytes"]), (0, 0), st)
        finally:
            attn.release()

    def test_device_io_forward_backward_and_the_group_reused(self):
        s_len, hq, hkv, d = 2048, 8, 4, 128
        spec = dfa.AttentionSpec(batch=1, seq_len=s_len, q_heads=hq, kv_heads=hkv, head_dim=d,
                                 dtype="bf16", causal=True)
        q, k, v, do = (t.detach() for t in layer_inputs(s_len, hq=8, hkv=4, seed=5))
        o = torch.empty_like(q)
        lse = torch.empty(1, hq, s_len, device="cuda", dtype=torch.float32)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for _ in range(2):  # a second session reuses the first's group
            with self.client.create_session(spec) as s:
                moved = sum(device_io.upload_device(s, kind, t, device_path="nccl")
                            for kind, t in ((dfa.Q, q), (dfa.K, k), (dfa.V, v)))
                self.assertEqual(moved, q.nbytes + k.nbytes + v.nbytes)
                s.run("forward")
                device_io.download_device(s, dfa.O, o, device_path="nccl")
                device_io.download_device(s, dfa.LSE, lse, device_path="nccl")
                device_io.upload_device(s, dfa.DO, do, device_path="nccl")
                s.run("backward")
                for kind, t in ((dfa.DQ, dq), (dfa.DK, dk), (dfa.DV, dv)):
                    device_io.download_device(s, kind, t, device_path="nccl")
        group = device_io.nccl_group(self.client)
        self.assertIsNotNone(group)
        self.assertEqual((group["size"], group["client_rank"], len(group["workers"])), (2, 1, 1))
        self.assertEqual(self.client.nccl_tensor_io().groups_joined, 1)
        ro, rdq, rdk, rdv = sdpa_reference(q, k, v, do)
        for name, got, want in (("O", o, ro), ("dQ", dq, rdq), ("dK", dk, rdk), ("dV", dv, rdv)):
            self.assertLess(max_rel(got, want), 2e-2, name)
        # LSE (natural log of each query row's softmax denominator, scale 1/sqrt(D)).
        scores = torch.einsum("bshd,bthd->bhst", q.float(),
                              k.float().repeat_interleave(hq // hkv, dim=2)) / d ** 0.5
        scores.masked_fill_(torch.ones(s_len, s_len, device="cuda").triu(1).bool(), float("-inf"))
        self.assertLess((lse - torch.logsumexp(scores, dim=-1)).abs().max().item(), 1e-2)

    def test_worker_that_never_joins_is_bounded_and_then_serves(self):
        # A client of its own (a fresh NcclTensorIo: it must join), short bounds.
        c = dfa.Client(self.cluster.coordinator_address, rpc_timeout=5, nccl_init_timeout=3,
                       nccl_transfer_timeout=5)
        spec = dfa.AttentionSpec(batch=1, seq_len=1024, q_heads=8, kv_heads=4, head_dim=128,
                                 dtype="bf16", causal=True)
        q = layer_inputs(1024, hq=8, hkv=4)[0].detach()
        s = c.create_session(spec)
        self.cluster.kill_worker(0, signal.SIGSTOP)
        try:
            start = time.monotonic()
            with self.assertRaises(dfa.DfaError) as cm:
                device_io.upload_device(s, dfa.Q, q, device_path="nccl")
            took = time.monotonic() - start
        finally:
            self.cluster.kill_worker(0, signal.SIGCONT)
        self.assertIn(cm.exception.code, ("DEADLINE_EXCEEDED", "UNAVAILABLE"), cm.exception)
        self.assertLess(took, 5 + 3 + 10, cm.exception)
        self.assertIsNone(device_io.nccl_group(c))
        try:
            s.release()
        except dfa.DfaError:
            pass
        c.wait_ready(workers=1, timeout=60)
        attn = dfa.torch.Attention(c, is_causal=True, enable_gqa=True, device_path="nccl")
        try:
            self.check_layer(attn, 1024, seed=9)
            self.assertGreater(attn.stats["nccl_bytes"], 0, attn.stats)
        finally:
            attn.release()


if __name__ == "__main__":
    why = skip_reason()
    if why:
        print("SKIPPED: %s" % why)
        sys.exit(77)
    unittest.main(verbosity=2)
