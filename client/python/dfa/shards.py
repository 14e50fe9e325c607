"""Scatter and gather between a client's whole tensors and the shards workers own.

A worker owns one or more global token ranges (ShardPlacement.owned; zigzag layouts own
several). A tensor's owned rows travel as TensorChunks: each chunk covers whole tokens of one
batch index inside one owned range, at most `chunk_bytes` of data (at least one token), with
the CRC32C of its data. BSHD tensors travel as [rows, heads, head_dim] of the spec dtype; LSE
as fp32 [heads, rows] (attention.proto).

Pure functions (no I/O). Errors: ValueError naming the field for bad placements and chunks;
ChecksumError for a CRC mismatch.
"""

import numpy as np

from dfa.crc import crc32c
from dfa.spec import DK, DV, K, KIND_NAMES, LSE, V

DEFAULT_CHUNK_BYTES = 4 << 20


class ChecksumError(ValueError):
    """A received chunk's data does not match its crc32c."""


def validate_owned(owned, seq_len, where="owned"):
    """`owned`: list of (begin, end). Each non-empty, inside [0, seq_len), sorted, disjoint."""
    prev_end = 0
    for i, (b, e) in enumerate(owned):
        if not (0 <= b < e <= seq_len):
            raise ValueError("%s[%d]: [%d, %d) is empty or outside [0, %d)" % (where, i, b, e, seq_len))
        if b < prev_end:
            raise ValueError("%s[%d]: [%d, %d) overlaps or is out of order" % (where, i, b, e))
        prev_end = e


def check_cover(ranges_by_rank, seq_len):
    """The ranks' ranges together cover [0, seq_len) exactly once, else ValueError."""
    all_ranges = sorted((b, e, r) for r, rs in enumerate(ranges_by_rank) for b, e in rs)
    pos = 0
    for b, e, r in all_ranges:
        if b != pos:
            raise ValueError("placement: rows [%d, %d) %s (next range starts at %d, rank %d)"
                             % (min(pos, b), max(pos, b), "uncovered" if b > pos else "covered twice",
                                b, r))
        pos = e
    if pos != seq_len:
        raise ValueError("placement: rows [%d, %d) uncovered" % (pos, seq_len))


def head_ranges(shards, spec):
    """Per shard ((q_begin, q_end), (kv_begin, kv_end)): the heads it holds (ShardPlacement.q_heads
    / kv_heads; unset = all heads). ValueError naming the shard for a range outside the spec's
    heads or q/kv ranges that do not match the spec's group size."""
    group = spec.q_heads // spec.kv_heads
    out = []
    for i, s in enumerate(shards):
        if s.kv_heads.end == 0 and s.q_heads.end == 0:
            out.append(((0, spec.q_heads), (0, spec.kv_heads)))
            continue
        kb, ke, qb, qe = s.kv_heads.begin, s.kv_heads.end, s.q_heads.begin, s.q_heads.end
        if not (0 <= kb < ke <= spec.kv_heads):
            raise ValueError("shards[%d].kv_heads: [%d, %d) is empty or outside [0, %d)"
                             % (i, kb, ke, spec.kv_heads))
        if (qb, qe) != (kb * group, ke * group):
            raise ValueError("shards[%d].q_heads: [%d, %d) does not match kv_heads [%d, %d) x %d"
                             % (i, qb, qe, kb, ke, group))
        out.append(((qb, qe), (kb, ke)))
    return out


def check_head_cover(ranges_by_rank, heads_by_rank, spec):
    """Every (row, head) is held by exactly one rank: ranks with the same kv head range (a head
    group) cover [0, seq_len) exactly once, and the groups' kv ranges partition [0, kv_heads)."""
    groups = {}
    for r, (_, kv) in enumerate(heads_by_rank):
        groups.setdefault(kv, []).append(r)
    pos = 0
    for kb, ke in sorted(groups):
        if kb != pos:
            raise ValueError("placement: kv heads [%d, %d) %s" % (min(pos, kb), max(pos, kb),
                             "held by no shard" if kb > pos else "held by two head groups"))
        pos = ke
        check_cover([ranges_by_rank[r] if r in groups[(kb, ke)] else [] for r in
                     range(len(ranges_by_rank))], spec.seq_len)
    if pos != spec.kv_heads:
        raise ValueError("placement: kv heads [%d, %d) held by no shard" % (pos, spec.kv_heads))


