#include "worker/cancellable_backend.h"

#include <algorithm>
#include <cmath>

namespace dfa {
namespace {

constexpr int64_t kRowBlock = 64;  // the CPU kernel's query block (kernels/cpu kBlockM)

// Visible pairs of queries [q0, q0 + m) x keys [k0, k0 + n), averaged over the batch rows:
// kIntervals from the rows' intervals (host arrays: a CPU backend), else the dense count.
double Pairs(MaskKind mask, const MaskIntervals& iv, int batch, int64_t q0, int64_t m, int64_t k0,
             int64_t n) {
  if (mask != MaskKind::kIntervals) return static_cast<double>(VisiblePairs(q0, m, k0, n, mask));
  int64_t total = 0;
  for (int b = 0; b < batch; ++b) {
    const int64_t base = b * iv.seq;
    for (int64_t i = q0; i < q0 + m; ++i) {
      const int64_t lo = std::max<int64_t>(iv.q_lo[base + i], k0);
      const int64_t hi = std::min<int64_t>(iv.q_hi[base + i], k0 + n);
      if (hi > lo) total += hi - lo;
    }
  }
  return static_cast<double>(total) / batch;
}

}  // namespace

absl::Status CancellableBackend::CheckCancelled() const {
  if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
    return absl::CancelledError("job cancelled inside a unit");
  }
  return absl::OkStatus();
}

int64_t CancellableBackend::PieceEnd(int64_t r0, int64_t m, int64_t q_row0, int64_t kv_row0,
                                     int64_t n, MaskKind mask, const MaskIntervals& iv, int batch,
                                     double flops_per_pair) const {
  int64_t end = std::min(m, r0 + kRowBlock);
  double flops = flops_per_pair * Pairs(mask, iv, batch, q_row0 + r0, end - r0, kv_row0, n);
  while (end < m) {
    const int64_t next = std::min(m, end + kRowBlock);
    const double more =
        flops_per_pair * Pairs(mask, iv, batch, q_row0 + end, next - end, kv_row0, n);
    if (flops + more > flops_per_piece_) break;
    flops += more;
    end = next;
  }
  return end;
}

absl::Status CancellableBackend::Forward(const ForwardArgs& a) {
  RETURN_IF_ERROR(CheckCancelled());
  // Interval arrays are read below to size the pieces: checked first.
  if (a.mask == MaskKind::kIntervals) RETURN_IF_ERROR(ValidateForward(a));
  const int64_t m = a.q.rows;
  // 4·B·H·D FLOPs per visible pair (ForwardFlops without the causal halving: pairs are exact).
  const double per_pair = 4.0 * a.q.batch * a.q.heads * a.q.head_dim;
  if (m <= kRowBlock ||
      per_pair * Pairs(a.mask, a.intervals, a.q.batch, a.q_row0, m, a.kv_row0, a.k.rows) <=
          flops_per_piece_) {
    return inner_->Forward(a);
  }
  for (int64_t r0 = 0; r0 < m;) {
    RETURN_IF_ERROR(CheckCancelled());
    const int64_t r1 = PieceEnd(r0, m, a.q_row0, a.kv_row0, a.k.rows, a.mask, a.intervals,
                                a.q.batch, per_pair);
    ForwardArgs p = a;
    p.q = a.q.Slice(r0, r1 - r0);
    p.q_row0 = a.q_row0 + r0;
    p.out = a.out.Slice(r0, r1 - r0);
    p.lse = a.lse.Slice(r0, r1 - r0);
    RETURN_IF_ERROR(inner_->Forward(p));
    r0 = r1;
  }
  return absl::OkStatus();
}

absl::Status CancellableBackend::Backward(const BackwardArgs& a) {
  RETURN_IF_ERROR(CheckCancelled());
  if (a.mask == MaskKind::kIntervals) RETURN_IF_ERROR(ValidateBackward(a));
  const int64_t m = a.q.rows, n = a.k.rows;
  const double per_pair = 2.5 * 4.0 * a.q.batch * a.q.heads * a.q.head_dim;
  if ((m <= kRowBlock && n <= kRowBlock) ||
      per_pair * Pairs(a.mask, a.intervals, a.q.batch, a.q_row0, m, a.kv_row0, n) <=
          flops_per_piece_) {
    return inner_->Backward(a);
  }
  // Pieces are tiles of query rows x keys. Each call has a fixed cost that grows with its rows
  // (packing Q and dO, adding dQ) and its keys (packing K twice and V, adding dK and dV), while
  // its work grows with rows x keys: square tiles keep that cost small. (Row pieces over all
  // keys of a long unit repack every key for every 64 or 128 rows: 2.5x the time at S = 16K.)
  // dQ, dK and dV are sums over keys and query rows: each tile adds its part, as one call does.
  const double tile_pairs = flops_per_piece_ / per_pair;
  const int64_t cols = std::min(
      n, std::max(kRowBlock, static_cast<int64_t>(std::sqrt(tile_pairs)) / kRowBlock * kRowBlock));
  for (int64_t c0 = 0; c0 < n; c0 += cols) {
    const int64_t c1 = std::min(n, c0 + cols);
    auto block_pairs = [&](int64_t r0, int64_t r1) {
      return Pairs(a.mask, a.intervals, a.q.batch, a.q_row0 + r0, r1 - r0, a.kv_row0 + c0,
                   c1 - c0);
    };
    for (int64_t r0 = 0; r0 < m;) {
      // Row blocks that see none of these keys are skipped; a piece grows by whole blocks up to
      // the budget, and ends before a block that sees none of them.
      int64_t r1 = std::min(m, r0 + kRowBlock);
      double flops = per_pair * block_pairs(r0, r1);
      if (flops == 0) {
        r0 = r1;
        continue;
      }
      while (r1 < m) {
        const int64_t next = std::min(m, r1 + kRowBlock);
        const double more = per_pair * block_pairs(r1, next);
        if (more == 0 || flops + more > flops_per_piece_) break;
        flops += more;
        r1 = next;
      }
      RETURN_IF_ERROR(CheckCancelled());
      BackwardArgs p = a;
      p.q = a.q.Slice(r0, r1 - r0);
      p.q_row0 = a.q_row0 + r0;
      p.dout = a.dout.Slice(r0, r1 - r0);
      p.lse = a.lse.Slice(r0, r1 - r0);
      p.delta = a.delta.Slice(r0, r1 - r0);
      p.dq = a.dq.Slice(r0, r1 - r0);
      if (a.out.data != nullptr) p.out = a.out.Slice(r0, r1 - r0);
      p.k = a.k.Slice(c0, c1 - c0);
      p.v = a.v.Slice(c0, c1 - c0);
      p.dk = a.dk.Slice(c0, c1 - c0);
      p.dv = a.dv.Slice(c0, c1 - c0);
      p.kv_row0 = a.kv_row0 + c0;
      RETURN_IF_ERROR(inner_->Backward(p));
      r0 = r1;
    }
  }
  return absl::OkStatus();
}

}  // namespace dfa
