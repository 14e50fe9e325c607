"""dfa: Python client of the DistFlashAttn Service (distributed exact attention, offloaded).

    import dfa
    client = dfa.Client("127.0.0.1:7000")
    with client.create_session(batch=1, seq_len=4096, q_heads=8, head_dim=64, dtype="bf16") as s:
        o, lse = s.forward(q, k, v)
        dq, dk, dv = s.backward(do)

For PyTorch: ``from dfa.autograd import DistributedAttention`` (imports torch).
See docs/python.md.
"""

from dfa.spec import (AttentionSpec, DO, DQ, DK, DV, K, LSE, O, Q, V, from_bf16, from_float,
                      to_bf16, to_float)
from dfa.errors import DfaError, JobFailedError
from dfa.client import Client, Session

__all__ = ["AttentionSpec", "Client", "Session", "DfaError", "JobFailedError", "to_bf16",
           "from_bf16", "to_float", "from_float", "Q", "K", "V", "O", "LSE", "DO", "DQ", "DK",
           "DV"]
