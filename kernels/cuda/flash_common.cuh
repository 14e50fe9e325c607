// Small device-side vocabulary shared by the fused attention kernels (sm_80+ mma.sync path):
// element traits, 16-byte async copies into XOR-swizzled shared tiles, ldmatrix, m16n8k16 MMA,
// and fast exp2. Only included by .cu files.
//
// Fragment layouts (PTX ISA, mma.m16n8k16, g = lane / 4, t = lane % 4):
//   A (16x16, row): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k=2t..2t+1, n=g)  b1 (k=2t+8.., n=g)
//   C (16x8, f32):  c0,c1 (g, 2t..2t+1)  c2,c3 (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace dfa::cuda {

template <typename T>
struct ElemTraits;

template <>
struct ElemTraits<__nv_bfloat16> {
  // Packs two floats into one 32-bit register of two bf16 (lo = a).
  __device__ static inline uint32_t Pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static inline float ToFloat(uint16_t x) {
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
  }
  __device__ static inline void Mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct ElemTraits<__half> {
  __device__ static inline uint32_t Pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  __device__ static inline float ToFloat(uint16_t x) {
    return __half2float(__ushort_as_half(x));
  }
  __device__ static inline void Mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

__device__ inline uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared tiles of 2-byte elements with kCols columns per row (kCols a multiple of 64). The
// 16-byte chunk c of row r is stored at chunk c ^ (r % 8): ldmatrix over 8 rows of one column
// chunk then hits 8 different bank groups.
template <int kCols>
__device__ inline int Swz(int row, int col) {
  return row * kCols + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

// 16-byte global->shared copy; src_bytes = 0 zero-fills the destination without reading.
__device__ inline void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kN>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN));
}

// Copies rows [0, kRows) x kCols of a row-major global tile (row stride in elements) into a
// swizzled shared tile; rows >= valid_rows are zero-filled.
template <int kRows, int kCols, int kThreads, typename T>
__device__ inline void LoadTile(T* smem, const T* gmem, int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kChunks = kRows * kChunksPerRow;
#pragma unroll
  for (int i = threadIdx.x; i < kChunks; i += kThreads) {
    const int r = i / kChunksPerRow, c = (i % kChunksPerRow) * 8;
    const bool valid = r < valid_rows;
    const T* src = gmem + (valid ? r * row_stride + c : 0);
    CpAsync16(smem + Swz<kCols>(r, c), src, valid);
  }
}

__device__ inline void LdMatrixX4(uint32_t* r, const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}
__device__ inline void LdMatrixX4Trans(uint32_t* r, const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

// A fragment (16 x 16 at row0, col0) of a row-major swizzled tile.
template <int kCols, typename T>
__device__ inline void LoadA(uint32_t* a, const T* smem, int row0, int col0) {
  const int lane = threadIdx.x & 31;
  LdMatrixX4(a, smem + Swz<kCols>(row0 + (lane & 15), col0 + (lane >> 4) * 8));
}
// A fragment (16 x 16) of the transpose of a row-major swizzled tile: A[m][k] = tile[k][m],
// the fragment covers A rows m0.. and columns k0.. .
template <int kCols, typename T>
__device__ inline void LoadATrans(uint32_t* a, const T* smem, int m0, int k0) {
  const int lane = threadIdx.x & 31, i = lane >> 3;
  LdMatrixX4Trans(a, smem + Swz<kCols>(k0 + (i >> 1) * 8 + (lane & 7), m0 + (i & 1) * 8));
}
// B fragments of two n-tiles (n0.., n0+8..) x k 16 where B[k][n] = tile[n][k] (tile rows = n):
// b[0..1] for n-tile n0, b[2..3] for n-tile n0 + 8.
template <int kCols, typename T>
__device__ inline void LoadBRowsN(uint32_t* b, const T* smem, int n0, int k0) {
  const int lane = threadIdx.x & 31;
  LdMatrixX4(b, smem + Swz<kCols>(n0 + (lane >> 4) * 8 + (lane & 7), k0 + ((lane >> 3) & 1) * 8));
}
// B fragments of two n-tiles where B[k][n] = tile[k][n] (tile rows = k), via ldmatrix.trans.
template <int kCols, typename T>
__device__ inline void LoadBRowsK(uint32_t* b, const T* smem, int k0, int n0) {
  const int lane = threadIdx.x & 31;
  LdMatrixX4Trans(b, smem + Swz<kCols>(k0 + (lane & 15), n0 + (lane >> 4) * 8));
}

__device__ inline float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Sums / maxes over the 4 lanes of a quad (the lanes that share a C-fragment row).
__device__ inline float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ inline float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__host__ __device__ inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

}  // namespace dfa::cuda
