"""dfa.torch on a GPU: CUDA tensors to a cudnn worker on the same GPU by CUDA IPC, results back
into CUDA tensors, no host copy. Real processes: a coordinator and one dfa-worker whose device
pool is limited (--device_memory_limit=0.3, so this process's torch shares the GPU).

  * the worker's memory limit is what the flag asked (30% of the device, in 2 MiB pages);
  * handles: the 64-byte cudaIpcMemHandle of the caching allocator's whole block (two places in
    one block share it, at their offsets), not torch's 66-byte _share_cuda_ handle (which the
    worker refuses, naming tensor.cuda_ipc_handle: see the bad inputs);
  * one layer (S 4096, 32/8 heads, D 128, bf16, causal) forward + backward against SDPA within
    bf16 tolerance, every byte by CUDA IPC (stats: ipc_bytes > 0, host_bytes == 0);
  * the bound tensors of dfa._dfa.DeviceAttentionJob (Worker.BindDeviceTensors): no transfer
    rpc after the first step, the inputs' new values read by every job, a new output rebound;
  * the example GPT (client/python/examples/train_gpt.py) trained on the GPU through the worker
    beside local SDPA: the loss curves agree within bf16 tolerance at every step, IPC used, one
    session per layer;
  * bad inputs from Python: wrong dtype, non-dense head strides, an allocation shorter than the
    tensor, a handle nobody can open, another host's boot id: each a clear error naming the
    field, and the worker keeps serving (a correct layer after them).

Skips (exit 77, ctest SKIP_RETURN_CODE) without torch, a visible GPU, or an extension built
with CUDA. Run: DFA_BIN_DIR=<bin> PYTHONPATH=<package> python3 tests/gpu/service/torch_ipc_test.py
"""

import importlib.util
import os
import sys
import unittest

try:
    import torch
    from torch_layer import layer_inputs, max_rel, sdpa_reference  # this directory
except ImportError:
    torch = None

import dfa
import dfa.torch
from dfa import _dfa, cuda_ipc


def skip_reason():
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    if not getattr(_dfa, "HAVE_CUDA", False):
        return "dfa._dfa was built without CUDA"
    return ""


_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
MEMORY_FRACTION = 0.3


