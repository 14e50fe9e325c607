// Host-side choice between the Hopper (wgmma, sm_90a) kernels and the mma.sync ones.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

namespace dfa::cuda {

// True when the current device is exactly compute capability 9.0 (the only one the sm_90a code
// runs on) and the environment variable DFA_CUDA_NO_WGMMA is unset or "0". Cached per device
// (up to 64); thread-safe (idempotent writes of the same value).
inline bool UseSm90Kernels() {
  static const bool disabled = [] {
    const char* e = std::getenv("DFA_CUDA_NO_WGMMA");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  if (disabled) return false;
  static int cached[64] = {};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cached[dev] = (major == 9 && minor == 0) ? 1 : 2;
  }
  return cached[dev] == 1;
}

// True unless DFA_CUDA_FWD_WS is set to "0": the Hopper forward then runs the warp-specialised
// TMA kernel (flash_fwd_sm90_ws.cuh) where it exists, else the cp.async one (flash_fwd_sm90.cuh).
inline bool UseSm90WsForward() {
  static const bool enabled = [] {
    const char* e = std::getenv("DFA_CUDA_FWD_WS");
    return e == nullptr || e[0] != '0';
  }();
  return enabled;
}

// True unless DFA_CUDA_FWD_PINGPONG is "0": the two consumer warpgroups of the warp-specialised
// forward take turns issuing their GEMMs (named barriers).
inline bool UseSm90FwdPingPong() {
  static const bool enabled = [] {
    const char* e = std::getenv("DFA_CUDA_FWD_PINGPONG");
    return e == nullptr || e[0] != '0';
  }();
  return enabled;
}

// The Hopper backward kernel when DFA_CUDA_BWD_WS is unset: the warp-specialised TMA kernel
// (true) or the cp.async one (false). True since the H200 run of session 10 (setmaxnreg 24/240):
// cuda_backend_test 5/5, sdpa_check 16/16, D=128 16K causal 354.9 vs 316.8 TFLOP/s.
inline constexpr bool kSm90WsBackwardDefault = true;

// True when the Hopper backward runs the warp-specialised TMA kernel (flash_bwd_sm90_ws.cuh,
// where TMA can describe the tensors) instead of the cp.async one (flash_bwd_sm90.cuh):
// DFA_CUDA_BWD_WS=1 / =0 force either, unset gives kSm90WsBackwardDefault.
inline bool UseSm90WsBackward() {
  static const bool enabled = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_WS");
    if (e == nullptr || e[0] == '\0') return kSm90WsBackwardDefault;
    return e[0] != '0';
  }();
  return enabled;
}

// The Hopper warp-specialised backward's kernel, by "pipe mode": 0 the atomic-dQ kernel
// (flash_bwd_sm90_ws.cuh); 1..3 the pipe kernel (flash_bwd_sm90_pipe.cuh: dQ staged in shared
// memory and added by writer warps with TMA reduce-add): 1 dQ columns split between the two
// consumer warpgroups (head dim 128; 64 runs 2), 2 independent warpgroups (each its own keys' dQ
// partial), 3 as 2 with warpgroup 1 started late (softmax phases of the two interleave), 4 as 1
// with each item's dQ deferred to the next item and warpgroup 1 started late (head dim 64: 32
// of the 64 columns per warpgroup), 5 as 4 with both warpgroups started together.
// Defaults per head dim, from the H200 runs of session 11 (bf16, 16K causal, TFLOP/s; all modes
// passed cuda_backend_test and the 16 SDPA cases): head dim 128 mode 4 (482 / 460 in two runs vs
// 429 / 439 for mode 1, 436 for 5; earlier run: 440 for 1, 395 / 416 for 2 / 3, 354 for 0), head
// dim 64 mode 3 (321 vs 294 for 1 = 2, 246 for 0). Measured slower and removed: 6 / 7 (dQ under
// the dS phase), 8 (mode 4 with Q and dO released separately, 3 Q stages: 462 vs 470 for 4, mean
// of six runs each, docs/kernels-cuda.md "Seventh pass"); those values run the defaults.
// Head dim 64 mode 4 since its column split (kernel time at locked base clocks, ncu, bf16 32 heads,
// vs mode 3: 16K causal 339.3 vs 324.8 TFLOP/s, 16K full 341.0 vs 334.2, 4K causal 295.9 vs
// 276.7, 4K full 323.4 vs 298.1; docs/kernels-profiling.md "Head dim 64 backward"), then with K
// and V in registers (RS S^T / dP^T) 368.2 / 371.1 / 317.2 / 345.8 (same run without: 336.2 /
// 338.3 / 293.7 / 321.4).
inline constexpr int kSm90BwdPipeDefaultHdim128 = 4;
inline constexpr int kSm90BwdPipeDefaultHdim64 = 4;

