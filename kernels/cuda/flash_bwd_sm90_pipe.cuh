// Hopper backward unit, warp-specialised with a dQ writer warp ("pipe" kernel, sm_90a). Same
// contract and math as flash_bwd_sm90.cuh (BwdParams; ComputeDelta has run; dq, dk, dv are fp32
// and receive +=). Chosen by the launchers of flash_bwd_*.cu (UseSm90BwdPipe, sm90_dispatch.h)
// when the dq rows suit bulk copies (16-byte aligned rows), else the atomic-dQ kernel of
// flash_bwd_sm90_ws.cuh runs.
//
// Differences from FlashBwdSm90WsKernel (same tiles: CTA = producer warpgroup + 2 consumer
// warpgroups owning 128 key rows, 64-row query blocks, TMA Q / dO ring, K / V loaded once):
// - The consumers never add dQ to global memory. Each consumer warpgroup writes its dQ tile
//   (64 query rows x 64 fp32: D=128 its column half, D=64 its keys' partial) times the scale to
//   its own shared staging buffer and arrives on dq_full[wg]; producer warp 1 adds the rows to
//   dq with cp.reduce.async.bulk (add.f32, 256 B per row) and releases the buffer (dq_empty[wg])
//   as soon as the copy engine has read it.
// - Per item the GEMMs are issued as S^T, dP^T | dV | (barrier) dQ, dK: the consumer waits for
//   dQ while dK is still on the tensor cores and stages dQ under it (FlashAttention-3's order);
//   only then does it wait for dK and release the Q / dO stage.
// Registers: producer 24, consumers 240 (128 x 24 + 256 x 240 = 384 x 168, the CTA's pool).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cmath>

#include "kernels/cuda/flash_bwd_sm90_ws.cuh"  // BwdTmaMaps, kBwdDsBarrier
#include "kernels/cuda/flash_params.h"
#include "kernels/cuda/sm90_common.cuh"
#include "kernels/cuda/sm90_tma.cuh"

namespace dfa::cuda {

template <int kD>
struct BwdPipeTraits {
  static constexpr int kBlockN = 128, kBlockM = 64, kStages = 2, kThreads = 384;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kDsElems = kBlockN * kBlockM;
  // dQ staging per consumer warpgroup: 64 rows x 64 fp32, rows padded to 72 floats (288 B: 16-byte
  // aligned for the bulk copy; 72 % 32 = 8 keeps the float2 stores of a half-warp conflict-free).
  static constexpr int kDqStride = 72;
  static constexpr int kDqWgFloats = kBlockM * kDqStride;
  // Layout (bytes from the 1024-aligned base): K, V, Q[kStages], dO[kStages], dS^T[2],
  // LSE[kStages][64], Delta[kStages][64], dQ staging [2], mbarriers (kv, full[kStages],
  // empty[kStages], dq_full[2], dq_empty[2]).
  static constexpr int kStatOffset = (2 * kKVElems + 2 * kStages * kQElems + 2 * kDsElems) * 2;
  static constexpr int kDqOffset = kStatOffset + 2 * kStages * kBlockM * 4;
  static constexpr int kBarOffset = kDqOffset + 2 * kDqWgFloats * 4;
  static constexpr int kSmemBytes = kBarOffset + 8 * (5 + 2 * kStages) + 1024;  // + alignment
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 384 * 168, "register pool");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <typename T, int kD>
__global__ void __launch_bounds__(384, 1)
    FlashBwdSm90PipeKernel(const __grid_constant__ BwdParams p,
                           const __grid_constant__ BwdTmaMaps maps) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = BwdPipeTraits<kD>;
  constexpr int kBlockN = Cfg::kBlockN, kBlockM = Cfg::kBlockM, kStages = Cfg::kStages;
  constexpr int kPanels = kD / 64;
  constexpr bool kSplitN = kD == 128;  // dQ: split columns (128) or keys (64) between warpgroups
  constexpr int kNS = kBlockM / 2;     // S^T / dP^T accumulator floats per thread (m64 n64)
  constexpr int kNA = kD / 2;          // dK / dV accumulator floats per thread (m64 n kD)
  extern __shared__ __align__(1024) char smem_bwp[];
  char* base = smem_bwp + ((1024 - (SmemAddr(smem_bwp) & 1023)) & 1023);
  T* s_k = reinterpret_cast<T*>(base);
  T* s_v = s_k + Cfg::kKVElems;
  T* s_q_base = s_v + Cfg::kKVElems;                                 // kStages stages
  T* s_do_base = s_q_base + kStages * Cfg::kQElems;                  // kStages stages
  T* s_ds_base = s_do_base + kStages * Cfg::kQElems;                 // 2 buffers (item parity)
  float* s_lse = reinterpret_cast<float*>(base + Cfg::kStatOffset);  // [kStages][kBlockM]
  float* s_delta = s_lse + kStages * kBlockM;
  float* s_dq = reinterpret_cast<float*>(base + Cfg::kDqOffset);  // [2][kBlockM][kDqStride]
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(base + Cfg::kBarOffset);
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;
  uint64_t* dq_full = empty + kStages;  // [2]
  uint64_t* dq_empty = dq_full + 2;     // [2]

