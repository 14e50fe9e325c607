#include "kernels/attention_backend.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef DFA_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#ifdef DFA_HAVE_CUDNN
#include "kernels/cuda/cudnn_backend.h"
#endif

namespace dfa {

TensorView TensorView::Slice(int64_t r0, int64_t n) const {
  TensorView s = *this;
  s.row_stride = RowStride();
  s.batch_stride = BatchStride();
  s.rows = n;
  s.data = static_cast<char*>(data) + r0 * RowStride() * DTypeSize(dtype);
  return s;
}

RowStatView RowStatView::Slice(int64_t r0, int64_t n) const {
  RowStatView s = *this;
  s.head_stride = HeadStride();
  s.batch_stride = BatchStride();
  s.rows = n;
  s.data = data + r0;
  return s;
}

absl::Status AttentionBackend::Accumulate(const TensorView&, const TensorView&, void*) {
  return absl::UnimplementedError(
      absl::StrCat("backend '", std::string(Name()), "' does not implement Accumulate"));
}

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateBackend(std::string_view name,
                                                                const BackendOptions& options) {
  if (name == "cpu") return CreateCpuBackend(options);
  if (name == "cudnn") {
#ifdef DFA_HAVE_CUDNN
    auto cudnn = CreateCudnnBackend(options);
    if (!cudnn.ok()) return cudnn.status();
    return std::unique_ptr<AttentionBackend>(std::move(*cudnn));
#else
    return absl::UnavailableError("backend 'cudnn': this build has no cuDNN support (frontend headers not found)");
#endif
  }
  if (name == "cuda" || name == "auto") {
#ifdef DFA_HAVE_CUDA
    auto cuda = CreateCudaBackend(options);
    if (cuda.ok() || name == "cuda") return cuda;
#else
    if (name == "cuda") {
      return absl::UnavailableError("backend 'cuda': this build has no CUDA support");
    }
#endif
    return CreateCpuBackend(options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend: unknown name '", absl::string_view(name.data(), name.size()), "' (expected cpu, cuda, cudnn or auto)"));
}

namespace {

absl::Status CheckView(const TensorView& t, absl::string_view field, bool allow_empty) {
  if (t.data == nullptr && t.rows > 0) return absl::InvalidArgumentError(absl::StrCat(field, ": null data"));
  if (t.batch < 1) return absl::InvalidArgumentError(absl::StrCat(field, ".batch must be >= 1, got ", t.batch));
  if (t.rows < 0 || (!allow_empty && t.rows == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".rows must be > 0, got ", t.rows));
  }
  if (t.heads < 1) return absl::InvalidArgumentError(absl::StrCat(field, ".heads must be >= 1, got ", t.heads));
  if (t.head_dim < 1 || t.head_dim > 512) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".head_dim must be in [1, 512], got ", t.head_dim));
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype is not f32, bf16 or f16"));
  }
  if (t.row_stride != 0 && t.row_stride < int64_t{t.heads} * t.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".row_stride smaller than heads*head_dim"));
  }
  return absl::OkStatus();
}

absl::Status CheckStat(const RowStatView& s, const TensorView& like, absl::string_view field) {
  if (s.data == nullptr && s.rows > 0) return absl::InvalidArgumentError(absl::StrCat(field, ": null data"));
  if (s.batch != like.batch || s.heads != like.heads || s.rows != like.rows) {
    return absl::InvalidArgumentError(absl::StrCat(field, " shape [", s.batch, ",", s.heads, ",", s.rows,
                                                   "] does not match [", like.batch, ",", like.heads,
                                                   ",", like.rows, "]"));
  }
  return absl::OkStatus();
}

