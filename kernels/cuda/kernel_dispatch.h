// Which kernel runs: the one per-shape table of the CUDA backend (and of the cudnn backend's
// choice between its own kernels and cuDNN), and KernelChoice, the override that benchmarks and
// tests pass to CreateCudaBackend / CreateCudnnBackend. Plain C++ (no CUDA headers): the device
// facts the table needs come in as DeviceFacts.
//
// The table (Hopper = compute capability 9.0, the sm_90a build; the measured figures behind each
// row: docs/kernels-cuda.md and docs/kernels-cudnn.md):
//
// | pass     | head dim | regime                         | kernel                              |
// |----------|----------|--------------------------------|-------------------------------------|
// | forward  | 64       | Hopper                         | kSm90Tma, 3 consumer warpgroups     |
// |          |          |                                |   (192 query rows, 128-key blocks)  |
// | forward  | 128      | Hopper                         | kSm90Tma, 2 consumer warpgroups     |
// |          |          |                                |   (128 query rows, 128-key blocks)  |
// | forward  | 64, 128  | Hopper, TMA cannot describe    | kSm90CpAsync (128 rows, 128 keys)   |
// |          |          |   q, k or v                    |                                     |
// | forward  | 64, 128  | other GPUs (sm_80 and newer)   | kMmaSync (128 rows, 64 keys)        |
// | backward | 64, 128  | Hopper                         | kSm90Pipe (dQ by writer warps):     |
// |          |          |   causal, < 16 CTAs per SM     |   tiles longest first, chunks of 4  |
// |          |          |   otherwise                    |   tiles in grid order               |
// | backward | 64, 128  | Hopper, TMA cannot describe    | kSm90CpAsync (dQ by atomics)        |
// |          |          |   q, k, v, dout or dq          |                                     |
// | backward | 64, 128  | other GPUs                     | kMmaSync (64 x 64 tiles)            |
// | cudnn    | 128      | Hopper                         | our kernels (the rows above)        |
// | cudnn    | others   | any                            | cuDNN where it can run the unit,    |
// |          |          |                                |   else our kernels                  |
//
// MaskKind::kIntervals (documents, windows) runs the same rows, except that the cp.async rows
// (and a forced cp.async choice) run mma.sync: the cp.async kernels have no interval variant
// (flash_launch.cuh). The cudnn backend runs every kIntervals unit on our kernels.
//
// The TMA kernels fall back to the cp.async ones by themselves (their launchers answer
// cudaErrorNotSupported, with nothing queued, where TMA cannot describe a tensor), also when a
// KernelChoice forces them.
#pragma once

#include <cstdint>
#include <string_view>