  const int nb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int group = p.q_heads / p.kv_heads;
  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int64_t n_begin = int64_t{nb} * kBlockN;
  const int n_valid = static_cast<int>(Min64(kBlockN, p.n - n_begin));

  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);
  int m_block_min = 0;
  if (p.causal) {
    const int64_t first = p.kv_row0 + n_begin - p.q_row0;  // first query row that sees a key
    if (first > 0) m_block_min = static_cast<int>(Min64(first / kBlockM, m_blocks));
  }
  if (m_block_min >= m_blocks) return;  // nothing visible: dK, dV unchanged (whole CTA)
  const int per_head = m_blocks - m_block_min;
  const int items = group * per_head;

  if (tid == 0) {
    MbarInit(kv_full, 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full + s, 1 + 32);
      MbarInit(empty + s, 8);
    }
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      MbarInit(dq_full + w, 128);
      MbarInit(dq_empty + w, 1);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxNRegDec<Cfg::kProducerRegs>();
    if (warp == 0) {
      if (lane == 0) {
        MbarArriveExpectTx(kv_full, 2 * Cfg::kKVElems * 2);
#pragma unroll
        for (int pn = 0; pn < kPanels; ++pn) {
          TmaLoad4d(s_k + pn * kBlockN * 64, &maps.k, kv_full, pn * 64, hk,
                    static_cast<int>(n_begin), b);
          TmaLoad4d(s_v + pn * kBlockN * 64, &maps.v, kv_full, pn * 64, hk,
                    static_cast<int>(n_begin), b);
        }
      }
      for (int it = 0; it < items; ++it) {
        const int s = it % kStages;
        MbarWait(empty + s, ((it / kStages) & 1) ^ 1);
        const int h = hk * group + it / per_head;
        const int64_t m_begin = int64_t{m_block_min + it % per_head} * kBlockM;
        if (lane == 0) {
          MbarArriveExpectTx(full + s, 2 * Cfg::kQElems * 2);
#pragma unroll
          for (int pn = 0; pn < kPanels; ++pn) {
            TmaLoad4d(s_q_base + s * Cfg::kQElems + pn * kBlockM * 64, &maps.q, full + s, pn * 64,
                      h, static_cast<int>(m_begin), b);
            TmaLoad4d(s_do_base + s * Cfg::kQElems + pn * kBlockM * 64, &maps.dout, full + s,
                      pn * 64, h, static_cast<int>(m_begin), b);
          }
        }
        const float* lse_g = p.lse + b * p.lse_batch_stride + h * p.lse_head_stride + m_begin;
        const float* delta_g =
            p.delta + b * p.delta_batch_stride + h * p.delta_head_stride + m_begin;
#pragma unroll
        for (int r = lane; r < kBlockM; r += 32) {
          float l = INFINITY, d = 0.f;
          if (m_begin + r < p.m) {
            const float lse = lse_g[r];
            if (lse != -INFINITY) l = lse * kLog2e;
            d = delta_g[r];
          }
          s_lse[s * kBlockM + r] = l;
          s_delta[s * kBlockM + r] = d;
        }
        MbarArrive(full + s);  // release: this lane's LSE / Delta stores
      }
    } else if (warp == 1) {  // dQ writer: staged rows -> dq by bulk reduce-add, 2 rows per lane
      const int64_t rs = p.dq_row_stride;
      float* dq_b = p.dq + b * p.dq_batch_stride + lane * rs;
      int m_tile = m_block_min, h = hk * group;
      for (int it = 0; it < items; ++it) {
        const int rows = static_cast<int>(Min64(kBlockM, p.m - int64_t{m_tile} * kBlockM));
        float* dq_g = dq_b + int64_t{m_tile} * kBlockM * rs + h * kD;
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          MbarWait(dq_full + w, it & 1);
          const float* src = s_dq + w * Cfg::kDqWgFloats + lane * Cfg::kDqStride;
          float* dst = dq_g + (kSplitN ? w * 64 : 0);
          if (lane < rows) BulkReduceAddF32(dst, src, 64 * 4);
          if (lane + 32 < rows) BulkReduceAddF32(dst + 32 * rs, src + 32 * Cfg::kDqStride, 64 * 4);
          BulkCommit();
        }
        BulkWaitReadPending<1>();  // warpgroup 0's rows read
        __syncwarp();
        if (lane == 0) MbarArrive(dq_empty);
        BulkWaitReadPending<0>();
        __syncwarp();
        if (lane == 0) MbarArrive(dq_empty + 1);
        if (++m_tile == m_blocks) m_tile = m_block_min, ++h;
      }
      BulkWait();
    }
    return;
  }

  // Consumers.
  SetMaxNRegInc<Cfg::kConsumerRegs>();
  const int cw = wg - 1;  // consumer 0 / 1
  const int g = lane >> 2, t = lane & 3;
  const int key_base = cw * 64 + warp * 16 + g;  // this thread's key rows: key_base, key_base + 8
  const int qrow_base = warp * 16 + g;           // this thread's query rows in the dQ phase
  const float scale_log2 = p.scale * kLog2e;
  float* s_dq_wg = s_dq + cw * Cfg::kDqWgFloats;

  float acc_dk[kNA], acc_dv[kNA];