absl::Status SameShape(const TensorView& a, const TensorView& b, absl::string_view fa, absl::string_view fb) {
  if (a.batch != b.batch || a.rows != b.rows || a.heads != b.heads || a.head_dim != b.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(fb, " shape [", b.batch, ",", b.rows, ",", b.heads, ",",
                                                   b.head_dim, "] does not match ", fa, " [", a.batch, ",",
                                                   a.rows, ",", a.heads, ",", a.head_dim, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckQKV(const TensorView& q, const TensorView& k, const TensorView& v, float scale) {
  RETURN_IF_ERROR(CheckView(q, "q", false));
  RETURN_IF_ERROR(CheckView(k, "k", false));
  RETURN_IF_ERROR(CheckView(v, "v", false));
  RETURN_IF_ERROR(SameShape(k, v, "k", "v"));
  if (k.batch != q.batch) return absl::InvalidArgumentError("k.batch does not match q.batch");
  if (k.head_dim != q.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("k.head_dim ", k.head_dim, " does not match q.head_dim ", q.head_dim));
  }
  if (q.heads % k.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q.heads (", q.heads, ") is not a multiple of k.heads (", k.heads, ")"));
  }
  if (k.dtype != q.dtype || v.dtype != q.dtype) {
    return absl::InvalidArgumentError("k and v must have q's dtype");
  }
  if (!(scale > 0.f) || !std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat("scale must be positive and finite, got ", scale));
  }
  return absl::OkStatus();
}

// The mask kind, and for kIntervals the arrays and that the unit's rows lie inside them.
absl::Status CheckMask(MaskKind mask, const MaskIntervals& iv, int64_t q_row0, int64_t m,
                       int64_t kv_row0, int64_t n) {
  if (mask == MaskKind::kFull || mask == MaskKind::kCausal) return absl::OkStatus();
  if (mask != MaskKind::kIntervals) {
    return absl::InvalidArgumentError(absl::StrCat("mask: unknown kind ", static_cast<int>(mask)));
  }
  if (iv.q_lo == nullptr || iv.q_hi == nullptr || iv.k_lo == nullptr || iv.k_hi == nullptr) {
    return absl::InvalidArgumentError("intervals: kIntervals needs q_lo, q_hi, k_lo and k_hi");
  }
  if (iv.seq < 1 || iv.seq > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("intervals.seq must be in [1, 2^31 - 1], got ", iv.seq));
  }
  if (q_row0 + m > iv.seq) {
    return absl::InvalidArgumentError(absl::StrCat("q rows [", q_row0, ", ", q_row0 + m,
                                                   ") reach past intervals.seq = ", iv.seq));
  }
  if (kv_row0 + n > iv.seq) {
    return absl::InvalidArgumentError(absl::StrCat("kv rows [", kv_row0, ", ", kv_row0 + n,
                                                   ") reach past intervals.seq = ", iv.seq));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateForward(const ForwardArgs& a) {
  RETURN_IF_ERROR(CheckQKV(a.q, a.k, a.v, a.scale));
  RETURN_IF_ERROR(CheckView(a.out, "out", false));
  RETURN_IF_ERROR(SameShape(a.q, a.out, "q", "out"));
  if (a.out.dtype != DType::kF32 && (a.accumulate || a.out.dtype != a.q.dtype)) {
    return absl::InvalidArgumentError("out.dtype must be f32 (or q's dtype when not accumulating)");
  }
  RETURN_IF_ERROR(CheckStat(a.lse, a.q, "lse"));
  if (a.q_row0 < 0 || a.kv_row0 < 0) return absl::InvalidArgumentError("q_row0 and kv_row0 must be >= 0");
  return CheckMask(a.mask, a.intervals, a.q_row0, a.q.rows, a.kv_row0, a.k.rows);
}

absl::Status ValidateBackward(const BackwardArgs& a) {
  RETURN_IF_ERROR(CheckQKV(a.q, a.k, a.v, a.scale));
  RETURN_IF_ERROR(CheckView(a.dout, "dout", false));
  RETURN_IF_ERROR(SameShape(a.q, a.dout, "q", "dout"));
  if (a.dout.dtype != a.q.dtype) return absl::InvalidArgumentError("dout must have q's dtype");
  RETURN_IF_ERROR(CheckStat(a.lse, a.q, "lse"));
  RETURN_IF_ERROR(CheckStat(a.delta, a.q, "delta"));
  RETURN_IF_ERROR(CheckView(a.dq, "dq", false));
  RETURN_IF_ERROR(SameShape(a.q, a.dq, "q", "dq"));
  RETURN_IF_ERROR(CheckView(a.dk, "dk", false));
  RETURN_IF_ERROR(SameShape(a.k, a.dk, "k", "dk"));
  RETURN_IF_ERROR(CheckView(a.dv, "dv", false));
  RETURN_IF_ERROR(SameShape(a.v, a.dv, "v", "dv"));
  if (a.dq.dtype != DType::kF32 || a.dk.dtype != DType::kF32 || a.dv.dtype != DType::kF32) {
    return absl::InvalidArgumentError("dq, dk and dv must be f32 accumulators");
  }
  if (a.q_row0 < 0 || a.kv_row0 < 0) return absl::InvalidArgumentError("q_row0 and kv_row0 must be >= 0");
  RETURN_IF_ERROR(CheckMask(a.mask, a.intervals, a.q_row0, a.q.rows, a.kv_row0, a.k.rows));
  if (a.out.data != nullptr) {
    RETURN_IF_ERROR(CheckView(a.out, "out", false));
    RETURN_IF_ERROR(SameShape(a.q, a.out, "q", "out"));
    if (a.out.dtype != DType::kF32 && a.out.dtype != a.q.dtype) {
      return absl::InvalidArgumentError("out (the final O) must be f32 or q's dtype");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateMerge(const MergeArgs& a) {
  RETURN_IF_ERROR(CheckView(a.out_a, "out_a", false));
  RETURN_IF_ERROR(CheckView(a.out_b, "out_b", false));
  RETURN_IF_ERROR(SameShape(a.out_a, a.out_b, "out_a", "out_b"));
  if (a.out_a.dtype != DType::kF32 || a.out_b.dtype != DType::kF32) {
    return absl::InvalidArgumentError("merge: partial outputs must be f32");
  }
  RETURN_IF_ERROR(CheckStat(a.lse_a, a.out_a, "lse_a"));
  RETURN_IF_ERROR(CheckStat(a.lse_b, a.out_b, "lse_b"));
  return absl::OkStatus();
}

}  // namespace dfa