def head_view(a, kind, heads):
    """The view of whole tensor `a` (`kind`) at one shard's heads (from head_ranges)."""
    (qb, qe), (kb, ke) = heads
    if kind == LSE:
        return a[:, qb:qe, :]
    if kind in (K, V, DK, DV):
        return a[:, :, kb:ke, :]
    return a[:, :, qb:qe, :]


def row_bytes(a, kind):
    """Bytes of one token of one batch in transit."""
    if kind == LSE:
        return a.shape[1] * 4
    return a.shape[2] * a.shape[3] * a.itemsize


def iter_chunks(a, kind, ranges, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Yields (batch_index, begin, end, data_bytes, crc) covering `ranges` of whole tensor `a`,
    range by range, batch by batch, rows ascending."""
    rb = row_bytes(a, kind)
    step = max(1, int(chunk_bytes) // rb)
    for b0, e0 in ranges:
        for bi in range(a.shape[0]):
            for r in range(b0, e0, step):
                r1 = min(e0, r + step)
                if kind == LSE:
                    data = np.ascontiguousarray(a[bi, :, r:r1]).tobytes()
                else:
                    data = a[bi, r:r1].tobytes()
                yield bi, r, r1, data, crc32c(data)


def count_chunks(a, kind, ranges, chunk_bytes=DEFAULT_CHUNK_BYTES):
    step = max(1, int(chunk_bytes) // row_bytes(a, kind))
    return sum(a.shape[0] * (-(-(e - b) // step)) for b, e in ranges)


class Gatherer:
    """Writes received chunks of rows `ranges` into whole tensor `out`, checking each one, and
    at the end that every (batch, row) of the ranges arrived exactly once."""

    def __init__(self, out, kind, ranges, where):
        self.out, self.kind, self.ranges, self.where = out, kind, list(ranges), where
        self.seen = {r: np.zeros((out.shape[0], r[1] - r[0]), dtype=np.int32) for r in self.ranges}
        self.bytes = 0

    def apply(self, chunk):
        name = KIND_NAMES.get(self.kind, str(self.kind))
        if chunk.kind != self.kind:
            raise ValueError("%s: chunk.kind %d, expected %d (%s)" % (self.where, chunk.kind, self.kind, name))
        bi, b, e = chunk.batch_index, chunk.rows.begin, chunk.rows.end
        if not 0 <= bi < self.out.shape[0]:
            raise ValueError("%s: chunk.batch_index %d outside [0, %d)" % (self.where, bi, self.out.shape[0]))
        rng = next((r for r in self.ranges if r[0] <= b < e <= r[1]), None)
        if rng is None:
            raise ValueError("%s: chunk.rows [%d, %d) of %s outside the requested rows %s"
                             % (self.where, b, e, name, self.ranges))
        want = (e - b) * row_bytes(self.out, self.kind)
        if len(chunk.data) != want:
            raise ValueError("%s: chunk.data of %s rows [%d, %d) has %d bytes, expected %d"
                             % (self.where, name, b, e, len(chunk.data), want))
        if crc32c(chunk.data) != chunk.crc32c:
            raise ChecksumError("%s: chunk.crc32c mismatch for %s batch %d rows [%d, %d)"
                                % (self.where, name, bi, b, e))
        if self.kind == LSE:
            h = self.out.shape[1]
            self.out[bi, :, b:e] = np.frombuffer(chunk.data, dtype=np.float32).reshape(h, e - b)
        else:
            self.out[bi, b:e] = np.frombuffer(chunk.data, dtype=self.out.dtype).reshape(
                (e - b,) + self.out.shape[2:])
        self.seen[rng][bi, b - rng[0]:e - rng[0]] += 1
        self.bytes += len(chunk.data)

    def finish(self):
        for (b, e), s in self.seen.items():
            if (s != 1).any():
                bi, r = np.argwhere(s != 1)[0]
                raise ValueError("%s: %s batch %d row %d arrived %d times (expected once)"
                                 % (self.where, KIND_NAMES.get(self.kind), bi, b + r, s[bi, r]))