#pragma unroll
  for (int i = 0; i < kNA; ++i) acc_dk[i] = acc_dv[i] = 0.f;

  MbarWait(kv_full, 0);
  for (int item = 0; item < items; ++item) {
    const int s = item % kStages;
    const int64_t m_begin = int64_t{m_block_min + item % per_head} * kBlockM;
    const T* s_q = s_q_base + s * Cfg::kQElems;
    const T* s_do = s_do_base + s * Cfg::kQElems;
    T* s_ds = s_ds_base + (item & 1) * Cfg::kDsElems;
    const float* s_lse_cur = s_lse + s * kBlockM;
    const float* s_delta_cur = s_delta + s * kBlockM;
    MbarWait(full + s, (item / kStages) & 1);

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys, as two commit groups.
    float st[kNS], dpt[kNS];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int off = (kk & 3) * 16;
      const uint64_t da =
          MakeSmemDesc(s_k + (kk >> 2) * kBlockN * 64 + cw * 64 * 64 + off, 16, 1024);
      const uint64_t db = MakeSmemDesc(s_q + (kk >> 2) * kBlockM * 64 + off, 16, 1024);
      WgmmaSS<T, kBlockM, 0, 0>::Run(st, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const int off = (kk & 3) * 16;
      const uint64_t da =
          MakeSmemDesc(s_v + (kk >> 2) * kBlockN * 64 + cw * 64 * 64 + off, 16, 1024);
      const uint64_t db = MakeSmemDesc(s_do + (kk >> 2) * kBlockM * 64 + off, 16, 1024);
      WgmmaSS<T, kBlockM, 0, 0>::Run(dpt, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    WgmmaWait<1>();
    FenceRegs<kNS>(st);

    // P^T (masked entries: 0). Accumulator i: key row key_base + 8 * ((i >> 1) & 1),
    // query column (i >> 2) * 8 + 2t + (i & 1).
    const bool need_mask =
        n_valid < kBlockN || (p.causal && p.kv_row0 + n_begin + kBlockN - 1 > p.q_row0 + m_begin);
#pragma unroll
    for (int i = 0; i < kNS; ++i) {
      const int ml = (i >> 2) * 8 + 2 * t + (i & 1);
      float pv = FastExp2(st[i] * scale_log2 - s_lse_cur[ml]);
      if (need_mask) {
        const int nl = key_base + ((i >> 1) & 1) * 8;
        if (nl >= n_valid || (p.causal && p.kv_row0 + n_begin + nl > p.q_row0 + m_begin + ml))
          pv = 0.f;
      }
      st[i] = pv;
    }
    uint32_t ap[kBlockM / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ap[kk][0] = Tr::Pack(st[8 * kk + 0], st[8 * kk + 1]);
      ap[kk][1] = Tr::Pack(st[8 * kk + 2], st[8 * kk + 3]);
      ap[kk][2] = Tr::Pack(st[8 * kk + 4], st[8 * kk + 5]);
      ap[kk][3] = Tr::Pack(st[8 * kk + 6], st[8 * kk + 7]);
    }
    // dV += P^T dO (dO read MN-major), on the tensor cores while dS^T is computed.
    FenceRegs<kNA>(acc_dv);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint64_t db = MakeSmemDesc(s_do + kk * 16 * 64, kBlockM * 64 * 2, 1024);
      WgmmaRS<T, kD, 1>::Run(acc_dv, ap[kk], db, 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();  // dP^T done (the dV group may still run)
    FenceRegs<kNS>(dpt);

    uint32_t ads[kBlockM / 16][4];
#pragma unroll
    for (int i = 0; i < kNS; ++i)
      dpt[i] = st[i] * (dpt[i] - s_delta_cur[(i >> 2) * 8 + 2 * t + (i & 1)]);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      ads[kk][0] = Tr::Pack(dpt[8 * kk + 0], dpt[8 * kk + 1]);
      ads[kk][1] = Tr::Pack(dpt[8 * kk + 2], dpt[8 * kk + 3]);
      ads[kk][2] = Tr::Pack(dpt[8 * kk + 4], dpt[8 * kk + 5]);
      ads[kk][3] = Tr::Pack(dpt[8 * kk + 6], dpt[8 * kk + 7]);
      // dS^T to shared memory (rows = keys, columns = queries) for the dQ phase.
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base, kk * 16 + 2 * t)) = ads[kk][0];
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base + 8, kk * 16 + 2 * t)) =
          ads[kk][1];
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base, kk * 16 + 8 + 2 * t)) =
          ads[kk][2];
      *reinterpret_cast<uint32_t*>(s_ds + Sw128<kBlockN>(key_base + 8, kk * 16 + 8 + 2 * t)) =
          ads[kk][3];
    }
    FenceProxyAsync();
    // dS^T complete for both consumers. The buffer of this item's parity is rewritten only two
    // items later, after both consumers passed the next item's barrier, i.e. after their dQ
    // wgmmas of this item completed (WgmmaWait<1> below).
    NamedBarrierSync(kBwdDsBarrier, 256);

    // dQ = dS K (A = dS^T read MN-major, B = K read MN-major), then dK += dS^T Q (Q read
    // MN-major; the scale is applied at the end), as two commit groups.
    float acc_dq[32];
    WgmmaFence();
    constexpr int kQSteps = kSplitN ? kBlockN / 16 : 64 / 16;
