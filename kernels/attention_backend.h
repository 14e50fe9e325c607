// The block-attention interface: every kernel backend (cpu, cuda, ...) implements it.
//
// A *unit* is "query rows [q_row0, q_row0 + q.rows) attend to key/value rows
// [kv_row0, kv_row0 + k.rows)" of one sequence, at global token positions so that the causal
// mask is right for any pair of shards: query position i sees key position j iff j <= i.
// A query row that sees no key has LSE = -inf and output 0 (never NaN), also after merging.
//
// Layouts. Q, K, V, O, dO, dQ, dK, dV are "BSHD": element (b, r, h, d) lives at
// data[b * batch_stride + r * row_stride + h * head_dim + d]. Per-row statistics (LSE, D) are
// fp32 "BHS": element (b, h, r) at data[b * batch_stride + h * head_stride + r].
// GQA: q.heads must be a multiple of k.heads; query head h reads key/value head
// h / (q.heads / k.heads). K and V are never expanded.
//
// Memory: pointers are host pointers for the cpu backend and device pointers for the cuda
// backend (use the backend's Alloc/Copy). Arguments are checked; a bad argument returns
// INVALID_ARGUMENT naming the field and writes nothing.
// Thread safety: a backend object may be used from one thread at a time; its kernels may use
// many threads (cpu) or run asynchronously on `stream` (cuda). The exception: Copy, Memset and
// Synchronize on a stream of the caller's own (CreateStream) may run on other threads while
// one thread computes (a worker's data plane moves a session's rows while its job runs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "core/dtype.h"
#include "core/mask.h"
#include "core/status.h"

namespace dfa {

// Rows of a BSHD tensor. `data` is mutable for outputs and treated as const for inputs.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int batch = 1;
  int64_t rows = 0;
  int heads = 0;
  int head_dim = 0;
  int64_t row_stride = 0;    // elements; 0 means heads * head_dim (dense)
  int64_t batch_stride = 0;  // elements; 0 means rows * row_stride (dense)

  int64_t RowStride() const { return row_stride ? row_stride : int64_t{heads} * head_dim; }
  int64_t BatchStride() const { return batch_stride ? batch_stride : rows * RowStride(); }
  // Rows [r0, r0 + n) of this view (same strides).
  TensorView Slice(int64_t r0, int64_t n) const;
};

// fp32 per-row statistics (LSE or D) in BHS layout.
struct RowStatView {
  float* data = nullptr;
  int batch = 1;
  int heads = 0;
  int64_t rows = 0;
  int64_t head_stride = 0;   // 0 means rows (dense)
  int64_t batch_stride = 0;  // 0 means heads * head_stride (dense)

  int64_t HeadStride() const { return head_stride ? head_stride : rows; }
  int64_t BatchStride() const { return batch_stride ? batch_stride : heads * HeadStride(); }
  RowStatView Slice(int64_t r0, int64_t n) const;
};

// MaskKind::kIntervals: the per-position visible intervals (core/mask.h BuildMaskIntervals),
// int32 arrays of [batch * seq] in the backend's address space (host for cpu, device for cuda):
// for batch row b and global position p, query p sees keys [q_lo[b*seq+p], q_hi[b*seq+p]) and
// key p is seen by queries [k_lo[b*seq+p], k_hi[b*seq+p]). Lo and hi are non-decreasing in p,
// so a tile of rows [r0, r1) sees keys [q_lo[r0], q_hi[r1-1]) and is fully visible when
// q_lo[r1-1] <= c0 and q_hi[r0] >= c1: kernels skip empty tiles and mask only partial ones.
// Ignored for kFull and kCausal.
struct MaskIntervals {
  const int32_t* q_lo = nullptr;
  const int32_t* q_hi = nullptr;
  const int32_t* k_lo = nullptr;
  const int32_t* k_hi = nullptr;
  int64_t seq = 0;  // positions per batch row in the arrays
};

// Forward unit. Writes (or, with accumulate, LSE-merges into) the partial output and LSE.
struct ForwardArgs {
  float scale = 0.f;  // softmax scale; must be > 0 and finite
  MaskKind mask = MaskKind::kCausal;
  MaskIntervals intervals;  // read iff mask == kIntervals
  TensorView q;       // [B, m, Hq, D], dtype f32/bf16/f16
  int64_t q_row0 = 0;
  TensorView k, v;    // [B, n, Hkv, D], same dtype as q
  int64_t kv_row0 = 0;
  TensorView out;     // [B, m, Hq, D]; fp32 (required when accumulate) or q's dtype
  RowStatView lse;    // [B, Hq, m]
  // false: out/lse are overwritten with this unit's result.
  // true: out/lse hold an earlier partial (LSE = -inf means empty) and receive the merge.
  bool accumulate = false;
  void* stream = nullptr;  // cudaStream_t for the cuda backend; ignored by cpu
};

