// The "cudnn" AttentionBackend (contract in cudnn_backend.h): unit geometry -> one cuDNN SDPA
// graph call (cudnn_sdpa_graphs.h) plus the glue our interface needs (fp32 outputs, LSE merge,
// += of gradients, empty rows), and our CUDA backend for the rest.
#include "kernels/cuda/cudnn_backend.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cudnn_rowops.h"
#include "kernels/cuda/cudnn_scratch.h"
#include "kernels/cuda/cudnn_sdpa_graphs.h"
#include "kernels/cuda/cudnn_unit_geometry.h"

namespace dfa {
namespace {

#define CUDNN_BE_CUDA_CHECK(expr, what)                                                                  \
  do {                                                                                                   \
    const cudaError_t dfa_err_ = (expr);                                                                 \
    if (dfa_err_ != cudaSuccess) {                                                                       \
      return absl::InternalError(absl::StrCat("cudnn backend: ", what, ": ", cudaGetErrorString(dfa_err_))); \
    }                                                                                                    \
  } while (0)

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }
bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Why cuDNN cannot take this tensor directly ("" when it can).
std::string Unfit(const TensorView& t, const char* field) {
  if (t.dtype != DType::kBF16 && t.dtype != DType::kF16) return absl::StrCat(field, " is not bf16/f16");
  if (t.head_dim % 8 != 0 || t.head_dim > 256) return absl::StrCat(field, ".head_dim not a multiple of 8 <= 256");
  if (!Aligned16(t.data) || t.RowStride() % 8 != 0 || t.BatchStride() % 8 != 0) {
    return absl::StrCat(field, " not 16-byte aligned with strides that are multiples of 8");
  }
  return "";
}


TensorView DenseLike(const TensorView& like, void* data, DType dtype) {
  TensorView t = like;
  t.data = data;
  t.dtype = dtype;
  t.row_stride = 0;
  t.batch_stride = 0;
  return t;
}
RowStatView DenseStat(int batch, int heads, int64_t rows, void* data) {
  RowStatView s;
  s.data = static_cast<float*>(data);
  s.batch = batch;
  s.heads = heads;
  s.rows = rows;
  return s;
}

// LSE/Stats can be handed to cuDNN in place when its rows start 16-byte aligned.
bool StatFits(const RowStatView& s) {
  return Aligned16(s.data) && s.HeadStride() % 4 == 0 && s.BatchStride() % 4 == 0;
}

cudaError_t CopyStat(const RowStatView& src, const RowStatView& dst, cudaStream_t st) {
  for (int b = 0; b < src.batch; ++b) {
    const cudaError_t err = cudaMemcpy2DAsync(dst.data + b * dst.BatchStride(), dst.HeadStride() * sizeof(float),
                                              src.data + b * src.BatchStride(), src.HeadStride() * sizeof(float),
                                              src.rows * sizeof(float), src.heads, cudaMemcpyDeviceToDevice, st);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudnn::RowsView Rows(const TensorView& t) { return {t.data, static_cast<int>(t.dtype), t.BatchStride(), t.RowStride()}; }
cudnn::RowsShape ShapeOf(const TensorView& t) { return {t.batch, t.rows, t.heads, t.head_dim}; }
void Strides(const TensorView& t, int64_t s[2]) {
  s[0] = t.BatchStride();
  s[1] = t.RowStride();
}

cudnn::SdpaProblem ProblemOf(bool backward, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& o, const RowStatView& lse, int64_t right_bound, float scale) {
  cudnn::SdpaProblem p;
  p.backward = backward;
  p.dtype = static_cast<int>(q.dtype);
  p.batch = q.batch;
  p.q_heads = q.heads;
  p.kv_heads = k.heads;
  p.head_dim = q.head_dim;
  p.q_rows = q.rows;
  p.kv_rows = k.rows;
  p.right_bound = right_bound;
  p.scale = scale;
  Strides(q, p.q_s);
  Strides(k, p.k_s);
  Strides(v, p.v_s);
  Strides(o, p.o_s);
  p.lse_s[0] = lse.BatchStride();
  p.lse_s[1] = lse.HeadStride();
  return p;
}

class CudnnBackend final : public CudnnAttentionBackend {
 public:
  CudnnBackend(int device, const cuda::DeviceFacts& facts, const cuda::KernelChoice& choice,
               std::unique_ptr<AttentionBackend> cuda, std::unique_ptr<cudnn::SdpaGraphs> graphs,
               std::unique_ptr<ScratchAllocator> scratch)
      : device_(device),
        facts_(facts),
        choice_(choice),
        cuda_(std::move(cuda)),
        graphs_(std::move(graphs)),
        scratch_(std::move(scratch)) {}
  ~CudnnBackend() override {
    if (last_use_ != nullptr) cudaEventDestroy(last_use_);
  }

  std::string_view Name() const override { return "cudnn"; }
  CudnnBackendCounters Counters() const override { return counters_; }
  std::string CudnnVersion() const override { return graphs_->LibraryVersion(); }
  void SetOutFromDelta(bool enabled) override { out_from_delta_ = enabled; }

  absl::Status Forward(const ForwardArgs& a) override {
    RETURN_IF_ERROR(ValidateForward(a));
    // Our TMA warp-specialised forward where the table says so (merges into fp32 partials in place),
    // and for every kIntervals unit (documents, windows: docs/kernels-cudnn.md says why).
    if (a.mask == MaskKind::kIntervals || cuda::CudnnRunsOwnForward(choice_, facts_, a.q.head_dim)) {
      RETURN_IF_ERROR(cuda_->Forward(a));
      ++counters_.own_forward;
      return absl::OkStatus();
    }
    std::string why = Unfit(a.q, "q");
    if (why.empty()) why = Unfit(a.k, "k");
    if (why.empty()) why = Unfit(a.v, "v");
    if (why.empty() && a.out.dtype != DType::kF32) why = Unfit(a.out, "out");
    if (!why.empty()) return FallbackForward(a, why);
    const cudnn::UnitGeometry g =
        cudnn::PlanUnit(a.q_row0, a.q.rows, a.kv_row0, a.k.rows, a.mask == MaskKind::kCausal);
    const cudaStream_t st = AsStream(a.stream);
    RETURN_IF_ERROR(BeginCall(st));
    if (!a.accumulate && g.empty_rows > 0) {
      const TensorView out = a.out.Slice(0, g.empty_rows);
      const RowStatView lse = a.lse.Slice(0, g.empty_rows);
      CUDNN_BE_CUDA_CHECK(cudnn::LaunchMarkEmptyRows(ShapeOf(out), Rows(out), lse.data, lse.BatchStride(),
                                                     lse.HeadStride(), st),
                          "mark empty rows");
    }
    if (g.rows > 0) {
      absl::Status s = ForwardRows(a, g, st);
      if (absl::IsUnimplemented(s)) return FallbackForward(a, std::string(s.message()));
      RETURN_IF_ERROR(s);
    }
    ++counters_.cudnn_forward;
    return EndCall(st);
  }

  absl::Status Backward(const BackwardArgs& a) override {
    RETURN_IF_ERROR(ValidateBackward(a));
    // Our pipe backward where the table says so (fp32 += into dQ, dK, dV directly, no glue), and
    // for every kIntervals unit.
    if (a.mask == MaskKind::kIntervals ||
        cuda::CudnnRunsOwnBackward(choice_, facts_, a.q.head_dim)) {
      RETURN_IF_ERROR(cuda_->Backward(a));
      ++counters_.own_backward;
      return absl::OkStatus();
    }
    std::string why = a.out.data == nullptr && !out_from_delta_ ? "BackwardArgs.out (final O) not given"
                                                                : Unfit(a.q, "q");
    if (why.empty()) why = Unfit(a.k, "k");
    if (why.empty()) why = Unfit(a.v, "v");
    if (why.empty()) why = Unfit(a.dout, "dout");
    if (why.empty() && a.out.data != nullptr && a.out.dtype != DType::kF32) why = Unfit(a.out, "out");
    if (!why.empty()) return FallbackBackward(a, why);
    const cudnn::UnitGeometry g =
        cudnn::PlanUnit(a.q_row0, a.q.rows, a.kv_row0, a.k.rows, a.mask == MaskKind::kCausal);
    if (g.rows == 0) {  // no visible (query, key) pair: no contribution
      ++counters_.cudnn_backward;
      return absl::OkStatus();
    }
    const cudaStream_t st = AsStream(a.stream);
    RETURN_IF_ERROR(BeginCall(st));
    absl::Status s = BackwardRows(a, g, st);
    if (absl::IsUnimplemented(s)) return FallbackBackward(a, std::string(s.message()));
    RETURN_IF_ERROR(s);
    ++counters_.cudnn_backward;
    return EndCall(st);
  }

  absl::Status Merge(const MergeArgs& a) override { return cuda_->Merge(a); }
  absl::Status ComputeDelta(const TensorView& dout, const TensorView& out, const RowStatView& delta,
                            void* stream) override {
    return cuda_->ComputeDelta(dout, out, delta, stream);
  }
  absl::Status Convert(const TensorView& src, const TensorView& dst, void* stream) override {
    return cuda_->Convert(src, dst, stream);
  }
  absl::Status Accumulate(const TensorView& src, const TensorView& dst, void* stream) override {
    return cuda_->Accumulate(src, dst, stream);
  }
  absl::StatusOr<void*> Alloc(size_t bytes) override { return cuda_->Alloc(bytes); }
  void Free(void* p) override { cuda_->Free(p); }
  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) override {
    return cuda_->Copy(dst, src, bytes, kind, stream);
  }
  absl::Status Memset(void* dst, int value, size_t bytes, void* stream) override {
    return cuda_->Memset(dst, value, bytes, stream);
  }
  absl::Status Synchronize(void* stream) override { return cuda_->Synchronize(stream); }
  absl::StatusOr<void*> CreateStream() override { return cuda_->CreateStream(); }
  void DestroyStream(void* stream) override { cuda_->DestroyStream(stream); }

 private:
  // Rows [g.row0, g.row0 + g.rows) with keys [0, g.kv_rows): cuDNN writes O (into `out` itself
  // when it has q's dtype and is not merged into, else into scratch) and LSE.
  absl::Status ForwardRows(const ForwardArgs& a, const cudnn::UnitGeometry& g, cudaStream_t st) {
    const TensorView q = a.q.Slice(g.row0, g.rows), out = a.out.Slice(g.row0, g.rows);
    const TensorView k = a.k.Slice(0, g.kv_rows), v = a.v.Slice(0, g.kv_rows);
    const RowStatView lse = a.lse.Slice(g.row0, g.rows);
    const bool direct_o = !a.accumulate && out.dtype == q.dtype;
    const bool direct_lse = !a.accumulate && StatFits(lse);
    TensorView o_dst = out;
    if (!direct_o) {
      ASSIGN_OR_RETURN(void* p, o_lo_.Get(q.batch * q.rows * q.heads * q.head_dim * DTypeSize(q.dtype)));
      o_dst = DenseLike(q, p, q.dtype);
    }
    RowStatView lse_dst = lse;
    if (!direct_lse) {
      ASSIGN_OR_RETURN(void* p, lse_tmp_.Get(q.batch * q.heads * q.rows * sizeof(float)));
      lse_dst = DenseStat(q.batch, q.heads, q.rows, p);
    }
    cudnn::SdpaPointers ptrs;
    ptrs.q = q.data;
    ptrs.k = k.data;
    ptrs.v = v.data;
    ptrs.o = o_dst.data;
    ptrs.lse = lse_dst.data;
    RETURN_IF_ERROR(graphs_->Run(ProblemOf(false, q, k, v, o_dst, lse_dst, g.right_bound, a.scale), ptrs, st));
    if (!a.accumulate) {
      if (!direct_o) RETURN_IF_ERROR(cuda_->Convert(o_dst, out, st));
      if (!direct_lse) CUDNN_BE_CUDA_CHECK(CopyStat(lse_dst, lse, st), "copy lse");
      return absl::OkStatus();
    }
    CUDNN_BE_CUDA_CHECK(cudnn::LaunchMergeInto(ShapeOf(out), Rows(o_dst), lse_dst.data, lse_dst.BatchStride(),
                                               lse_dst.HeadStride(), Rows(out), lse.data, lse.BatchStride(),
                                               lse.HeadStride(), st),
                        "merge into the partial");
    return absl::OkStatus();
  }

  // cuDNN writes this unit's dQ, dK, dV (q's dtype) into scratch; they are added into the fp32
  // accumulators of the rows and keys the unit covers.
  absl::Status BackwardRows(const BackwardArgs& a, const cudnn::UnitGeometry& g, cudaStream_t st) {
    const TensorView q = a.q.Slice(g.row0, g.rows), dout = a.dout.Slice(g.row0, g.rows);
    const TensorView dq = a.dq.Slice(g.row0, g.rows);
    const TensorView k = a.k.Slice(0, g.kv_rows), v = a.v.Slice(0, g.kv_rows);
    const TensorView dk = a.dk.Slice(0, g.kv_rows), dv = a.dv.Slice(0, g.kv_rows);
    RowStatView lse = a.lse.Slice(g.row0, g.rows);
    const size_t esize = DTypeSize(q.dtype);
    TensorView o_in;
    if (a.out.data == nullptr) {  // stand-in O from D (SetOutFromDelta)
      ASSIGN_OR_RETURN(void* p, o_lo_.Get(q.batch * q.rows * q.heads * q.head_dim * esize));
      o_in = DenseLike(q, p, q.dtype);
      const RowStatView delta = a.delta.Slice(g.row0, g.rows);
      CUDNN_BE_CUDA_CHECK(cudnn::LaunchOutFromDelta(ShapeOf(dout), Rows(dout), delta.data, delta.BatchStride(),
                                                    delta.HeadStride(), Rows(o_in), st),
                          "stand-in O from delta");
    } else if (a.out.dtype != q.dtype) {
      ASSIGN_OR_RETURN(void* p, o_lo_.Get(q.batch * q.rows * q.heads * q.head_dim * esize));
      o_in = DenseLike(q, p, q.dtype);
      RETURN_IF_ERROR(cuda_->Convert(a.out.Slice(g.row0, g.rows), o_in, st));
    } else {
      o_in = a.out.Slice(g.row0, g.rows);
    }
    // cuDNN before 9.26 reads the backward's Stats only as a packed [B, H, S, 1] tensor.
    if (!Aligned16(lse.data) || lse.HeadStride() != lse.rows || lse.BatchStride() != lse.heads * lse.rows) {
      ASSIGN_OR_RETURN(void* p, lse_tmp_.Get(q.batch * q.heads * q.rows * sizeof(float)));
      const RowStatView dense = DenseStat(q.batch, q.heads, q.rows, p);
      CUDNN_BE_CUDA_CHECK(CopyStat(lse, dense, st), "copy lse");
      lse = dense;
    }
    ASSIGN_OR_RETURN(void* pdq, dq_lo_.Get(q.batch * q.rows * q.heads * q.head_dim * esize));
    ASSIGN_OR_RETURN(void* pdk, dk_lo_.Get(k.batch * k.rows * k.heads * k.head_dim * esize));
    ASSIGN_OR_RETURN(void* pdv, dv_lo_.Get(k.batch * k.rows * k.heads * k.head_dim * esize));
    const TensorView dq_lo = DenseLike(q, pdq, q.dtype), dk_lo = DenseLike(k, pdk, q.dtype),
                     dv_lo = DenseLike(k, pdv, q.dtype);
    cudnn::SdpaProblem p = ProblemOf(true, q, k, v, o_in, lse, g.right_bound, a.scale);
    Strides(dout, p.do_s);
    Strides(dq_lo, p.dq_s);
    Strides(dk_lo, p.dk_s);
    Strides(dv_lo, p.dv_s);
    cudnn::SdpaPointers ptrs;
    ptrs.q = q.data;
    ptrs.k = k.data;
    ptrs.v = v.data;
    ptrs.o = o_in.data;
    ptrs.lse = lse.data;
    ptrs.dout = dout.data;
    ptrs.dq = pdq;
    ptrs.dk = pdk;
    ptrs.dv = pdv;
    RETURN_IF_ERROR(graphs_->Run(p, ptrs, st));
    CUDNN_BE_CUDA_CHECK(cudnn::LaunchAddInto(ShapeOf(dq), Rows(dq_lo), Rows(dq), st), "add dq");
    CUDNN_BE_CUDA_CHECK(cudnn::LaunchAddInto(ShapeOf(dk), Rows(dk_lo), Rows(dk), st), "add dk");
    CUDNN_BE_CUDA_CHECK(cudnn::LaunchAddInto(ShapeOf(dv), Rows(dv_lo), Rows(dv), st), "add dv");
    return absl::OkStatus();
  }

  absl::Status FallbackForward(const ForwardArgs& a, std::string why) {
    ++counters_.fallback_forward;
    counters_.last_fallback_reason = std::move(why);
    return cuda_->Forward(a);
  }
  absl::Status FallbackBackward(const BackwardArgs& a, std::string why) {
    ++counters_.fallback_backward;
    counters_.last_fallback_reason = std::move(why);
    return cuda_->Backward(a);
  }

  // The scratch buffers and the cuDNN workspace are shared by all calls: a call on a new stream
  // waits for the previous call's stream (on the device).
  absl::Status BeginCall(cudaStream_t st) {
    CUDNN_BE_CUDA_CHECK(cudaSetDevice(device_), "cudaSetDevice");
    if (last_use_ == nullptr) {
      CUDNN_BE_CUDA_CHECK(cudaEventCreateWithFlags(&last_use_, cudaEventDisableTiming), "cudaEventCreate");
    } else if (st != last_stream_) {
      CUDNN_BE_CUDA_CHECK(cudaStreamWaitEvent(st, last_use_, 0), "cudaStreamWaitEvent");
    }
    return absl::OkStatus();
  }
  absl::Status EndCall(cudaStream_t st) {
    CUDNN_BE_CUDA_CHECK(cudaEventRecord(last_use_, st), "cudaEventRecord");
    last_stream_ = st;
    return absl::OkStatus();
  }

  int device_;
  cuda::DeviceFacts facts_;
  cuda::KernelChoice choice_;
  std::unique_ptr<AttentionBackend> cuda_;
  std::unique_ptr<cudnn::SdpaGraphs> graphs_;
  std::unique_ptr<ScratchAllocator> scratch_;  // before the buffers: they release into it
  cudnn::ScratchBuffer o_lo_{scratch_.get(), "scratch"}, lse_tmp_{scratch_.get(), "scratch"},
      dq_lo_{scratch_.get(), "scratch"}, dk_lo_{scratch_.get(), "scratch"},
      dv_lo_{scratch_.get(), "scratch"};
  cudaEvent_t last_use_ = nullptr;
  cudaStream_t last_stream_ = nullptr;
  CudnnBackendCounters counters_;
  bool out_from_delta_ = true;  // SetOutFromDelta
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudnnAttentionBackend>> CreateCudnnBackend(
    const BackendOptions& options, const cuda::KernelChoice& choice) {
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> cuda, CreateCudaBackend(options, choice));
  auto scratch = std::make_unique<ScratchAllocator>(options.scratch);
  ASSIGN_OR_RETURN(std::unique_ptr<cudnn::SdpaGraphs> graphs,
                   cudnn::SdpaGraphs::Create(options.device, scratch.get()));
  int major = 0, minor = 0, sms = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options.device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, options.device) != cudaSuccess) {
    return absl::InternalError("cudnn backend: cannot read the device's compute capability");
  }
  cuda::DeviceFacts facts;
  facts.sm90 = major == 9 && minor == 0;
  facts.sms = sms;
  return std::unique_ptr<CudnnAttentionBackend>(new CudnnBackend(
      options.device, facts, choice, std::move(cuda), std::move(graphs), std::move(scratch)));
}

}  // namespace dfa
