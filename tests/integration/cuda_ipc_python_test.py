"""The Python side of the same-host GPU path (client/python/dfa/cuda_ipc.py over the C++
client/cuda_tensor_io.h), where no GPU is: request building for strided, LSE and head-sliced
tensors (MakeDeviceTransferRequest through the extension), and the real DeviceTransfer rpc
against a cpu worker on loopback, which refuses with FAILED_PRECONDITION naming the cpu
backend, and a boot id of another host, refused naming host_id. The GPU case (torch tensors
through cuda workers) is the C++ device_ipc_service_test's twin and runs where torch and GPUs are.

Run: DFA_BIN_DIR=<build> PYTHONPATH=<build>/client/python python3 tests/integration/cuda_ipc_python_test.py
Needs an extension built with CUDA (dfa._dfa.HAVE_CUDA; registered only in such builds).
"""

import unittest

import dfa
from dfa import _dfa, cuda_ipc

SPEC = dfa.AttentionSpec(batch=2, seq_len=100, q_heads=4, kv_heads=2, head_dim=8, dtype="bf16")
HANDLE = b"h" * 64


def request(kind, shape, strides, begin, end, offset=0, upload=True, heads=(0, 0),
            dtype="bf16"):
    return _dfa.make_device_transfer_request(SPEC.as_dict(), kind, list(shape), list(strides),
                                             dtype, HANDLE, offset, 1, begin, end, upload,
                                             "boot", heads[0], heads[1])


class MakeRequestsTest(unittest.TestCase):
    def test_offsets_and_strides_of_owned_rows(self):
        # Seq-major [S, B, H, D] memory seen as BSHD: strides (32, 64, 8, 1), bf16.
        reqs = [request(dfa.Q, (2, 100, 4, 8), (32, 64, 8, 1), b, e, offset=1000)
                for b, e in ((0, 30), (30, 55))]
        self.assertEqual([r["offset"] for r in reqs], [1000, 1000 + 30 * 64 * 2])
        self.assertEqual(reqs[1]["shape"], [2, 25, 4, 8])
        self.assertEqual(reqs[1]["strides"], [32, 64, 8, 1])
        self.assertEqual(reqs[1]["rows"], (30, 55))
        self.assertTrue(reqs[1]["upload"])
        self.assertEqual(reqs[1]["host_id"], "boot")

    def test_lse_rows_are_the_last_dimension(self):
        r = request(dfa.LSE, (2, 4, 100), (400, 100, 1), 30, 55, upload=False, dtype="f32")
        self.assertEqual(r["offset"], 30 * 4)
        self.assertEqual(r["shape"], [2, 4, 25])

    def test_head_slice_starts_at_its_first_head_with_full_strides(self):
        # A head-split shard (schedule "heads") holds kv heads [1, 2): its ref starts at head 1 of
        # every row, spans 1 head, and keeps the whole tensor's strides.
        r = request(dfa.K, (2, 100, 2, 8), (1600, 16, 8, 1), 0, 100, heads=(1, 2))
        self.assertEqual(r["offset"], 1 * 8 * 2)
        self.assertEqual(r["shape"], [2, 100, 1, 8])
        self.assertEqual(r["strides"], [1600, 16, 8, 1])
        with self.assertRaisesRegex(ValueError, r"heads \[1, 3\) of the shard lie outside"):
            request(dfa.K, (2, 100, 2, 8), (1600, 16, 8, 1), 0, 100, heads=(1, 3))

    def test_wrong_sequence_length_names_the_field(self):
        with self.assertRaisesRegex(ValueError, r"tensor.shape\[1\] = 99 differs from "
                                                r"spec.seq_len = 100"):
            request(dfa.Q, (2, 99, 4, 8), (3168, 32, 8, 1), 0, 10)

    def test_host_tensors_are_refused_naming_the_argument(self):
        class FakeCpuTensor:  # what a torch CPU tensor looks like to cuda_ipc
            is_cuda = False
            device = "cpu"
        with self.assertRaisesRegex(ValueError, "tensor: expected a CUDA torch.Tensor"):
            cuda_ipc.upload_device(object.__new__(dfa.Session), dfa.Q, FakeCpuTensor())


class CpuWorkerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = dfa.LocalCluster(workers=1, threads_per_worker=1)
        cls.client = dfa.Client(cls.cluster.coordinator_address, rpc_timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def send(self, session, host):
        b, e = session.ranges[0][0]
        with self.assertRaises(dfa.DfaError) as cm:
            _dfa.device_transfer(session._s, 0, dfa.Q, list(SPEC.shape(dfa.Q)),
                                 [100 * 32, 32, 8, 1], "bf16", b"\0" * 64, b, e, True, host)
        return cm.exception

    def test_cpu_worker_refuses(self):
        with self.client.create_session(SPEC) as s:
            e = self.send(s, _dfa.host_boot_id())
            self.assertEqual(e.code, "FAILED_PRECONDITION")
            self.assertIn("cpu backend", e.details)

    def test_other_host_refused(self):
        with self.client.create_session(SPEC) as s:
            e = self.send(s, "another-boot-id")
            self.assertEqual(e.code, "FAILED_PRECONDITION")
            self.assertIn("host_id = 'another-boot-id'", e.details)


if __name__ == "__main__":
    unittest.main(verbosity=2)
