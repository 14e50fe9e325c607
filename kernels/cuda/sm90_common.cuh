// Hopper (sm_90a) vocabulary of the wgmma kernels: 128-byte-swizzled shared tiles that both
// cp.async (writer) and wgmma (reader, through matrix descriptors) understand, descriptors,
// and the wgmma fence / commit / wait barriers. Only included by .cu files; every function
// compiles to nothing outside the sm_90a pass (DFA_WGMMA, wgmma_ops.cuh).
//
// Tile layout ("SW128"): a tile of R rows x C columns (C a multiple of 64, 2-byte elements) is
// stored as C/64 column panels of R rows x 64 elements (128 bytes per row); inside a panel the
// 16-byte chunk c of row r lies at chunk c ^ (r % 8). Panels start at 1024-byte boundaries.
// This is the canonical 128B-swizzle layout of wgmma for both operand majors:
//   K-major operand (rows = M or N, columns = K): SBO = 1024 B between 8-row groups, a k-step of
//     16 columns advances the start address by 32 B inside a panel (next panel after 4 steps);
//   MN-major operand (rows = K, columns = M or N): LBO = panel size between 64-column panels,
//     SBO = 1024 B between 8-row groups, a k-step of 16 rows advances the start by 2048 B.
#pragma once

#include <cstdint>

#include "kernels/cuda/flash_common.cuh"
#include "kernels/cuda/wgmma_ops.cuh"

namespace dfa::cuda {

// Element offset of (row, col) in an SW128 tile of kRows rows.
template <int kRows>
__device__ inline int Sw128(int row, int col) {
  return (col >> 6) * (kRows * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// Copies rows [0, kRows) x kCols of a row-major global tile into an SW128 shared tile with
// cp.async; rows >= valid_rows are zero-filled.
template <int kRows, int kCols, int kThreads, typename T>
__device__ inline void LoadTileSw128(T* smem, const T* gmem, int64_t row_stride, int valid_rows,
                                     int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
  static_assert(kChunks % kThreads == 0, "whole copy rounds");
#pragma unroll
  for (int i = tid; i < kChunks; i += kThreads) {
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
    const bool valid = r < valid_rows;
    CpAsync16(smem + Sw128<kRows>(r, c), gmem + (valid ? r * row_stride + c : 0), valid);
  }
}

// Shared-memory matrix descriptor with 128-byte swizzle. Byte offsets are multiples of 16.
__device__ inline uint64_t MakeSmemDesc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t addr = SmemAddr(smem);
  uint64_t d = static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t{1} << 62;  // layout type: 128-byte swizzle
  return d;
}

// `desc` advanced by `elems` 16-bit elements (a multiple of 8), other fields unchanged (LBO /
// SBO / swizzle): the start address field is bits 0..13 in 16-byte units and shared memory
// addresses stay below 256 KB, so the sum never carries out of it (a 32-bit add). Lets a loop
// build each wgmma's descriptor from a base with one add instead of MakeSmemDesc's masks/shifts.
__device__ __forceinline__ uint64_t DescPlus(uint64_t desc, int elems) {
  const uint32_t lo = static_cast<uint32_t>(desc) + static_cast<uint32_t>((elems * 2) >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

__device__ inline void WgmmaFence() {
#ifdef DFA_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void WgmmaCommit() {
#ifdef DFA_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kN>
__device__ inline void WgmmaWait() {
#ifdef DFA_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kN) : "memory");
#endif
}
// Makes generic-proxy writes to shared memory (cp.async, st.shared) visible to wgmma.
__device__ inline void FenceProxyAsync() {
#ifdef DFA_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keeps the compiler from moving reads or writes of accumulator registers across wgmma
// issue / wait points.
template <int kN>
__device__ inline void FenceRegs(float* r) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ inline void FenceRegs(uint32_t* r) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// True in exactly one lane of a fully active warp (elect.sync): a "lane 0" test that needs no
// %tid read (ptxas re-reads %tid inside register-starved loops; ncu shows each re-read waiting).
__device__ inline bool ElectOne() {
#ifdef DFA_WGMMA
  uint32_t e = 0;
  asm volatile(
      "{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(e));
  return e != 0;
#else
  return (threadIdx.x & 31) == 0;
#endif
}
// Stores four 8x8 16-bit matrices (stmatrix .x4): register i of every lane holds its fragment of
// matrix i (row lane / 4, columns 2 (lane % 4), +1), lanes 8i..8i+7 give the shared addresses of
// matrix i's rows 0..7.
__device__ inline void StMatrixX4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                  uint32_t r3) {
#ifdef DFA_WGMMA
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#endif
}

// Named barrier among `threads` threads (a multiple of 32), id 1..15 (0 is __syncthreads).
__device__ inline void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace dfa::cuda
