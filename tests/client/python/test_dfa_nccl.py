"""The NCCL device path from Python where no GPU is needed (dfa/device_io.py, dfa.torch's
device_path, dfa._dfa.NcclTensorIo and choose_device_path over client/nccl_tensor_io.h):

  * device_path values other than "auto", "ipc", "nccl" are InvalidArgumentError naming
    device_path, in dfa.device_io, dfa.torch.attention and dfa.torch.Attention;
  * ChooseDevicePath through the extension: "ipc" only when every shard's host is this host's
    name — on placements given as shard dicts and on a real session of a LocalCluster (its cpu
    workers advertise this host: "ipc"; seen from another host name: "nccl");
  * dfa.torch's choice for a new layer under device_path="auto" (every live worker here: IPC);
  * one NcclTensorIo per Client, made at the first call and kept; bad timeouts name the field;
  * NCCL requested where this process sees no CUDA device: FAILED_PRECONDITION naming
    cudaGetDeviceCount's answer, within seconds, nothing sent; a CPU tensor: InvalidArgumentError
    naming tensor; a build without NCCL: UNIMPLEMENTED naming what it lacks.

A peer that never joins needs a GPU in this process (the client is an NCCL rank):
tests/gpu/service/torch_nccl_test.py (two GPUs) and tests/multigpu/nccl_client_group_test.cc
cover it.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python \
     python3 tests/client/python/test_dfa_nccl.py
(ctest python_nccl_test). torch (CPU is enough) is required.
"""

import time
import unittest

import torch

import dfa
import dfa.torch
from dfa import _dfa, device_io
from dfa.torch import _device

CLUSTER = None
CLIENT = None


def setUpModule():
    global CLUSTER, CLIENT
    CLUSTER = dfa.LocalCluster(workers=2, threads_per_worker=1)
    CLIENT = dfa.Client(CLUSTER.coordinator_address, rpc_timeout=30, job_timeout=60,
                        nccl_init_timeout=5, nccl_transfer_timeout=5)
    CLIENT.wait_ready(workers=2, timeout=30)


def tearDownModule():
    if CLUSTER:
        CLUSTER.stop()


def cuda_visible():
    return torch.cuda.is_available()


class DevicePathArgumentTest(unittest.TestCase):
    BAD = ("rdma", "NCCL", "", None, 3)

    def test_bad_device_path_names_it_everywhere(self):
        offline = dfa.Client("127.0.0.1:1")  # never contacted: the check comes first
        q = torch.zeros(1, 8, 2, 4)
        for bad in self.BAD:
            with self.subTest(bad=bad):
                for call in (lambda: device_io.check_device_path(bad),
                             lambda: dfa.torch.Attention(offline, device_path=bad),
                             lambda: dfa.torch.attention(q, q, q, client=offline,
                                                         device_path=bad)):
                    with self.assertRaises(dfa.InvalidArgumentError) as cm:
                        call()
                    self.assertIn("device_path: must be 'auto', 'ipc' or 'nccl', got %r"
                                  % (bad,), str(cm.exception))
        for good in device_io.DEVICE_PATHS:
            self.assertEqual(device_io.check_device_path(good), good)

    def test_bad_nccl_timeouts_name_the_field(self):
        for name in ("nccl_init_timeout", "nccl_transfer_timeout"):
            for bad in (0, -1, "5", True):
                with self.assertRaisesRegex(dfa.InvalidArgumentError,
                                            "%s: must be a positive number" % name):
                    dfa.Client("127.0.0.1:1", **{name: bad})


@unittest.skipUnless(device_io.nccl_available(), "dfa._dfa was built without NCCL")
class ChooseDevicePathTest(unittest.TestCase):
    def test_ipc_only_when_every_shard_is_on_this_host(self):
        here = [{"worker_id": "w0", "host": "gpu-a"}, {"worker_id": "w1", "host": "gpu-a"}]
        self.assertEqual(_dfa.choose_device_path(here, "gpu-a"), "ipc")
        one_away = here + [{"worker_id": "w2", "host": "gpu-b"}]
        self.assertEqual(_dfa.choose_device_path(one_away, "gpu-a"), "nccl")
        # A shard that advertises no host cannot be assumed local; no shards: nothing to map.
        self.assertEqual(_dfa.choose_device_path([{"host": ""}], ""), "nccl")
        self.assertEqual(_dfa.choose_device_path([], "gpu-a"), "nccl")
        # The default host is this process's name (what a local worker advertises).
        self.assertEqual(_dfa.choose_device_path([{"host": _dfa.host_name()}]), "ipc")

    def test_bad_shards_name_the_index(self):
        for bad in ([1], [{"worker_id": "w0"}], [{"host": 7}]):
            with self.assertRaisesRegex(dfa.InvalidArgumentError, r"shards\[0\]: expected a "
                                        "dict with a string 'host'"):
                _dfa.choose_device_path(bad, "h")

    def test_a_real_session_local_here_remote_from_another_host(self):
        spec = dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, kv_heads=2, head_dim=16,
                                 dtype="bf16")
        with CLIENT.create_session(spec) as s:
            self.assertEqual(len(s.shards), 2)
            self.assertEqual({sh["host"] for sh in s.shards}, {_dfa.host_name()})
            self.assertEqual(device_io.choose_device_path(s), "ipc")
            self.assertEqual(device_io.resolve(s, "auto"), "ipc")
            self.assertEqual(device_io.choose_device_path(s, this_host="trainer-on-another-host"),
                             "nccl")
            self.assertEqual(device_io.resolve(s, "nccl"), "nccl")
            self.assertEqual(device_io.resolve(s, "ipc"), "ipc")
        # dfa.torch under "auto": every live worker is here, so a new layer takes CUDA IPC.
        self.assertEqual(_device.kind(CLIENT, "auto"), "ipc")
        self.assertEqual(_device.kind(CLIENT, "nccl"), "nccl")


