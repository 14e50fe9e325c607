// The CPU AttentionBackend: validation, then the packed blocked kernels (cpu_forward.cc,
// cpu_backward.cc) on a private thread pool; the small element-wise operations run here.
#include "kernels/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/kernel_params.h"
#include "kernels/cpu/packing.h"
#include "kernels/cpu/thread_pool.h"

namespace dfa {
namespace {

absl::Status CheckElementwise(const TensorView& t, absl::string_view field) {
  if (t.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(field, ": null data"));
  if (t.batch < 1 || t.rows < 1 || t.heads < 1 || t.head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": batch, rows, heads and head_dim must be >= 1"));
  }
  if (t.dtype != DType::kF32 && t.dtype != DType::kBF16 && t.dtype != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype is not f32, bf16 or f16"));
  }
  if (t.row_stride != 0 && t.row_stride < int64_t{t.heads} * t.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".row_stride smaller than heads*head_dim"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameShape(const TensorView& a, const TensorView& b, absl::string_view fa,
                            absl::string_view fb) {
  if (a.batch != b.batch || a.rows != b.rows || a.heads != b.heads || a.head_dim != b.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        fb, " shape [", b.batch, ",", b.rows, ",", b.heads, ",", b.head_dim, "] does not match ",
        fa, " [", a.batch, ",", a.rows, ",", a.heads, ",", a.head_dim, "]"));
  }
  return absl::OkStatus();
}

// The drivers allocate their packed buffers before touching any output, so running out of
// memory leaves the caller's tensors as they were.
absl::Status OutOfMemory(absl::string_view what) {
  return absl::ResourceExhaustedError(
      absl::StrCat("cpu backend: not enough host memory for the ", what, " workspace"));
}

