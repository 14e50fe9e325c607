// The CUDA AttentionBackend: validates arguments, turns them into the kernels' plain params,
// picks the kernel by the table of kernel_dispatch.h and dispatches on (dtype, head dim) to the
// launchers of flash_launch.cuh; row-wise ops in rowwise_ops.cu, accumulate.cu.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/accumulate.h"
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/rowwise_ops.h"

namespace dfa {
namespace {

// Turns a CUDA runtime result into a Status naming the operation.
#define CUDA_RETURN_IF_ERROR(expr, what)                                                   \
  do {                                                                                     \
    const cudaError_t dfa_cuda_err_ = (expr);                                              \
    if (dfa_cuda_err_ != cudaSuccess) {                                                    \
      return absl::InternalError(absl::StrCat("cuda backend: ", what, ": ",                \
                                              cudaGetErrorString(dfa_cuda_err_)));         \
    }                                                                                      \
  } while (0)

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

bool Aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// The fused kernels read 2-byte tensors with 16-byte copies and write fp32 ones in pairs.
absl::Status CheckKernelView(const TensorView& t, absl::string_view field) {
  if (t.dtype == DType::kF32) {
    if (!Aligned(t.data, 8) || t.RowStride() % 2 != 0 || t.BatchStride() % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuda backend: ", field, " (f32) needs 8-byte aligned data and even row/batch strides"));
    }
    return absl::OkStatus();
  }
  if (!Aligned(t.data, 16) || t.RowStride() % 8 != 0 || t.BatchStride() % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda backend: ", field, " needs 16-byte aligned data and row/batch strides that are multiples of 8"));
  }
  return absl::OkStatus();
}

absl::Status CheckKernelDtypeAndDim(const TensorView& q) {
  if (q.dtype != DType::kBF16 && q.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda backend: q.dtype ", std::string(DTypeName(q.dtype)),
        " is not supported by the fused kernels (use bf16 or f16; Convert() can cast)"));
  }
  if (q.head_dim != 64 && q.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: q.head_dim must be 64 or 128, got ", q.head_dim));
  }
  return absl::OkStatus();
}

// MaskKind::kIntervals (checked by ValidateForward / ValidateBackward): the kernels' params
// (causal off: the intervals carry the whole mask).
cuda::IntervalParams IvParams(MaskKind mask, const MaskIntervals& iv) {
  cuda::IntervalParams p;
  if (mask != MaskKind::kIntervals) return p;
  p.q_lo = iv.q_lo, p.q_hi = iv.q_hi, p.k_lo = iv.k_lo, p.k_hi = iv.k_hi;
  p.seq = iv.seq;
  p.on = true;
  return p;
}

cuda::RawTensor Raw(const TensorView& t) {
  return {t.data, static_cast<int>(t.dtype), t.BatchStride(), t.RowStride()};
}
cuda::RawStat Raw(const RowStatView& s) { return {s.data, s.BatchStride(), s.HeadStride()}; }
cuda::RowShape ShapeOf(const TensorView& t) { return {t.batch, t.rows, t.heads, t.head_dim}; }

class CudaBackend final : public AttentionBackend {
 public:
  CudaBackend(int device, const cuda::DeviceFacts& facts, const cuda::KernelChoice& choice)
      : device_(device), facts_(facts), choice_(choice) {}

  std::string_view Name() const override { return "cuda"; }

  absl::Status Forward(const ForwardArgs& a) override {
    RETURN_IF_ERROR(ValidateForward(a));
    RETURN_IF_ERROR(CheckKernelDtypeAndDim(a.q));
    RETURN_IF_ERROR(CheckKernelView(a.q, "q"));
    RETURN_IF_ERROR(CheckKernelView(a.k, "k"));
    RETURN_IF_ERROR(CheckKernelView(a.v, "v"));
    RETURN_IF_ERROR(CheckKernelView(a.out, "out"));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    cuda::FwdParams p;
    p.q = a.q.data;
    p.k = a.k.data;
    p.v = a.v.data;
    p.out = a.out.data;
    p.lse = a.lse.data;
    p.q_batch_stride = a.q.BatchStride();
    p.q_row_stride = a.q.RowStride();
    p.k_batch_stride = a.k.BatchStride();
    p.k_row_stride = a.k.RowStride();
    p.v_batch_stride = a.v.BatchStride();
    p.v_row_stride = a.v.RowStride();
    p.o_batch_stride = a.out.BatchStride();
    p.o_row_stride = a.out.RowStride();
    p.lse_batch_stride = a.lse.BatchStride();
    p.lse_head_stride = a.lse.HeadStride();
    p.batch = a.q.batch;
    p.q_heads = a.q.heads;
    p.kv_heads = a.k.heads;
    p.m = a.q.rows;
    p.n = a.k.rows;
    p.q_row0 = a.q_row0;
    p.kv_row0 = a.kv_row0;
    p.scale = a.scale;
    p.causal = a.mask == MaskKind::kCausal;
    p.iv = IvParams(a.mask, a.intervals);
    p.out_f32 = a.out.dtype == DType::kF32;
    p.accumulate = a.accumulate;
    const bool bf16 = a.q.dtype == DType::kBF16;
    const cuda::FwdKernel kernel = cuda::ChooseForward(choice_, facts_);
    const cudaStream_t st = AsStream(a.stream);
    cudaError_t err;
    if (a.q.head_dim == 64) {
      err = bf16 ? cuda::LaunchFwdBf16Hdim64(p, kernel, st) : cuda::LaunchFwdF16Hdim64(p, kernel, st);
    } else {
      err = bf16 ? cuda::LaunchFwdBf16Hdim128(p, kernel, st) : cuda::LaunchFwdF16Hdim128(p, kernel, st);
    }
    CUDA_RETURN_IF_ERROR(err, "forward launch");
    return absl::OkStatus();
  }

