"""The Python side of the same-host GPU path (client/python/dfa/cuda_ipc.py), where no GPU is:
request building for strided and LSE tensors (pure), and the real DeviceTransfer rpc against a
cpu worker on loopback, which refuses with FAILED_PRECONDITION naming the cpu backend, and a
boot id of another host, refused naming host_id. The GPU case (torch tensors through cuda
workers) is the C++ device_ipc_service_test's twin and runs where torch and GPUs are.

Run: DFA_BIN_DIR=<build> PYTHONPATH=client/python python3 tests/integration/cuda_ipc_python_test.py
Exit 77 (ctest: skipped) when grpcio / numpy are not installed.
"""

import sys
import unittest

try:
    import grpc
    import numpy  # noqa: F401  (the dfa package needs it)
except ImportError as e:  # pragma: no cover
    print("SKIP: %s" % e)
    sys.exit(77)

import dfa
from dfa import cuda_ipc
from dfa.cluster import LocalCluster, find_binary

SPEC = dfa.AttentionSpec(batch=2, seq_len=100, q_heads=4, kv_heads=2, head_dim=8, dtype="bf16")


class MakeRequestsTest(unittest.TestCase):
    def test_offsets_and_strides_of_owned_rows(self):
        # Seq-major [S, B, H, D] memory seen as BSHD: strides (32, 64, 8, 1), bf16.
        reqs = cuda_ipc.make_requests(SPEC, dfa.Q, (2, 100, 4, 8), (32, 64, 8, 1), 2, 2,
                                      b"h" * 64, 1000, 1, [(0, 30), (30, 55)], True, "boot")
        self.assertEqual([r.tensor.offset for r in reqs], [1000, 1000 + 30 * 64 * 2])
        self.assertEqual(list(reqs[1].tensor.shape), [2, 25, 4, 8])
        self.assertEqual(list(reqs[1].tensor.strides), [32, 64, 8, 1])
        self.assertEqual((reqs[1].rows.begin, reqs[1].rows.end), (30, 55))
        self.assertTrue(reqs[1].upload)
        self.assertEqual(reqs[1].host_id, "boot")

    def test_lse_rows_are_the_last_dimension(self):
        reqs = cuda_ipc.make_requests(SPEC, dfa.LSE, (2, 4, 100), (400, 100, 1), 1, 4, b"h" * 64,
                                      0, 0, [(30, 55)], False, "boot")
        self.assertEqual(reqs[0].tensor.offset, 30 * 4)
        self.assertEqual(list(reqs[0].tensor.shape), [2, 4, 25])

    def test_head_slice_starts_at_its_first_head_with_full_strides(self):
        # A head-split shard (schedule "heads") holds kv heads [1, 2): its ref starts at head 1 of
        # every row, spans 1 head, and keeps the whole tensor's strides.
        reqs = cuda_ipc.make_requests(SPEC, dfa.K, (2, 100, 2, 8), (1600, 16, 8, 1), 2, 2,
                                      b"h" * 64, 0, 0, [(0, 100)], True, "boot", (1, 2))
        self.assertEqual(reqs[0].tensor.offset, 1 * 8 * 2)
        self.assertEqual(list(reqs[0].tensor.shape), [2, 100, 1, 8])
        self.assertEqual(list(reqs[0].tensor.strides), [1600, 16, 8, 1])
        # LSE [B, H, S]: query heads [2, 4) from row 30.
        reqs = cuda_ipc.make_requests(SPEC, dfa.LSE, (2, 4, 100), (400, 100, 1), 1, 4, b"h" * 64,
                                      0, 0, [(30, 55)], False, "boot", (2, 4))
        self.assertEqual(reqs[0].tensor.offset, (30 + 2 * 100) * 4)
        self.assertEqual(list(reqs[0].tensor.shape), [2, 2, 25])
        with self.assertRaisesRegex(ValueError, r"heads: \[1, 3\) outside"):
            cuda_ipc.make_requests(SPEC, dfa.K, (2, 100, 2, 8), (1600, 16, 8, 1), 2, 2,
                                   b"h" * 64, 0, 0, [(0, 100)], True, "boot", (1, 3))

    def test_wrong_sequence_length_names_the_field(self):
        with self.assertRaisesRegex(ValueError, r"tensor.shape\[1\]: 99"):
            cuda_ipc.make_requests(SPEC, dfa.Q, (2, 99, 4, 8), (3168, 32, 8, 1), 2, 2, b"h" * 64,
                                   0, 0, [(0, 10)], True, "boot")


class CpuWorkerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        try:
            find_binary("coordinator", "dfa-coordinator")
            find_binary("worker", "dfa-worker")
        except FileNotFoundError as e:
            raise unittest.SkipTest(str(e))
        cls.cluster = LocalCluster(workers=1, threads_per_worker=1)
        cls.client = dfa.Client(cls.cluster.coordinator_address, rpc_timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.stop()

    def send(self, session, host):
        req = cuda_ipc.make_requests(session.spec, dfa.Q, session.spec.shape(dfa.Q),
                                     (100 * 32, 32, 8, 1), 2, 2, b"\0" * 64, 0, 0,
                                     session.ranges[0][:1], True, host)[0]
        req.session_id = session.id
        req.client_id = self.client.client_id
        stub = self.client.worker_stub(session.shards[0].address)
        with self.assertRaises(grpc.RpcError) as cm:
            stub.DeviceTransfer(req, timeout=10)
        return cm.exception

    def test_cpu_worker_refuses(self):
        with self.client.create_session(SPEC) as s:
            e = self.send(s, cuda_ipc.host_id())
            self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("cpu backend", e.details())

    def test_other_host_refused(self):
        with self.client.create_session(SPEC) as s:
            e = self.send(s, "another-boot-id")
            self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("host_id = 'another-boot-id'", e.details())


if __name__ == "__main__":
    unittest.main()
