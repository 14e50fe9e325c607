"""The attention spec a session is created with, dtypes, and tensor shapes per kind.

Layouts follow proto/dfa/v1/attention.proto: every tensor except LSE is "BSHD",
[batch, seq_len, heads, head_dim]; LSE is fp32 [batch, q_heads, seq_len]. On the host a bf16
tensor is a numpy uint16 array holding the bf16 bit patterns (numpy has no bfloat16);
``to_bf16`` / ``from_bf16`` convert (round to nearest even, NaN kept NaN).

AttentionSpec.validate is the service's own check (core/spec_validation.cc ValidateSpec through
the extension), so its errors are the service's: dfa.InvalidArgumentError (a ValueError) worded
"spec.<field>: <what>, got <value>". The limits (largest batch, heads, head_dim, seq_len) are
the daemons' to apply.
"""

import dataclasses
import math

import numpy as np

from dfa.errors import InvalidArgumentError

# Names accepted for `dtype`, mapped to (proto DType value, numpy dtype on the host).
_DTYPES = {
    "f32": (1, np.float32), "fp32": (1, np.float32), "float32": (1, np.float32),
    "bf16": (2, np.uint16), "bfloat16": (2, np.uint16),
    "f16": (3, np.float16), "fp16": (3, np.float16), "float16": (3, np.float16),
}
_CANONICAL = {1: "f32", 2: "bf16", 3: "f16"}

# Proto TensorKind values (attention.proto), by name.
Q, K, V, O, LSE, DO, DQ, DK, DV = 1, 2, 3, 4, 5, 6, 7, 8, 9
KIND_NAMES = {Q: "Q", K: "K", V: "V", O: "O", LSE: "LSE", DO: "dO", DQ: "dQ", DK: "dK", DV: "dV"}


def canonical_dtype(dtype):
    """'bf16' | 'f16' | 'f32' for any accepted spelling; ValueError naming `dtype` otherwise."""
    key = str(dtype).lower()
    if key not in _DTYPES:
        raise InvalidArgumentError("INVALID_ARGUMENT",
                                   "spec.dtype: must be bf16, f16 or f32, got %r" % (dtype,))
    return _CANONICAL[_DTYPES[key][0]]


def host_dtype(dtype):
    """numpy dtype holding `dtype` on the host (bf16 -> uint16 bit patterns)."""
    return np.dtype(_DTYPES[canonical_dtype(dtype)][1])


def dtype_of_array(a):
    """The spec dtype an array's numpy dtype stands for: float32, float16, uint16 (bf16)."""
    d = np.asarray(a).dtype
    if d == np.float32:
        return "f32"
    if d == np.float16:
        return "f16"
    if d == np.uint16:
        return "bf16"
    raise ValueError("dtype: arrays must be float32, float16 or uint16 (bf16 bit patterns), "
                     "got %s" % d)


def to_bf16(x):
    """float array -> uint16 bf16 bit patterns, rounding to nearest even (NaN stays NaN)."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = np.uint16(0x7FC0)
    return out


def from_bf16(b):
    """uint16 bf16 bit patterns -> float32."""
    b = np.ascontiguousarray(b, dtype=np.uint16)
    return (b.astype(np.uint32) << np.uint32(16)).view(np.float32)


def to_float(a, dtype):
    """A host array of the spec dtype -> float64 (for references and comparisons)."""
    if canonical_dtype(dtype) == "bf16":
        return from_bf16(a).astype(np.float64)
    return np.asarray(a, dtype=np.float64)


def from_float(x, dtype):
    """float array -> host array of the spec dtype (bf16 rounded to nearest even)."""
    d = canonical_dtype(dtype)
    if d == "bf16":
        return to_bf16(x)
    return np.ascontiguousarray(x, dtype=host_dtype(d))


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What one attention call computes (attention.proto AttentionSpec).

    softmax_scale 0 means 1/sqrt(head_dim). kv_heads 0 means kv_heads = q_heads.
    doc_offsets: packed documents, flash-attn's cu_seqlens per batch row: () none, one tuple
    {0, ..., seq_len} for every row, or one per row; a token attends only inside its document.
    window_left / window_right: sliding window, -1 unbounded (causal caps the right side at 0).
    """
    batch: int
    seq_len: int
    q_heads: int
    head_dim: int
    kv_heads: int = 0
    causal: bool = True
    dtype: str = "bf16"
    softmax_scale: float = 0.0
    doc_offsets: tuple = ()
    window_left: int = -1
    window_right: int = -1

    def __post_init__(self):
        for name in ("batch", "seq_len", "q_heads", "head_dim", "kv_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidArgumentError("INVALID_ARGUMENT",
                                           "spec.%s: must be an integer, got %r" % (name, v))
            object.__setattr__(self, name, int(v))
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.q_heads)
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "causal", bool(self.causal))
        object.__setattr__(self, "softmax_scale", float(self.softmax_scale))
        for name in ("window_left", "window_right"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidArgumentError("INVALID_ARGUMENT",
                                           "spec.%s: must be an integer, got %r" % (name, v))
            object.__setattr__(self, name, int(v))
        rows = self.doc_offsets
        if isinstance(rows, np.ndarray):
            rows = rows.tolist()
        if not isinstance(rows, (tuple, list)):
            raise InvalidArgumentError("INVALID_ARGUMENT", "spec.doc_offsets: must be a sequence "
                                       "of offset sequences, got %r" % (rows,))
        if rows and all(isinstance(x, (int, np.integer)) for x in rows):
            rows = (rows,)  # one row of offsets: every batch row
        try:
            rows = tuple(tuple(int(o) for o in row) for row in rows)
        except (TypeError, ValueError):
            raise InvalidArgumentError("INVALID_ARGUMENT", "spec.doc_offsets: must hold integer "
                                       "offsets, got %r" % (self.doc_offsets,)) from None
        object.__setattr__(self, "doc_offsets", rows)
        self.validate()

    def validate(self):
        """ValidateSpec's checks and messages (the extension runs the C++ function)."""
        from dfa import _dfa
        _dfa.validate_spec(**self.as_dict())

    def as_dict(self):
        """The fields as the extension takes them."""
        return dataclasses.asdict(self)

    @property
    def scale(self):
        """The softmax scale the service uses."""
        return self.softmax_scale if self.softmax_scale > 0 else 1.0 / math.sqrt(self.head_dim)

    def shape(self, kind):
        """Host shape of the whole tensor of `kind` (a TensorKind value)."""
        if kind == LSE:
            return (self.batch, self.q_heads, self.seq_len)
        heads = self.kv_heads if kind in (K, V, DK, DV) else self.q_heads
        return (self.batch, self.seq_len, heads, self.head_dim)

    def host_dtype(self, kind):
        return np.dtype(np.float32) if kind == LSE else host_dtype(self.dtype)

    @property
    def dense(self):
        """No documents and no window (the plain causal or full mask)."""
        return (all(len(r) <= 2 for r in self.doc_offsets) and self.window_left < 0 and
                (self.causal or self.window_right < 0))

    def forward_flops(self):
        """FLOPs of the whole forward: 4·B·Hq·D per (query, key) pair the mask lets through
        (causal: S(S+1)/2 pairs per row, the diagonal included; documents and windows count
        only their visible pairs); a backward costs 2.5x. The service's own count
        (core/spec_validation.h SpecForwardFlops through the extension), so it equals a
        job's `flops`."""
        from dfa import _dfa
        return _dfa.spec_forward_flops(self.as_dict())