  absl::Status Backward(const BackwardArgs& a) override {
    RETURN_IF_ERROR(ValidateBackward(a));
    RETURN_IF_ERROR(CheckKernelDtypeAndDim(a.q));
    RETURN_IF_ERROR(CheckKernelView(a.q, "q"));
    RETURN_IF_ERROR(CheckKernelView(a.k, "k"));
    RETURN_IF_ERROR(CheckKernelView(a.v, "v"));
    RETURN_IF_ERROR(CheckKernelView(a.dout, "dout"));
    RETURN_IF_ERROR(CheckKernelView(a.dq, "dq"));
    RETURN_IF_ERROR(CheckKernelView(a.dk, "dk"));
    RETURN_IF_ERROR(CheckKernelView(a.dv, "dv"));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    cuda::BwdParams p;
    p.q = a.q.data;
    p.k = a.k.data;
    p.v = a.v.data;
    p.dout = a.dout.data;
    p.lse = a.lse.data;
    p.delta = a.delta.data;
    p.dq = static_cast<float*>(a.dq.data);
    p.dk = static_cast<float*>(a.dk.data);
    p.dv = static_cast<float*>(a.dv.data);
    p.q_batch_stride = a.q.BatchStride();
    p.q_row_stride = a.q.RowStride();
    p.k_batch_stride = a.k.BatchStride();
    p.k_row_stride = a.k.RowStride();
    p.v_batch_stride = a.v.BatchStride();
    p.v_row_stride = a.v.RowStride();
    p.do_batch_stride = a.dout.BatchStride();
    p.do_row_stride = a.dout.RowStride();
    p.dq_batch_stride = a.dq.BatchStride();
    p.dq_row_stride = a.dq.RowStride();
    p.dk_batch_stride = a.dk.BatchStride();
    p.dk_row_stride = a.dk.RowStride();
    p.dv_batch_stride = a.dv.BatchStride();
    p.dv_row_stride = a.dv.RowStride();
    p.lse_batch_stride = a.lse.BatchStride();
    p.lse_head_stride = a.lse.HeadStride();
    p.delta_batch_stride = a.delta.BatchStride();
    p.delta_head_stride = a.delta.HeadStride();
    p.batch = a.q.batch;
    p.q_heads = a.q.heads;
    p.kv_heads = a.k.heads;
    p.m = a.q.rows;
    p.n = a.k.rows;
    p.q_row0 = a.q_row0;
    p.kv_row0 = a.kv_row0;
    p.scale = a.scale;
    p.causal = a.mask == MaskKind::kCausal;
    p.iv = IvParams(a.mask, a.intervals);
    const bool bf16 = a.q.dtype == DType::kBF16;
    const cuda::BwdPlan plan =
        cuda::ChooseBackward(choice_, facts_, p.causal, p.n, p.kv_heads, p.batch);
    const cudaStream_t st = AsStream(a.stream);
    cudaError_t err;
    if (a.q.head_dim == 64) {
      err = bf16 ? cuda::LaunchBwdBf16Hdim64(p, plan, st) : cuda::LaunchBwdF16Hdim64(p, plan, st);
    } else {
      err = bf16 ? cuda::LaunchBwdBf16Hdim128(p, plan, st) : cuda::LaunchBwdF16Hdim128(p, plan, st);
    }
    CUDA_RETURN_IF_ERROR(err, "backward launch");
    return absl::OkStatus();
  }

  absl::Status Merge(const MergeArgs& a) override {
    RETURN_IF_ERROR(ValidateMerge(a));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    CUDA_RETURN_IF_ERROR(cuda::LaunchMerge(ShapeOf(a.out_a), Raw(a.out_a), Raw(a.lse_a), Raw(a.out_b),
                                           Raw(a.lse_b), AsStream(a.stream)),
                         "merge launch");
    return absl::OkStatus();
  }

