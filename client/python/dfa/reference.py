"""Single-device attention in numpy fp64: the reference the service is checked against, and the
tolerance rule.

Shapes as in the service: Q, O, dO [B, S, Hq, D]; K, V [B, S, Hkv, D] (GQA: query head h uses
key/value head h // (Hq / Hkv)); LSE [B, Hq, S] (natural log). Masks: causal, and optionally
packed documents (`doc_offsets`, one offsets sequence for every row or one per row) and a
sliding window (`window` = (left, right), -1 unbounded), as AttentionSpec's fields (mask_of).
Rows with no visible key cannot occur here (every query sees at least itself).
Memory: B·Hq·S² fp64 values; meant for test sizes (S of a few thousand at most).
"""

import numpy as np


def _expand(kv, hq):
    return np.repeat(kv, hq // kv.shape[2], axis=2)


def mask_of(batch, seq, causal=True, doc_offsets=(), window=(-1, -1)):
    """[B, 1, S, S] bool: query i sees key j (same document, j <= i when causal, window)."""
    rows = list(doc_offsets) if doc_offsets is not None and len(doc_offsets) else [()]
    if all(isinstance(x, (int, np.integer)) for x in rows):
        rows = [rows]  # one flat offsets sequence: every row
    i = np.arange(seq)[:, None]
    j = np.arange(seq)[None, :]
    out = np.empty((batch, 1, seq, seq), dtype=bool)
    for b in range(batch):
        offsets = rows[0] if len(rows) == 1 else rows[b]
        doc = np.zeros(seq, dtype=np.int64)
        for o in list(offsets)[1:-1]:
            doc[int(o):] += 1
        m = doc[:, None] == doc[None, :]
        if causal:
            m &= j <= i
        if window[0] >= 0:
            m &= j >= i - window[0]
        if window[1] >= 0:
            m &= j <= i + window[1]
        out[b, 0] = m
    return out


def _probs(q, k, causal, scale, doc_offsets=(), window=(-1, -1)):
    s = np.einsum("bihd,bjhd->bhij", q, k) * scale
    if causal or len(doc_offsets) or window[0] >= 0 or window[1] >= 0:
        s = np.where(mask_of(q.shape[0], q.shape[1], causal, doc_offsets, window), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return p / l, (m + np.log(l))[..., 0]


def attention_forward(q, k, v, causal=True, scale=None, doc_offsets=(), window=(-1, -1)):
    """fp64 (O, LSE) of float arrays q, k, v."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    hq = q.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if not scale else scale
    p, lse = _probs(q, _expand(k, hq), causal, scale, doc_offsets, window)
    o = np.einsum("bhij,bjhd->bihd", p, _expand(v, hq))
    return o, lse


def attention_backward(q, k, v, do, causal=True, scale=None, doc_offsets=(), window=(-1, -1)):
    """fp64 (dQ, dK, dV) of float arrays; dK/dV summed over each key/value head's query group."""
    q, k, v, do = (np.asarray(x, dtype=np.float64) for x in (q, k, v, do))
    b, s, hq, d = q.shape
    hkv = k.shape[2]
    scale = 1.0 / np.sqrt(d) if not scale else scale
    ke, ve = _expand(k, hq), _expand(v, hq)
    p, _ = _probs(q, ke, causal, scale, doc_offsets, window)
    dv = np.einsum("bhij,bihd->bjhd", p, do)
    dp = np.einsum("bihd,bjhd->bhij", do, ve)
    o = np.einsum("bhij,bjhd->bihd", p, ve)
    delta = np.einsum("bihd,bihd->bhi", do, o)[..., None]
    ds = p * (dp - delta) * scale
    dq = np.einsum("bhij,bjhd->bihd", ds, ke)
    dk = np.einsum("bhij,bihd->bjhd", ds, q)
    g = hq // hkv
    return dq, dk.reshape(b, s, hkv, g, d).sum(3), dv.reshape(b, s, hkv, g, d).sum(3)


def _round(x, dtype):
    from dfa.spec import from_float, to_float
    return to_float(from_float(x, dtype), dtype)


def compare(name, actual, expected, dtype):
    """Checks float64 `actual` against fp64 `expected` for results delivered in `dtype`.

    Rule (as the C++ client's verify): the error may be at most 2x the error of the reference
    itself rounded to `dtype` (relative L2 and max-abs), with a floor of 1e-4 relative L2 and
    1e-4·max|expected| max-abs for fp32. Real bugs (a missing or doubled unit, a wrong mask, a
    bad merge) give errors of order 1. Returns a dict with the figures and 'ok'.
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ValueError("%s: shape %s, expected %s" % (name, actual.shape, expected.shape))
    norm = max(np.linalg.norm(expected), 1e-30)
    peak = max(np.abs(expected).max(), 1e-30)
    rounded = _round(expected, dtype)
    tol_rel = max(2 * np.linalg.norm(rounded - expected) / norm, 1e-4)
    tol_abs = max(2 * np.abs(rounded - expected).max(), 1e-4 * peak)
    err_rel = np.linalg.norm(actual - expected) / norm
    err_abs = np.abs(actual - expected).max()
    ok = bool(np.isfinite(actual).all() and err_rel <= tol_rel and err_abs <= tol_abs)
    return {"name": name, "ok": ok, "rel_l2": err_rel, "tol_rel_l2": tol_rel, "max_abs": err_abs,
            "tol_max_abs": tol_abs}


def format_result(r):
    return "%-4s %-4s max|err| %.3g (tol %.3g)  rel-L2 %.3g (tol %.3g)" % (
        r["name"], "ok" if r["ok"] else "FAIL", r["max_abs"], r["tol_max_abs"], r["rel_l2"],
        r["tol_rel_l2"])