#pragma unroll
    for (int kk = 0; kk < kQSteps; ++kk) {
      const int key0 = kSplitN ? kk * 16 : cw * 64 + kk * 16;
      const uint64_t da = MakeSmemDesc(s_ds + key0 * 64, kBlockN * 64 * 2, 1024);
      const uint64_t db =
          MakeSmemDesc(s_k + (kSplitN ? cw * kBlockN * 64 : 0) + key0 * 64, kBlockN * 64 * 2, 1024);
      WgmmaSS<T, 64, 1, 1>::Run(acc_dq, da, db, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
    FenceRegs<kNA>(acc_dk);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint64_t db = MakeSmemDesc(s_q + kk * 16 * 64, kBlockM * 64 * 2, 1024);
      WgmmaRS<T, kD, 1>::Run(acc_dk, ads[kk], db, 1);
    }
    WgmmaCommit();
    WgmmaWait<1>();  // dV and dQ done; dK may still run
    FenceRegs<32>(acc_dq);
    FenceRegs<kNA>(acc_dv);
    FenceRegs<kBlockM / 4>(&ap[0][0]);  // P^T stays untouched until the dV wgmmas finished

    // Stage dQ * scale once the writer has read this warpgroup's previous tile.
    MbarWait(dq_empty + cw, (item & 1) ^ 1);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float* row = s_dq_wg + (qrow_base + hf * 8) * Cfg::kDqStride + 2 * t;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<float2*>(row + j * 8) =
            make_float2(acc_dq[4 * j + 2 * hf] * p.scale, acc_dq[4 * j + 2 * hf + 1] * p.scale);
    }
    FenceProxyAsync();  // the bulk copy reads through the async proxy
    MbarArrive(dq_full + cw);

    WgmmaWait<0>();
    FenceRegs<kNA>(acc_dk);
    FenceRegs<kBlockM / 4>(&ads[0][0]);
    if (lane == 0) MbarArrive(empty + s);  // every read of this stage (Q, dO, LSE, Delta) done
  }

  // dK, dV += (this CTA owns these rows exclusively).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int nl = key_base + hf * 8;
    if (nl >= n_valid) continue;
    float* dk =
        p.dk + b * p.dk_batch_stride + (n_begin + nl) * p.dk_row_stride + int64_t{hk} * kD + 2 * t;
    float* dv =
        p.dv + b * p.dv_batch_stride + (n_begin + nl) * p.dv_row_stride + int64_t{hk} * kD + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) {
      float2 k2 = *reinterpret_cast<float2*>(dk + dt * 8);
      float2 v2 = *reinterpret_cast<float2*>(dv + dt * 8);
      k2.x += acc_dk[4 * dt + 2 * hf] * p.scale;
      k2.y += acc_dk[4 * dt + 2 * hf + 1] * p.scale;
      v2.x += acc_dv[4 * dt + 2 * hf];
      v2.y += acc_dv[4 * dt + 2 * hf + 1];
      *reinterpret_cast<float2*>(dk + dt * 8) = k2;
      *reinterpret_cast<float2*>(dv + dt * 8) = v2;
    }
  }