namespace dfa::cuda {

// Kernels of the forward pass. kTable: as the table says.
enum class FwdKernel { kTable, kSm90Tma, kSm90CpAsync, kMmaSync };
// Kernels of the backward pass.
enum class BwdKernel { kTable, kSm90Pipe, kSm90CpAsync, kMmaSync };
// The cudnn backend's engine for a unit: as the table says, our kernels, or cuDNN (where it can
// run the unit; our kernels otherwise).
enum class UnitEngine { kTable, kOwn, kCudnn };

// Overrides of the table, for benchmarks and tests (the services always run the table). Forcing
// a Hopper kernel on another GPU is refused when the backend is created.
struct KernelChoice {
  FwdKernel forward = FwdKernel::kTable;
  BwdKernel backward = BwdKernel::kTable;
  // Causal tile order of the pipe backward: -1 the table; 0 grid order (key blocks fastest);
  // N > 0 longest first in chunks of N kv heads (x batch) (bwd_tile_order.h). At most 999.
  int bwd_tile_chunk = -1;
  UnitEngine cudnn_forward = UnitEngine::kTable;   // cudnn backend only
  UnitEngine cudnn_backward = UnitEngine::kTable;  // cudnn backend only
};

// What the table needs to know of the device a backend runs on.
struct DeviceFacts {
  bool sm90 = false;  // compute capability exactly 9.0: the sm_90a kernels run
  int sms = 0;        // multiprocessors (0: unknown)
};

// The backward kernel and its tile order, resolved for one launch.
struct BwdPlan {
  BwdKernel kernel = BwdKernel::kMmaSync;
  int tile_chunk = 0;  // kSm90Pipe, causal: 0 grid order, N > 0 longest first in chunks of N
};

// Key rows per CTA of the pipe backward (flash_bwd_sm90_pipe.cuh; its grid is key blocks x kv
// heads x batch).
inline constexpr int kSm90PipeKeyBlock = 128;
// Causal pipe backward: tiles longest first in chunks of kSm90TileChunk kv heads while the grid
// has fewer than kSm90TileOrderMaxWaves CTAs per SM (the last wave then holds the short tiles);
// at more waves the grid order's tail is already short and it keeps each head's rows in L2.
inline constexpr int kSm90TileChunk = 4;
inline constexpr int kSm90TileOrderMaxWaves = 16;

// Consumer warpgroups of the TMA forward per head dim (64 query rows each).
constexpr int Sm90TmaForwardConsumers(int head_dim) { return head_dim == 64 ? 3 : 2; }

inline FwdKernel ChooseForward(const KernelChoice& choice, const DeviceFacts& dev) {
  if (choice.forward != FwdKernel::kTable) return choice.forward;
  return dev.sm90 ? FwdKernel::kSm90Tma : FwdKernel::kMmaSync;
}

// `kv_rows`, `kv_heads`, `batch`: the unit's key rows, kv heads and batch (the pipe grid).
inline BwdPlan ChooseBackward(const KernelChoice& choice, const DeviceFacts& dev, bool causal,
                              int64_t kv_rows, int kv_heads, int batch) {
  BwdPlan plan;
  plan.kernel = choice.backward != BwdKernel::kTable
                    ? choice.backward
                    : (dev.sm90 ? BwdKernel::kSm90Pipe : BwdKernel::kMmaSync);
  if (plan.kernel != BwdKernel::kSm90Pipe || !causal) return plan;
  if (choice.bwd_tile_chunk >= 0) {
    plan.tile_chunk = choice.bwd_tile_chunk;
    return plan;
  }
  const int64_t ctas = (kv_rows + kSm90PipeKeyBlock - 1) / kSm90PipeKeyBlock * kv_heads * batch;
  plan.tile_chunk =
      dev.sms > 0 && ctas < int64_t{kSm90TileOrderMaxWaves} * dev.sms ? kSm90TileChunk : 0;
  return plan;
}

// The cudnn backend: true when a unit of this head dim runs on our kernels (table row "cudnn":
// ours are faster through this interface at head dim 128 on Hopper).
inline bool CudnnRunsOwnForward(const KernelChoice& choice, const DeviceFacts& dev, int head_dim) {
  if (choice.cudnn_forward != UnitEngine::kTable) return choice.cudnn_forward == UnitEngine::kOwn;
  return dev.sm90 && head_dim == 128;
}
inline bool CudnnRunsOwnBackward(const KernelChoice& choice, const DeviceFacts& dev,
                                 int head_dim) {
  if (choice.cudnn_backward != UnitEngine::kTable) return choice.cudnn_backward == UnitEngine::kOwn;
  return dev.sm90 && head_dim == 128;
}

// Names, as the benchmarks' flags spell them.
constexpr const char* Name(FwdKernel k) {
  return k == FwdKernel::kSm90Tma       ? "tma"
         : k == FwdKernel::kSm90CpAsync ? "cpasync"
         : k == FwdKernel::kMmaSync     ? "mma"
                                        : "table";
}
constexpr const char* Name(BwdKernel k) {
  return k == BwdKernel::kSm90Pipe      ? "pipe"
         : k == BwdKernel::kSm90CpAsync ? "cpasync"
         : k == BwdKernel::kMmaSync     ? "mma"
                                        : "table";
}
constexpr const char* Name(UnitEngine e) {
  return e == UnitEngine::kOwn ? "own" : e == UnitEngine::kCudnn ? "cudnn" : "table";
}
// False for a name that is none of the above.
inline bool ParseKernel(std::string_view name, FwdKernel* out) {
  for (FwdKernel k : {FwdKernel::kTable, FwdKernel::kSm90Tma, FwdKernel::kSm90CpAsync,
                      FwdKernel::kMmaSync}) {
    if (name == std::string_view(Name(k))) return *out = k, true;
  }
  return false;
}
inline bool ParseKernel(std::string_view name, BwdKernel* out) {
  for (BwdKernel k : {BwdKernel::kTable, BwdKernel::kSm90Pipe, BwdKernel::kSm90CpAsync,
                      BwdKernel::kMmaSync}) {
    if (name == std::string_view(Name(k))) return *out = k, true;
  }
  return false;
}
inline bool ParseKernel(std::string_view name, UnitEngine* out) {
  for (UnitEngine e : {UnitEngine::kTable, UnitEngine::kOwn, UnitEngine::kCudnn}) {
    if (name == std::string_view(Name(e))) return *out = e, true;
  }
  return false;
}

}  // namespace dfa::cuda
