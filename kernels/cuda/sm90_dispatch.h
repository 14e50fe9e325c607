// Host-side choice between the Hopper (wgmma, sm_90a) kernels and the mma.sync ones.
#pragma once

#include <cuda_runtime.h>

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

// The Hopper warp-specialised backward when DFA_CUDA_BWD_PIPE is unset: 0 the atomic-dQ kernel
// (flash_bwd_sm90_ws.cuh); 1..3 the "pipe" kernel (flash_bwd_sm90_pipe.cuh: dQ staged in shared
// memory and added by writer warps with TMA reduce-add): 1 dQ columns split between the two
// consumer warpgroups (head dim 128; 64 runs 2), 2 independent warpgroups (each its own keys'
// dQ partial), 3 as 2 with warpgroup 1 started half an item late.
inline constexpr int kSm90BwdPipeDefault = 0;

// The pipe mode (0..3 as above; the pipe kernel runs where TMA can describe the tensors):
// DFA_CUDA_BWD_PIPE=0..3 forces one, unset (or another value) gives kSm90BwdPipeDefault.
// DFA_CUDA_BWD_WS=0 (the cp.async kernel) takes precedence.
inline int Sm90BwdPipeMode() {
  static const int mode = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_PIPE");
    if (e == nullptr || e[0] < '0' || e[0] > '3' || e[1] != '\0') return kSm90BwdPipeDefault;
    return e[0] - '0';
  }();
  return mode;
}

// True when DFA_CUDA_BWD_DQ_BULK is "1": the warp-specialised backward (head dim 128) then stages
// dQ in shared memory and a producer warp adds it to dq with bulk reduce-add copies; otherwise
// (default) the consumer warps add it with float2 atomics. Opt-in: not yet run on the GPU, and
// its producer spills at 24 registers.
inline bool UseSm90BwdDqBulk() {
  static const bool enabled = [] {
    const char* e = std::getenv("DFA_CUDA_BWD_DQ_BULK");
    return e != nullptr && e[0] == '1';
  }();
  return enabled;
}

}  // namespace dfa::cuda
