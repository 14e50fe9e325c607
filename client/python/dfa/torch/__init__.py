"""PyTorch integration: attention offloaded to the DistFlashAttn Service.

    import dfa, dfa.torch
    client = dfa.Client("127.0.0.1:7000")
    out = dfa.torch.attention(q, k, v, is_causal=True, client=client)   # one session per call
    attn = dfa.torch.Attention(client, is_causal=True)                  # one session per layer
    out = attn(q, k, v)

Both are the custom op dfa::attention (torch.compile(fullgraph=True) traces it; autocast
applies); its backward sends only dO. See dfa/torch/_ops.py and dfa/torch/module.py.
"""

from dfa.torch._ops import attention
from dfa.torch.module import Attention

__all__ = ["attention", "Attention"]