// The pipe mode for `head_dim` (0..5 as above; the pipe kernel runs where TMA can describe the
// tensors): DFA_CUDA_BWD_PIPE=0..5 forces one for every head dim, unset (or another value) gives
// the defaults above. DFA_CUDA_BWD_WS=0 (the cp.async kernel) takes precedence.
inline int Sm90BwdPipeMode(int head_dim) {
  static const int forced = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_PIPE");
    if (e == nullptr || e[0] < '0' || e[0] > '5' || e[1] != '\0') return -1;
    return e[0] - '0';
  }();
  if (forced >= 0) return forced;
  return head_dim == 128 ? kSm90BwdPipeDefaultHdim128 : kSm90BwdPipeDefaultHdim64;
}

// Number of SMs of the current device (0 when unknown). Cached per device (up to 64);
// thread-safe (idempotent writes of the same value).
inline int Sm90SmCount() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (cached[dev] == 0) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    cached[dev] = sms;
  }
  return cached[dev];
}

// Tile order of the pipe backward for causal masks (flash_bwd_sm90_pipe.cuh, BwdPipeSched):
// 0 = grid order (key blocks fastest), N > 0 = longest-first in chunks of N kv heads (x batch).
// DFA_CUDA_BWD_ORDER=N forces one (0..999) for every launch; unset: chunks of
// kSm90BwdOrderChunk when the causal grid has fewer than kSm90BwdOrderMaxWaves CTAs per SM, else
// grid order. From the H200 runs of session 12 (bf16, 32 heads, bwd TFLOP/s, means of 8-9 runs
// per GPU; all passed cuda_backend_test and the 16 SDPA cases): 4K causal (7.8 CTAs per SM) D=128
// 404 with chunks of 4 vs 380 in grid order; 16K causal (31 per SM) 469 vs 474, i.e. grid order
// at least as fast there (its tail is already short: list-scheduling model 99.6%); one global
// list (32) 408 at 16K (L2); D=64 64K causal 325 (chunks) vs 349 (grid, single runs).
inline constexpr int kSm90BwdOrderChunk = 4;
inline constexpr int kSm90BwdOrderMaxWaves = 16;
// DFA_CUDA_BWD_ORDER=N (0 <= N < 1000): the forced chunk size of both backward tile orders; -1
// when unset or out of range.
inline int Sm90BwdOrderForced() {
  static const int forced = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_ORDER");
    if (e == nullptr || e[0] == '\0') return -1;
    const int v = std::atoi(e);
    return v >= 0 && v < 1000 ? v : -1;
  }();
  return forced;
}
inline int Sm90BwdOrderChunk(bool causal, int64_t ctas) {
  const int forced = Sm90BwdOrderForced();
  if (forced >= 0) return forced;
  const int sms = Sm90SmCount();
  return causal && sms > 0 && ctas < int64_t{kSm90BwdOrderMaxWaves} * sms ? kSm90BwdOrderChunk : 0;
}

// How the pipe backward adds its dK, dV tiles (BwdPipeSched::epilogue): 0 load, add, store per
// column pair (a dependent global round trip each: 32 per thread at head dim 128), 1 all loads of
// a row pair first, 2 float2 reductions (red.global.add, nothing waited for). DFA_CUDA_BWD_EPILOGUE
// =0|1|2 forces one, unset gives kSm90BwdEpilogueDefault. Default 2 from the same H200 runs
// (means of 8-9 runs per GPU, D=128, with chunks of 4): 4K causal 404 vs 370 for 0, 16K causal
// 466 / 473 vs 458 / 469 for 0 (GPU 0 / 1); 1 measured the same as 2 (406 at 4K, 467 / 468 at 16K).
inline constexpr int kSm90BwdEpilogueDefault = 2;
inline int Sm90BwdEpilogue() {
  static const int v = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_EPILOGUE");
    if (e == nullptr || e[0] < '0' || e[0] > '2' || e[1] != '\0') return kSm90BwdEpilogueDefault;
    return e[0] - '0';
  }();
  return v;
}

// Start offset of the pipe backward's second consumer warpgroup (BwdPipeSched::start):
// DFA_CUDA_BWD_START=0|1|2 forces it for the modes that have one (2..5); -1 (unset) = per mode.
inline int Sm90BwdStart() {
  static const int start = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_START");
    if (e == nullptr || e[0] < '0' || e[0] > '2' || e[1] != '\0') return -1;
    return e[0] - '0';
  }();
  return start;
}

}  // namespace dfa::cuda
