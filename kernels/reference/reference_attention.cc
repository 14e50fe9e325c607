#include "kernels/reference/reference_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace dfa::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Validates through the backends' own checks, with placeholder outputs of the right shape.
absl::Status Check(const Problem& p) {
  ForwardArgs a;
  a.scale = static_cast<float>(p.scale);
  a.mask = p.mask;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.q_row0 = p.q_row0;
  a.kv_row0 = p.kv_row0;
  a.out = p.q;
  a.out.dtype = DType::kF32;
  a.out.row_stride = a.out.batch_stride = 0;
  a.lse.data = reinterpret_cast<float*>(p.q.data);
  a.lse.batch = p.q.batch;
  a.lse.heads = p.q.heads;
  a.lse.rows = p.q.rows;
  if (p.mask == MaskKind::kIntervals) {
    if (p.spec == nullptr) return absl::InvalidArgumentError("spec: required for kIntervals");
    RETURN_IF_ERROR(ValidateMask(*p.spec, p.q.batch, p.seq));
    if (p.q_row0 + p.q.rows > p.seq || p.kv_row0 + p.k.rows > p.seq) {
      return absl::InvalidArgumentError(absl::StrCat("rows reach past seq = ", p.seq));
    }
    // The kernels' validation wants interval arrays; the reference reads the spec instead.
    a.mask = MaskKind::kFull;
  }
  if (!(p.scale > 0.0) || !std::isfinite(p.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale must be positive and finite, got ", p.scale));
  }
  return ValidateForward(a);
}

// A view's values as dense fp64 [B, rows, H, D].
std::vector<double> Dense(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.batch) * t.rows * t.heads * t.head_dim);
  size_t o = 0;
  for (int b = 0; b < t.batch; ++b) {
    for (int64_t r = 0; r < t.rows; ++r) {
      const int64_t base = b * t.BatchStride() + r * t.RowStride();
      for (int64_t i = 0; i < int64_t{t.heads} * t.head_dim; ++i) {
        out[o++] = LoadAsFloat(t.data, t.dtype, base + i);
      }
    }
  }
  return out;
}

// The problem's inputs as dense fp64 arrays.
struct DenseProblem {
  const Problem& p;
  std::vector<double> q, k, v;
  explicit DenseProblem(const Problem& problem)
      : p(problem), q(Dense(problem.q)), k(Dense(problem.k)), v(Dense(problem.v)) {}
  const double* Q(int b, int64_t i, int h) const {
    return &q[((b * p.q.rows + i) * p.q.heads + h) * int64_t{p.q.head_dim}];
  }
  const double* K(int b, int64_t j, int h) const {
    return &k[((b * p.k.rows + j) * p.k.heads + h) * int64_t{p.k.head_dim}];
  }
  const double* V(int b, int64_t j, int h) const {
    return &v[((b * p.k.rows + j) * p.k.heads + h) * int64_t{p.k.head_dim}];
  }
};

// The MaskSpec's definition (core/mask.h), pair by pair.
bool SpecSees(const MaskSpec& m, int b, int64_t i, int64_t j) {
  const std::vector<int64_t>& off = m.OffsetsOf(b);
  if (off.size() > 2) {
    // Document index: offsets <= position, less one.
    const auto di = std::upper_bound(off.begin(), off.end(), i);
    const auto dj = std::upper_bound(off.begin(), off.end(), j);
    if (di != dj) return false;
  }
  if (m.causal && j > i) return false;
  if (m.window_left >= 0 && j < i - m.window_left) return false;
  if (m.window_right >= 0 && j > i + m.window_right) return false;
  return true;
}

bool Visible(const Problem& p, int b, int64_t i, int64_t j) {
  if (p.mask == MaskKind::kIntervals) return SpecSees(*p.spec, b, p.q_row0 + i, p.kv_row0 + j);
  return p.mask == MaskKind::kFull || p.kv_row0 + j <= p.q_row0 + i;
}

// Scores of query row i of head h against all keys (scaled; -inf where masked).
void Scores(const DenseProblem& dp, int b, int h, int64_t i, std::vector<double>& s) {
  const Problem& p = dp.p;
  const int hk = h / (p.q.heads / p.k.heads);
  s.assign(p.k.rows, kNegInf);
  const double* q = dp.Q(b, i, h);
  for (int64_t j = 0; j < p.k.rows; ++j) {
    if (!Visible(p, b, i, j)) continue;
    const double* k = dp.K(b, j, hk);
    double dot = 0.0;
    for (int d = 0; d < p.q.head_dim; ++d) dot += q[d] * k[d];
    s[j] = dot * p.scale;
  }
}

int64_t OutIndex(const TensorView& t, int b, int64_t r, int h) {
  return ((b * t.rows + r) * t.heads + h) * int64_t{t.head_dim};
}

}  // namespace