// Backward unit: adds this unit's contribution to dQ, dK and dV (all fp32, caller zeroes).
struct BackwardArgs {
  float scale = 0.f;
  MaskKind mask = MaskKind::kCausal;
  MaskIntervals intervals;  // read iff mask == kIntervals
  TensorView q;        // [B, m, Hq, D]
  int64_t q_row0 = 0;
  TensorView k, v;     // [B, n, Hkv, D]
  int64_t kv_row0 = 0;
  TensorView dout;     // dO [B, m, Hq, D], q's dtype
  RowStatView lse;     // final LSE of the query rows (over all keys)
  RowStatView delta;   // D = rowsum(dO * O_final), from ComputeDelta
  TensorView dq;       // fp32 [B, m, Hq, D], +=
  TensorView dk, dv;   // fp32 [B, n, Hkv, D], += (summed over the query heads of each kv head)
  void* stream = nullptr;
  // Optional: the final O of the query rows [B, m, Hq, D] (q's dtype or fp32), as `delta` was
  // formed from. Backends that form D from O themselves (cudnn) run only with it and fall back
  // to kernels that read `delta` without it; the others ignore it.
  TensorView out;
};

// Merges partial b into partial a: a <- merge(a, b) by their LSEs. Both outputs fp32.
struct MergeArgs {
  TensorView out_a;
  RowStatView lse_a;
  TensorView out_b;
  RowStatView lse_b;
  void* stream = nullptr;
};

// Device memory for a backend's own long-lived scratch (buffers it keeps between calls, e.g.
// cuDNN's workspace). Empty functions: cudaMalloc / cudaFree. A GPU worker points them at its
// device memory pool so that every byte a session uses comes from the pool; `release` must be
// safe while queued work may still use the block (the pool retires it, stream-ordered).
struct ScratchAllocator {
  std::function<absl::StatusOr<void*>(size_t)> alloc;
  std::function<void(void*)> release;
};

struct BackendOptions {
  int num_threads = 0;  // cpu: worker threads (0: the usable CPUs, core/host_limits.h)
  int device = 0;       // cuda: device ordinal
  ScratchAllocator scratch = {};  // cudnn: its scratch and workspace (see above)
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  // "cpu", "cuda", ...
  virtual std::string_view Name() const = 0;

  virtual absl::Status Forward(const ForwardArgs& args) = 0;
  virtual absl::Status Backward(const BackwardArgs& args) = 0;
  virtual absl::Status Merge(const MergeArgs& args) = 0;
  // delta[b, h, r] = sum_d dout[b, r, h, d] * out[b, r, h, d]   (out in any dtype)
  virtual absl::Status ComputeDelta(const TensorView& dout, const TensorView& out,
                                    const RowStatView& delta, void* stream) = 0;
  // Element-wise cast of src into dst (same shape, any dtypes).
  virtual absl::Status Convert(const TensorView& src, const TensorView& dst, void* stream) = 0;
  // dst += src, element by element; both fp32 of one shape (gradient partials arriving from
  // peers). The default answers UNIMPLEMENTED; backends that run plans override it.
  virtual absl::Status Accumulate(const TensorView& src, const TensorView& dst, void* stream);

  // Memory in the backend's address space (host for cpu, device for cuda).
  virtual absl::StatusOr<void*> Alloc(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind kind,
                            void* stream) = 0;
  virtual absl::Status Memset(void* dst, int value, size_t bytes, void* stream) = 0;
  // Waits for all work queued on `stream` (no-op for cpu).
  virtual absl::Status Synchronize(void* stream) = 0;
  // A stream of the caller's own, for work that must neither wait for nor hold up the work of
  // other streams (cuda: a non-blocking stream, so not even the default stream orders it).
  // nullptr (the default stream) where the backend has no streams (cpu).
  virtual absl::StatusOr<void*> CreateStream() { return nullptr; }
  // Work still queued on `stream` completes; the stream is gone after it.
  virtual void DestroyStream(void* stream) { (void)stream; }
};

// A stream from CreateStream, destroyed with the object (before its backend).
class OwnedStream {
 public:
  OwnedStream() = default;
  static absl::StatusOr<OwnedStream> Create(AttentionBackend* backend) {
    ASSIGN_OR_RETURN(void* s, backend->CreateStream());
    OwnedStream out;
    out.backend_ = backend;
    out.stream_ = s;
    return out;
  }
  OwnedStream(OwnedStream&& o) noexcept { *this = std::move(o); }
  OwnedStream& operator=(OwnedStream&& o) noexcept {
    if (this != &o) {
      Reset();
      backend_ = std::exchange(o.backend_, nullptr);
      stream_ = std::exchange(o.stream_, nullptr);
    }
    return *this;
  }
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  ~OwnedStream() { Reset(); }
  void* get() const { return stream_; }

 private:
  void Reset() {
    if (backend_ != nullptr && stream_ != nullptr) backend_->DestroyStream(stream_);
    backend_ = nullptr;
    stream_ = nullptr;
  }
  AttentionBackend* backend_ = nullptr;
  void* stream_ = nullptr;
};

// Creates a backend by name: "cpu", "cuda", "cudnn" (cuDNN's fused attention where it can run a
// unit, the cuda kernels otherwise; kernels/cuda/cudnn_backend.h), or "auto" (cuda when a GPU
// is usable, else cpu).
// UNAVAILABLE when the backend cannot run here (no GPU, or built without CUDA).
absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateBackend(std::string_view name,
                                                                const BackendOptions& options);

// Validation shared by all backends: INVALID_ARGUMENT naming the offending field, or OK.
absl::Status ValidateForward(const ForwardArgs& args);
absl::Status ValidateBackward(const BackwardArgs& args);
absl::Status ValidateMerge(const MergeArgs& args);


}  // namespace dfa