class CpuBackend final : public AttentionBackend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : pool_(options.num_threads), kernels_(cpu::SelectKernels()) {}

  std::string_view Name() const override { return "cpu"; }

  absl::Status Forward(const ForwardArgs& args) override {
    RETURN_IF_ERROR(ValidateForward(args));
    try {
      cpu::RunForward(args, kernels_, pool_, ws_);
    } catch (const std::bad_alloc&) {
      return OutOfMemory("forward");
    }
    return absl::OkStatus();
  }

  absl::Status Backward(const BackwardArgs& args) override {
    RETURN_IF_ERROR(ValidateBackward(args));
    try {
      cpu::RunBackward(args, kernels_, pool_, ws_);
    } catch (const std::bad_alloc&) {
      return OutOfMemory("backward");
    }
    return absl::OkStatus();
  }

  absl::Status Merge(const MergeArgs& args) override {
    RETURN_IF_ERROR(ValidateMerge(args));
    const TensorView& a = args.out_a;
    const TensorView& b = args.out_b;
    pool_.ParallelFor(int64_t{a.batch} * a.heads, [&](int64_t bh, int) {
      const int bi = static_cast<int>(bh / a.heads), h = static_cast<int>(bh % a.heads);
      for (int64_t r = 0; r < a.rows; ++r) {
        float* oa = static_cast<float*>(a.data) + bi * a.BatchStride() + r * a.RowStride() +
                    int64_t{h} * a.head_dim;
        const float* ob = static_cast<const float*>(b.data) + bi * b.BatchStride() +
                          r * b.RowStride() + int64_t{h} * b.head_dim;
        float* la =
            args.lse_a.data + bi * args.lse_a.BatchStride() + h * args.lse_a.HeadStride() + r;
        const float lb =
            args.lse_b.data[bi * args.lse_b.BatchStride() + h * args.lse_b.HeadStride() + r];
        cpu::MergeRow(oa, la, ob, lb, a.head_dim);
      }
    });
    return absl::OkStatus();
  }

  absl::Status ComputeDelta(const TensorView& dout, const TensorView& out, const RowStatView& delta,
                            void*) override {
    RETURN_IF_ERROR(CheckElementwise(dout, "dout"));
    RETURN_IF_ERROR(CheckElementwise(out, "out"));
    RETURN_IF_ERROR(CheckSameShape(dout, out, "dout", "out"));
    if (delta.data == nullptr) return absl::InvalidArgumentError("delta: null data");
    if (delta.batch != dout.batch || delta.heads != dout.heads || delta.rows != dout.rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "delta shape [", delta.batch, ",", delta.heads, ",", delta.rows,
          "] does not match dout [", dout.batch, ",", dout.heads, ",", dout.rows, "]"));
    }
    pool_.ParallelFor(int64_t{dout.batch} * dout.heads, [&](int64_t bh, int) {
      const int b = static_cast<int>(bh / dout.heads), h = static_cast<int>(bh % dout.heads);
      for (int64_t r = 0; r < dout.rows; ++r) {
        const int64_t bd =
            b * dout.BatchStride() + r * dout.RowStride() + int64_t{h} * dout.head_dim;
        const int64_t bo = b * out.BatchStride() + r * out.RowStride() + int64_t{h} * out.head_dim;
        float s = 0.f;
        for (int d = 0; d < dout.head_dim; ++d) {
          s +=
              LoadAsFloat(dout.data, dout.dtype, bd + d) * LoadAsFloat(out.data, out.dtype, bo + d);
        }
        delta.data[b * delta.BatchStride() + h * delta.HeadStride() + r] = s;
      }
    });
    return absl::OkStatus();
  }

  absl::Status Convert(const TensorView& src, const TensorView& dst, void*) override {
    RETURN_IF_ERROR(CheckElementwise(src, "src"));
    RETURN_IF_ERROR(CheckElementwise(dst, "dst"));
    RETURN_IF_ERROR(CheckSameShape(src, dst, "src", "dst"));
    pool_.ParallelFor(int64_t{src.batch} * src.rows, [&](int64_t br, int) {
      const int b = static_cast<int>(br / src.rows);
      const int64_t r = br % src.rows;
      const int64_t width = int64_t{src.heads} * src.head_dim;
      const int64_t s0 = b * src.BatchStride() + r * src.RowStride();
      const int64_t d0 = b * dst.BatchStride() + r * dst.RowStride();
      for (int64_t i = 0; i < width; ++i) {
        StoreFromFloat(dst.data, dst.dtype, d0 + i, LoadAsFloat(src.data, src.dtype, s0 + i));
      }
    });
    return absl::OkStatus();
  }

  absl::Status Accumulate(const TensorView& src, const TensorView& dst, void*) override {
    RETURN_IF_ERROR(CheckElementwise(src, "src"));
    RETURN_IF_ERROR(CheckElementwise(dst, "dst"));
    RETURN_IF_ERROR(CheckSameShape(src, dst, "src", "dst"));
    if (src.dtype != DType::kF32 || dst.dtype != DType::kF32) {
      return absl::InvalidArgumentError("accumulate: src and dst must be f32");
    }
    pool_.ParallelFor(int64_t{src.batch} * src.rows, [&](int64_t br, int) {
      const int b = static_cast<int>(br / src.rows);
      const int64_t r = br % src.rows;
      const int64_t width = int64_t{src.heads} * src.head_dim;
      const float* s =
          static_cast<const float*>(src.data) + b * src.BatchStride() + r * src.RowStride();
      float* d = static_cast<float*>(dst.data) + b * dst.BatchStride() + r * dst.RowStride();
      for (int64_t i = 0; i < width; ++i) d[i] += s[i];
    });
    return absl::OkStatus();
  }

  absl::StatusOr<void*> Alloc(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu backend: cannot allocate ", bytes, " bytes"));
    }
    return p;
  }

  void Free(void* p) override { std::free(p); }

  absl::Status Copy(void* dst, const void* src, size_t bytes, CopyKind, void*) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError(dst == nullptr ? "copy: null dst" : "copy: null src");
    }
    std::memmove(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status Memset(void* dst, int value, size_t bytes, void*) override {
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("memset: null dst");
    std::memset(dst, value, bytes);
    return absl::OkStatus();
  }

  absl::Status Synchronize(void*) override { return absl::OkStatus(); }

 private:
  cpu::ThreadPool pool_;
  const cpu::KernelTable& kernels_;
  cpu::Workspace ws_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionBackend>> CreateCpuBackend(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_threads must be >= 0 (0: the usable CPUs), got ", options.num_threads));
  }
  return std::unique_ptr<AttentionBackend>(new CpuBackend(options));
}

}  // namespace dfa