def load_example():
    spec = importlib.util.spec_from_file_location(
        "train_gpt", os.path.join(_ROOT, "client", "python", "examples", "train_gpt.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class TorchIpcTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = dfa.LocalCluster(
            workers=1, backend="cudnn",
            worker_args=["--device_memory_limit=%s" % MEMORY_FRACTION])
        cls.client = dfa.Client(cls.cluster.coordinator_address, rpc_timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_worker_memory_is_limited(self):
        total = torch.cuda.get_device_properties(0).total_memory
        (w,) = self.client.list_workers()
        want = int(MEMORY_FRACTION * total) & ~((2 << 20) - 1)
        self.assertEqual(w["memory_limit_bytes"], want, w)

    def test_handle_is_the_whole_blocks_64_bytes(self):
        # A small tensor lives inside one of the caching allocator's 2 MiB cudaMalloc blocks;
        # two places in it share the block's handle.
        t = torch.empty(8192, device="cuda", dtype=torch.uint8)
        a, b = t[:1024], t[4096:]
        ea, eb = _dfa.export_cuda_ipc(a.data_ptr()), _dfa.export_cuda_ipc(b.data_ptr())
        self.assertEqual(len(ea["handle"]), 64)
        self.assertGreaterEqual(ea["allocation_bytes"], 2 << 20)
        # Same block: one handle, and both offsets lead back to the block's base.
        self.assertEqual(ea["handle"], eb["handle"])
        self.assertEqual(a.data_ptr() - ea["offset"], b.data_ptr() - eb["offset"])
        self.assertNotEqual(ea["offset"], eb["offset"])

    def check_layer(self, attn, s):
        q, k, v, do = layer_inputs(s)
        o = attn(q, k, v)
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        ro, rdq, rdk, rdv = sdpa_reference(q, k, v, do)
        for name, got, want in (("O", o, ro), ("dQ", dq, rdq), ("dK", dk, rdk), ("dV", dv, rdv)):
            self.assertTrue(got.is_cuda, name)
            self.assertLess(max_rel(got, want), 2e-2, name)

    def test_layer_through_ipc_matches_sdpa(self):
        attn = dfa.torch.Attention(self.client, is_causal=True, enable_gqa=True, path="ipc")
        try:
            for _ in range(2):  # the second step reuses the session and the mapped blocks
                self.check_layer(attn, 4096)
            st = attn.stats
            self.assertGreater(st["ipc_bytes"], 0, st)
            self.assertEqual(st["host_bytes"], 0, st)
            self.assertEqual(st["sessions"], 1, st)
            self.assertEqual(st["ipc_fallbacks"], 0, st)
        finally:
            attn.release()

    def test_bound_tensors_move_inside_the_jobs(self):
        """DeviceAttentionJob binds its tensors to the session's jobs: after the first step a
        step sends no transfer rpc, the workers still read the inputs' current values at every
        job, and a new output tensor is rebound (one request) and written."""
        from dfa.torch import _device
        spec = dfa.AttentionSpec(batch=1, seq_len=2048, q_heads=32, kv_heads=8, head_dim=128,
                                 dtype="bf16", causal=True)
        q, k, v, do = (t.detach() for t in layer_inputs(2048, seed=3))
        o, dq, dk, dv = (torch.empty_like(t) for t in (q, q, k, v))
        job = _dfa.DeviceAttentionJob(self.client._c, spec.as_dict())
        ref = _device.ref
        try:
            def step(out):
                job.forward(ref(q), ref(k), ref(v), ref(out))
                f = job.last_times
                job.backward(ref(do), ref(dq), ref(dk), ref(dv))
                return f, job.last_times

            f, b = step(o)
            self.assertEqual((f["requests"], b["requests"]), (1, 1), (f, b))
            f, b = step(o)
            self.assertEqual((f["requests"], b["requests"]), (0, 0), (f, b))
            self.assertGreater(f["job_transfer"], 0, f)
            self.assertEqual(f["bytes"], (q.nbytes + k.nbytes + v.nbytes + o.nbytes), f)
            self.assertEqual(b["bytes"], (do.nbytes + dq.nbytes + dk.nbytes + dv.nbytes), b)
            # New values in the same memory are read by the next jobs; a new O is rebound.
            q.mul_(0.5)
            o2 = torch.empty_like(o)
            f, b = step(o2)
            self.assertEqual((f["requests"], b["requests"]), (1, 0), (f, b))
            qg = q.clone().requires_grad_()
            ro, rdq, rdk, rdv = sdpa_reference(qg, k, v, do)
            for name, got, want in (("O", o2, ro), ("dQ", dq, rdq), ("dK", dk, rdk),
                                    ("dV", dv, rdv)):
                self.assertLess(max_rel(got, want), 2e-2, name)
        finally:
            job.release()

    def test_example_gpt_trains_on_the_gpu_through_ipc(self):
        train_gpt = load_example()
        args = train_gpt.parser().parse_args(
            ["--device", "cuda", "--dtype", "bf16", "--steps", "8", "--seq", "512",
             "--d-model", "256", "--heads", "4", "--kv-heads", "2", "--path", "ipc",
             "--coordinator", self.cluster.coordinator_address])
        r = train_gpt.run(args)
        tol = train_gpt.tolerance("bf16")
        for step, (a, b) in enumerate(zip(r["local"], r["service"])):
            self.assertLessEqual(abs(a - b), tol, "step %d: local %.5f service %.5f" % (step, a, b))
        self.assertLess(r["service"][-1], r["service"][0])
        for st in r["layer_stats"]:
            self.assertGreater(st["ipc_bytes"], 0, st)
            self.assertEqual(st["host_bytes"], 0, st)
            self.assertEqual(st["sessions"], 1, st)

    def test_bad_inputs_name_the_field_and_the_worker_keeps_serving(self):
        spec = dfa.AttentionSpec(batch=1, seq_len=4096, q_heads=8, kv_heads=8, head_dim=64,
                                 dtype="bf16", causal=True)
        shape = (1, 4096, 8, 64)
        with self.client.create_session(spec) as s:
            f16 = torch.zeros(shape, device="cuda", dtype=torch.float16)
            with self.assertRaisesRegex(dfa.InvalidArgumentError, r"tensor\.dtype = DTYPE_F16"):
                cuda_ipc.upload_device(s, dfa.Q, f16)
            bhsd = torch.zeros(1, 8, 4096, 64, device="cuda", dtype=torch.bfloat16)
            with self.assertRaisesRegex(dfa.InvalidArgumentError, r"tensor\.strides\[2\]"):
                cuda_ipc.upload_device(s, dfa.Q, bhsd.transpose(1, 2))
            b, e = s.ranges[0][0]  # one worker: it owns the whole sequence
            dense = [4096 * 8 * 64, 8 * 64, 64, 1]
            small = torch.empty(1024, device="cuda", dtype=torch.uint8)
            short = _dfa.export_cuda_ipc(small.data_ptr())
            self.assertLess(short["allocation_bytes"], 4096 * 8 * 64 * 2)
            boot = _dfa.host_boot_id()

            def raw(handle, host=boot):
                with self.assertRaises(dfa.DfaError) as cm:
                    _dfa.device_transfer(s._s, 0, dfa.Q, list(shape), dense, "bf16", handle, b, e,
                                         True, host)
                return cm.exception

            err = raw(short["handle"])
            self.assertEqual(err.code, "INVALID_ARGUMENT", err)
            self.assertIn("tensor.offset", err.details)
            self.assertIn("past the end of the allocation", err.details)
            err = raw(os.urandom(64))
            self.assertEqual(err.code, "FAILED_PRECONDITION", err)
            self.assertIn("tensor.cuda_ipc_handle cannot be opened", err.details)
            err = raw(short["handle"], host="another-host-boot-id")
            self.assertEqual(err.code, "FAILED_PRECONDITION", err)
            self.assertIn("host_id = 'another-host-boot-id'", err.details)
            err = raw(b"x" * 66)
            self.assertEqual(err.code, "INVALID_ARGUMENT", err)
            self.assertIn("tensor.cuda_ipc_handle has 66 bytes", err.details)
        # The worker still serves: a correct layer right after.
        attn = dfa.torch.Attention(self.client, is_causal=True, enable_gqa=True, path="ipc")
        try:
            self.check_layer(attn, 2048)
        finally:
            attn.release()


if __name__ == "__main__":
    why = skip_reason()
    if why:
        print("SKIPPED: %s" % why)
        sys.exit(77)
    unittest.main(verbosity=2)
