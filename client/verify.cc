#include "client/verify.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

namespace dfa::client {
namespace {

HostTensor ZerosLike(const HostTensor& t, DType dtype) {
  HostTensor z = t;
  z.dtype = dtype;
  z.bytes.assign(static_cast<size_t>(z.size_bytes()), 0);
  return z;
}

float RoundTo(float x, DType t) {
  switch (t) {
    case DType::kBF16: return BF16ToFloat(FloatToBF16(x));
    case DType::kF16: return HalfToFloat(FloatToHalf(x));
    case DType::kF32: return x;
  }
  return x;
}

}  // namespace

HostMask::HostMask(const v1::AttentionSpec& spec) {
  const MaskSpec mask = MaskSpecOf(spec);
  kind = mask.Kind();
  if (kind == MaskKind::kIntervals) arrays = BuildMaskIntervals(mask, spec.batch(), spec.seq_len());
}

MaskIntervals HostMask::intervals() const {
  if (kind != MaskKind::kIntervals) return {};
  return {arrays.q_lo.data(), arrays.q_hi.data(), arrays.k_lo.data(), arrays.k_hi.data(),
          arrays.seq};
}

absl::StatusOr<ReferenceResult> ComputeReference(const v1::AttentionSpec& spec,
                                                 const HostTensor& q, const HostTensor& k,
                                                 const HostTensor& v, const HostTensor* dout,
                                                 int threads) {
  BackendOptions options;
  options.num_threads = threads;
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> backend, CreateBackend("cpu", options));
  ReferenceResult r;
  r.o = ZerosLike(q, DType::kF32);
  ASSIGN_OR_RETURN(r.lse, MakeTensor(spec, v1::TENSOR_LSE));
  // Documents and windows: the mask's interval arrays (host memory: the cpu backend).
  const HostMask host_mask(spec);
  const MaskKind mask = host_mask.kind;
  const MaskIntervals intervals = host_mask.intervals();
  ForwardArgs f;
  f.scale = EffectiveScale(spec);
  f.mask = mask;
  f.intervals = intervals;
  f.q = q.View();
  f.k = k.View();
  f.v = v.View();
  f.out = r.o.View();
  f.lse = r.lse.StatView();
  RETURN_IF_ERROR(backend->Forward(f));
  if (dout == nullptr) return r;

  HostTensor delta = r.lse;  // same BHS shape
  RETURN_IF_ERROR(backend->ComputeDelta(dout->View(), r.o.View(), delta.StatView(), nullptr));
  r.dq = ZerosLike(q, DType::kF32);
  r.dk = ZerosLike(k, DType::kF32);
  r.dv = ZerosLike(v, DType::kF32);
  BackwardArgs b;
  b.scale = f.scale;
  b.mask = mask;
  b.intervals = intervals;
  b.q = q.View();
  b.k = k.View();
  b.v = v.View();
  b.dout = dout->View();
  b.lse = r.lse.StatView();
  b.delta = delta.StatView();
  b.dq = r.dq.View();
  b.dk = r.dk.View();
  b.dv = r.dv.View();
  RETURN_IF_ERROR(backend->Backward(b));
  return r;
}

Comparison Compare(const std::string& name, const HostTensor& got, const HostTensor& ref) {
  Comparison c;
  c.name = name;
  if (got.elements() != ref.elements() || ref.dtype != DType::kF32) {
    c.max_abs_err = c.rel_l2_err = INFINITY;
    return c;
  }
  const float* r = reinterpret_cast<const float*>(ref.data());
  double err2 = 0, ref2 = 0, round2 = 0, round_max = 0, ref_max = 0;
  bool finite = true;
  for (int64_t i = 0; i < got.elements(); ++i) {
    const double g = LoadAsFloat(got.data(), got.dtype, i);
    const double x = r[i];
    if (!std::isfinite(g)) finite = false;
    const double e = std::abs(g - x);
    const double re = std::abs(static_cast<double>(RoundTo(r[i], got.dtype)) - x);
    err2 += e * e;
    ref2 += x * x;
    round2 += re * re;
    c.max_abs_err = std::max(c.max_abs_err, e);
    round_max = std::max(round_max, re);
    ref_max = std::max(ref_max, std::abs(x));
  }
  const double norm = std::sqrt(ref2) > 0 ? std::sqrt(ref2) : 1.0;
  c.rel_l2_err = std::sqrt(err2) / norm;
  c.rel_l2_tol = 2 * std::sqrt(round2) / norm + 1e-4;
  c.max_abs_tol = 2 * round_max + 1e-3 * ref_max + 1e-6;
  c.ok = finite && c.rel_l2_err <= c.rel_l2_tol && c.max_abs_err <= c.max_abs_tol;
  return c;
}

std::string Comparison::ToString() const {
  return absl::StrFormat("%-4s %s  max|err| %.3g (tol %.3g)  rel-L2 %.3g (tol %.3g)", name,
                         ok ? "ok  " : "FAIL", max_abs_err, max_abs_tol, rel_l2_err, rel_l2_tol);
}

}  // namespace dfa::client