  absl::Status ComputeDelta(const TensorView& dout, const TensorView& out, const RowStatView& delta,
                            void* stream) override {
    RETURN_IF_ERROR(CheckSameShape(dout, out, "dout", "out"));
    if (delta.data == nullptr || delta.batch != dout.batch || delta.heads != dout.heads ||
        delta.rows != dout.rows) {
      return absl::InvalidArgumentError("compute_delta: delta must be non-null with dout's [batch, heads, rows]");
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    CUDA_RETURN_IF_ERROR(cuda::LaunchComputeDelta(ShapeOf(dout), Raw(dout), Raw(out), Raw(delta), AsStream(stream)),
                         "compute_delta launch");
    return absl::OkStatus();
  }

  absl::Status Convert(const TensorView& src, const TensorView& dst, void* stream) override {
    RETURN_IF_ERROR(CheckSameShape(src, dst, "src", "dst"));
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    CUDA_RETURN_IF_ERROR(cuda::LaunchConvert(ShapeOf(src), Raw(src), Raw(dst), AsStream(stream)), "convert launch");
    return absl::OkStatus();
  }

  absl::Status Accumulate(const TensorView& src, const TensorView& dst, void* stream) override {
    if (src.dtype != DType::kF32 || dst.dtype != DType::kF32 || src.batch != dst.batch ||
        src.rows != dst.rows || src.heads != dst.heads || src.head_dim != dst.head_dim) {
      return absl::InvalidArgumentError("cuda backend: accumulate needs f32 src and dst of one shape");
    }
    CUDA_RETURN_IF_ERROR(
        cuda::LaunchAccumulateF32(ShapeOf(src), Raw(src), Raw(dst), AsStream(stream)),
        "accumulate launch");
    return absl::OkStatus();
  }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state
      return absl::ResourceExhaustedError(absl::StrCat("cuda backend: cannot allocate ", bytes, " bytes"));
    }
    CUDA_RETURN_IF_ERROR(err, "cudaMalloc");
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    cudaSetDevice(device_);
    cudaFree(p);
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) return absl::InvalidArgumentError("copy: null dst or src");
    const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                             : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                               : cudaMemcpyDeviceToDevice;
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, AsStream(stream)), "cudaMemcpyAsync");
    return absl::OkStatus();
  }

  absl::Status Memset(void* dst, int value, size_t bytes, void* stream) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("memset: null dst");
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, value, bytes, AsStream(stream)), "cudaMemsetAsync");
    return absl::OkStatus();
  }

  absl::Status Synchronize(void* stream) override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  absl::StatusOr<void*> CreateStream() override {
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
    cudaStream_t s = nullptr;
    CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags");
    return static_cast<void*>(s);
  }

  void DestroyStream(void* stream) override {
    if (stream == nullptr) return;
    cudaSetDevice(device_);
    cudaStreamDestroy(AsStream(stream));
  }

 private:
  static absl::Status CheckSameShape(const TensorView& a, const TensorView& b, absl::string_view fa,
                                     absl::string_view fb) {
    if (a.data == nullptr || b.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(fa, " and ", fb, " must be non-null"));
    }
    if (a.batch != b.batch || a.rows != b.rows || a.heads != b.heads || a.head_dim != b.head_dim ||
        a.batch < 1 || a.rows < 0 || a.heads < 1 || a.head_dim < 1) {
      return absl::InvalidArgumentError(absl::StrCat(fb, " shape does not match ", fa, " (or is empty)"));
    }
    return absl::OkStatus();
  }

  int device_;
  cuda::DeviceFacts facts_;
  cuda::KernelChoice choice_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCudaBackend(const BackendOptions& options,
                                                                    const cuda::KernelChoice& choice) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("cuda backend: no usable GPU (",
                                               err == cudaSuccess ? "no devices" : cudaGetErrorString(err), ")"));
  }
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: device ", options.device, " out of range [0, ", count, ")"));
  }
  cudaDeviceProp prop;
  CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  if (prop.major < 8) {
    return absl::UnavailableError(absl::StrCat("cuda backend: device ", options.device, " is sm_", prop.major,
                                               prop.minor, "; the kernels need sm_80 or newer"));
  }
  cuda::DeviceFacts facts;
  facts.sm90 = prop.major == 9 && prop.minor == 0;
  facts.sms = prop.multiProcessorCount;
  const bool hopper_fwd = choice.forward == cuda::FwdKernel::kSm90Tma ||
                          choice.forward == cuda::FwdKernel::kSm90CpAsync;
  const bool hopper_bwd = choice.backward == cuda::BwdKernel::kSm90Pipe ||
                          choice.backward == cuda::BwdKernel::kSm90CpAsync;
  if ((hopper_fwd || hopper_bwd) && !facts.sm90) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda backend: kernel choice forward=", cuda::Name(choice.forward),
        " backward=", cuda::Name(choice.backward), " needs a compute capability 9.0 GPU; device ",
        options.device, " is sm_", prop.major, prop.minor));
  }
  if (choice.bwd_tile_chunk < -1 || choice.bwd_tile_chunk > 999) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda backend: kernel choice bwd_tile_chunk must be in [-1, 999], got ", choice.bwd_tile_chunk));
  }
  return std::unique_ptr<AttentionBackend>(new CudaBackend(options.device, facts, choice));
}

}  // namespace dfa
