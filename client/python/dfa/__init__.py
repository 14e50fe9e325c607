"""dfa: the Python client of the DistFlashAttn Service (distributed exact attention, offloaded).

The package binds the C++ client library (extension dfa._dfa): sessions, the data planes
(shared memory on one host, gRPC chunks with CRC32C across hosts), retries after a lost worker,
mTLS and the token exist once, in C++.

    import dfa
    client = dfa.Client("127.0.0.1:7000")
    with client.create_session(batch=1, seq_len=4096, q_heads=8, head_dim=64, dtype="bf16") as s:
        o, lse = s.forward(q, k, v)
        dq, dk, dv = s.backward(do)

For PyTorch: ``import dfa.torch`` — dfa.torch.attention (an SDPA-style custom op) and
dfa.torch.Attention (a module keeping one session per layer). See docs/python.md.
"""

import dfa._preload  # noqa: F401  (before dfa._dfa: torch's NCCL where it is installed)
from dfa.errors import DeadlineExceededError, DfaError, InvalidArgumentError
from dfa.spec import (AttentionSpec, DO, DQ, DK, DV, K, LSE, O, Q, V, from_bf16, from_float,
                      to_bf16, to_float)
from dfa.client import Client, Session
from dfa.cluster import LocalCluster

__all__ = ["AttentionSpec", "Client", "Session", "LocalCluster", "DfaError",
           "InvalidArgumentError", "DeadlineExceededError", "to_bf16", "from_bf16", "to_float",
           "from_float", "Q", "K", "V", "O", "LSE", "DO", "DQ", "DK", "DV"]