class NcclTensorIoTest(unittest.TestCase):
    SPEC = dfa.AttentionSpec(batch=1, seq_len=64, q_heads=2, kv_heads=2, head_dim=16,
                             dtype="bf16")

    def test_without_nccl_the_build_says_so(self):
        if device_io.nccl_available():
            self.skipTest("this build has NCCL")
        for call in (CLIENT.nccl_tensor_io, lambda: _dfa.choose_device_path([], "h")):
            with self.assertRaises(dfa.DfaError) as cm:
                call()
            self.assertEqual(cm.exception.code, "UNIMPLEMENTED")
            self.assertIn("has no NCCL path", cm.exception.details)

    @unittest.skipUnless(device_io.nccl_available(), "dfa._dfa was built without NCCL")
    def test_one_per_client_made_lazily(self):
        c = dfa.Client(CLUSTER.coordinator_address)
        self.assertIsNone(c._nccl_io)
        self.assertIsNone(device_io.nccl_group(c))
        io = c.nccl_tensor_io()
        self.assertIs(c.nccl_tensor_io(), io)
        self.assertIsNone(io.group)
        self.assertEqual(io.groups_joined, 0)
        with self.assertRaisesRegex(dfa.InvalidArgumentError, "init_timeout"):
            _dfa.NcclTensorIo(c._c, init_timeout=-1.0)
        with self.assertRaisesRegex(dfa.InvalidArgumentError, "transfer_timeout"):
            _dfa.NcclTensorIo(c._c, transfer_timeout=float("nan"))

    @unittest.skipUnless(device_io.nccl_available(), "dfa._dfa was built without NCCL")
    def test_no_cuda_device_is_a_clear_bounded_error(self):
        if cuda_visible():
            self.skipTest("a CUDA device is visible here "
                          "(tests/gpu/service/torch_nccl_test.py covers it)")
        io = CLIENT.nccl_tensor_io()
        host = torch.zeros(self.SPEC.shape(dfa.Q), dtype=torch.bfloat16)
        with CLIENT.create_session(self.SPEC) as s:
            # upload_auto on these local workers takes CUDA IPC: named so.
            for name, call, path in (("upload", io.upload, "nccl"),
                                     ("download", io.download, "nccl"),
                                     ("upload_auto", io.upload_auto, "ipc")):
                start = time.monotonic()
                with self.assertRaises(dfa.DfaError) as cm:
                    call(s._s, dfa.Q, host.data_ptr(), "bf16", list(host.shape),
                         list(host.stride()))
                self.assertLess(time.monotonic() - start, 5.0, name)
                self.assertEqual(cm.exception.code, "FAILED_PRECONDITION", name)
                self.assertIn("device_path = '%s': no CUDA device is visible to this process "
                              "(cudaGetDeviceCount" % path, cm.exception.details)
            # Nothing was joined, nothing sent: the session still serves the host path.
            self.assertIsNone(io.group)
            self.assertEqual(io.groups_joined, 0)
            s.generate_inputs(seed=1)
            self.assertEqual(s.run("forward")["state"], "JOB_SUCCEEDED")
            # Bad arguments are named before any device is looked at.
            with self.assertRaisesRegex(dfa.InvalidArgumentError, "data_ptr: is null"):
                io.upload(s._s, dfa.Q, 0, "bf16", [1, 64, 2, 16], [])
            with self.assertRaisesRegex(dfa.InvalidArgumentError, "tensor.dtype: must be bf16"):
                io.upload(s._s, dfa.Q, host.data_ptr(), "int8", [1, 64, 2, 16], [])
            with self.assertRaisesRegex(dfa.InvalidArgumentError, "kind"):
                io.upload(s._s, 99, host.data_ptr(), "bf16", [1, 64, 2, 16], [])

    def test_cpu_tensors_are_refused_naming_the_tensor(self):
        host = torch.zeros(self.SPEC.shape(dfa.Q), dtype=torch.bfloat16)
        with CLIENT.create_session(self.SPEC) as s:
            for fn in (device_io.upload_device, device_io.download_device):
                with self.assertRaisesRegex(dfa.InvalidArgumentError,
                                            "tensor: device_path='nccl' needs a CUDA "
                                            "torch.Tensor, got one on cpu"):
                    fn(s, dfa.Q, host, device_path="nccl")

    def test_torch_layer_with_device_path_nccl(self):
        # path="ipc" (a device path or an error) with CPU tensors: refused naming both.
        strict = dfa.torch.Attention(CLIENT, is_causal=True, path="ipc", device_path="nccl")
        q = torch.randn(1, 64, 2, 16)
        if not _dfa.HAVE_CUDA:
            with self.assertRaises(dfa.DfaError):
                strict(q, q, q)
        else:
            with self.assertRaisesRegex(dfa.InvalidArgumentError,
                                        r"q: path='ipc' \(device_path='nccl'\) needs a CUDA "
                                        "tensor, got one on cpu"):
                strict(q, q, q)
        # path="auto": CPU tensors take the host paths whatever device_path says.
        attn = dfa.torch.Attention(CLIENT, is_causal=True, device_path="nccl")
        try:
            out = attn(q, q, q)
            want = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2),
                is_causal=True).transpose(1, 2)
            self.assertLess((out - want).abs().max().item(), 1e-4)
            st = attn.stats
            self.assertEqual((st["nccl_bytes"], st["ipc_bytes"]), (0, 0), st)
            self.assertGreater(st["host_bytes"], 0, st)
        finally:
            attn.release()


if __name__ == "__main__":
    unittest.main(verbosity=2)