#else
  __trap();  // only the sm_90a build carries this kernel; the launcher never picks it elsewhere
#endif
}

// Queues the pipe backward. Returns cudaErrorNotSupported, with nothing queued, when TMA cannot
// describe the inputs or the dq rows are not 16-byte aligned (the caller then runs another
// kernel).
template <typename T, int kD>
cudaError_t LaunchBwdSm90Pipe(const BwdParams& p, cudaStream_t stream) {
  using Cfg = BwdPipeTraits<kD>;
  if (reinterpret_cast<uintptr_t>(p.dq) % 16 != 0 || p.dq_row_stride % 4 != 0 ||
      (p.batch > 1 && p.dq_batch_stride % 4 != 0)) {
    return cudaErrorNotSupported;
  }
  BwdTmaMaps maps;
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 || p.m > INT32_MAX ||
      p.n > INT32_MAX || p.q_heads > INT32_MAX / kD ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.dout, p.dout, kD, p.q_heads, p.m, p.batch, p.do_row_stride,
                             p.do_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, Cfg::kBlockN) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, Cfg::kBlockN)) {
    return cudaErrorNotSupported;
  }
  auto kernel = FlashBwdSm90PipeKernel<T, kD>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((p.n + Cfg::kBlockN - 1) / Cfg::kBlockN), p.kv_heads,
                  p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace dfa::cuda