absl::StatusOr<ForwardResult> Forward(const Problem& p) {
  RETURN_IF_ERROR(Check(p));
  const int B = p.q.batch, H = p.q.heads, D = p.q.head_dim;
  const int64_t m = p.q.rows;
  ForwardResult r;
  r.out.assign(static_cast<size_t>(B) * m * H * D, 0.0);
  r.lse.assign(static_cast<size_t>(B) * H * m, kNegInf);
  const DenseProblem dp(p);
  std::vector<double> s;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / p.k.heads);
      for (int64_t i = 0; i < m; ++i) {
        Scores(dp, b, h, i, s);
        const double mx = *std::max_element(s.begin(), s.end());
        if (mx == kNegInf) continue;  // sees no key: LSE -inf, output 0
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        double* o = &r.out[OutIndex(p.q, b, i, h)];
        for (int64_t j = 0; j < p.k.rows; ++j) {
          if (s[j] == 0.0) continue;
          const double* v = dp.V(b, j, hk);
          for (int d = 0; d < D; ++d) o[d] += s[j] / sum * v[d];
        }
        r.lse[(static_cast<size_t>(b) * H + h) * m + i] = mx + std::log(sum);
      }
    }
  }
  return r;
}

absl::StatusOr<Gradients> BackwardUnit(const Problem& p, const TensorView& dout,
                                       const std::vector<double>& lse,
                                       const std::vector<double>& delta) {
  RETURN_IF_ERROR(Check(p));
  const int B = p.q.batch, H = p.q.heads, Hk = p.k.heads, D = p.q.head_dim;
  const int64_t m = p.q.rows, n = p.k.rows;
  if (dout.data == nullptr || dout.batch != B || dout.rows != m || dout.heads != H ||
      dout.head_dim != D) {
    return absl::InvalidArgumentError("dout: null or shape does not match q");
  }
  const size_t stats = static_cast<size_t>(B) * H * m;
  if (lse.size() != stats || delta.size() != stats) {
    return absl::InvalidArgumentError(
        absl::StrCat("lse and delta must hold B*Hq*m = ", stats, " values"));
  }
  Gradients g;
  g.dq.assign(static_cast<size_t>(B) * m * H * D, 0.0);
  g.dk.assign(static_cast<size_t>(B) * n * Hk * D, 0.0);
  g.dv.assign(g.dk.size(), 0.0);
  const DenseProblem dp(p);
  const std::vector<double> dout_d = Dense(dout);
  std::vector<double> s;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / Hk);
      for (int64_t i = 0; i < m; ++i) {
        const double L = lse[(static_cast<size_t>(b) * H + h) * m + i];
        const double Di = delta[(static_cast<size_t>(b) * H + h) * m + i];
        if (!std::isfinite(L)) continue;  // the row sees no key at all: no gradient
        Scores(dp, b, h, i, s);
        double* dq = &g.dq[OutIndex(p.q, b, i, h)];
        const double* q = dp.Q(b, i, h);
        const double* go = &dout_d[OutIndex(p.q, b, i, h)];
        for (int64_t j = 0; j < n; ++j) {
          if (s[j] == kNegInf) continue;
          const double pij = std::exp(s[j] - L);
          const double* k = dp.K(b, j, hk);
          const double* v = dp.V(b, j, hk);
          double dpij = 0.0;
          for (int d = 0; d < D; ++d) dpij += go[d] * v[d];
          const double ds = pij * (dpij - Di);
          double* dk = &g.dk[OutIndex(p.k, b, j, hk)];
          double* dv = &g.dv[OutIndex(p.k, b, j, hk)];
          for (int d = 0; d < D; ++d) {
            dv[d] += pij * go[d];
            dk[d] += p.scale * ds * q[d];
            dq[d] += p.scale * ds * k[d];
          }
        }
      }
    }
  }
  return g;
}

absl::StatusOr<Gradients> Backward(const Problem& p, const TensorView& dout) {
  ASSIGN_OR_RETURN(ForwardResult f, Forward(p));
  const int B = p.q.batch, H = p.q.heads, D = p.q.head_dim;
  const int64_t m = p.q.rows;
  if (dout.data == nullptr || dout.batch != B || dout.rows != m || dout.heads != H ||
      dout.head_dim != D) {
    return absl::InvalidArgumentError("dout: null or shape does not match q");
  }
  const std::vector<double> dout_d = Dense(dout);
  std::vector<double> delta(static_cast<size_t>(B) * H * m, 0.0);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < H; ++h) {
      for (int64_t i = 0; i < m; ++i) {
        const double* o = &f.out[OutIndex(p.q, b, i, h)];
        const double* go = &dout_d[OutIndex(p.q, b, i, h)];
        double sum = 0.0;
        for (int d = 0; d < D; ++d) sum += go[d] * o[d];
        delta[(static_cast<size_t>(b) * H + h) * m + i] = sum;
      }
    }
  }
  return BackwardUnit(p, dout, f.lse, delta);
}

}  // namespace dfa::reference
