// EXPERIMENT, never run on a GPU: the persistent interval forward whose tiles overlap each
// other's compute through one flattened loop over the CTA's (tile, key block) items. Every step
// issues S(next item) and P V(this item) with the same shapes (no wgmma under a branch, the
// rule of docs/kernels-cuda.md); a tile change is non-wgmma code after the step's last wait:
// the old tile's epilogue (O over its own Q buffer rows and a TMA store, or the register path)
// and the accumulator reset, while the next tile's first S is done and its softmax computed.
// Tiles come from a counter (one CTA per SM) through a 2-slot ring; two Q buffers, released by
// each consumer once its O store has read them. Compiles for sm_90a at head dim 128 without
// wgmma serialisation (12 bytes of spills with producer / consumer registers 40 / 232; 72 in
// the producer at 24 / 240); head dim 64 (3 consumers at 152) spills 364 bytes.
#pragma once

#include "kernels/cuda/flash_fwd_sm90_ws.cuh"

namespace dfa::cuda {

template <int kD, int kBlockN, int kStages, int kConsumers>
struct FwdFlatTraits {
  static constexpr int kBlockM = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kQElems = kBlockM * kD;
  static constexpr int kKVElems = kBlockN * kD;
  static constexpr int kBarOffset = (2 * kQElems + 2 * kStages * kKVElems) * 2;
  // q_full[2], q_empty[2], k/v full/empty[kStages], tile_full[2], tile_empty[2], ids[2]
  static constexpr int kSmemBytes = kBarOffset + 8 * (4 + 4 * kStages + 4) + 8 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
  static constexpr int kProducerRegs = 40, kConsumerRegs = kConsumers == 2 ? 232 : 152;
};

struct FlatTile {
  int h = 0, b = 0, hk = 0, m_valid = 0, n_blocks = 0, n_first = 0, top = 0, bottom = 0;
  int64_t m_begin = 0;
};

template <typename T, int kD, int kBlockN, int kStages, int kConsumers>
__global__ void __launch_bounds__(128 * (kConsumers + 1), 1)
    FlashFwdSm90IvFlatKernel(const __grid_constant__ FwdParams p,
                             const __grid_constant__ FwdTmaMaps maps, int* tile_counter) {
#ifdef DFA_WGMMA
  using Tr = ElemTraits<T>;
  using Cfg = FwdFlatTraits<kD, kBlockN, kStages, kConsumers>;
  constexpr int kBlockM = Cfg::kBlockM;
  constexpr int kNS = kBlockN / 2, kNO = kD / 2, kPanels = kD / 64;
  extern __shared__ __align__(1024) char smem_flat[];
  char* base = smem_flat + ((1024 - (SmemAddr(smem_flat) & 1023)) & 1023);
  T* s_q = reinterpret_cast<T*>(base);  // 2 buffers
  T* s_k = s_q + 2 * Cfg::kQElems;
  T* s_v = s_k + kStages * Cfg::kKVElems;
  uint64_t* q_full = reinterpret_cast<uint64_t*>(base + Cfg::kBarOffset);  // [2]
  uint64_t* q_empty = q_full + 2;                                           // [2]
  uint64_t* k_full = q_empty + 2;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;
  uint64_t* tile_full = v_empty + kStages;  // [2]
  uint64_t* tile_empty = tile_full + 2;     // [2]
  int* s_tile = reinterpret_cast<int*>(tile_empty + 2);

  const int tid = threadIdx.x;
  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int m_blocks = static_cast<int>((p.m + kBlockM - 1) / kBlockM);
  const int n_tiles = m_blocks * p.q_heads * p.batch;
  auto tile_of = [&](int id) {
    FlatTile w;
    const int mb = m_blocks - 1 - id % m_blocks;
    const int r = id / m_blocks;
    w.h = r % p.q_heads;
    w.b = r / p.q_heads;
    w.hk = w.h / (p.q_heads / p.kv_heads);
    w.m_begin = int64_t{mb} * kBlockM;
    w.m_valid = static_cast<int>(Min64(kBlockM, p.m - w.m_begin));
    const IvBlockRange iv = IvKeyBlocks(p.iv, w.b, p.q_row0 + w.m_begin,
                                        p.q_row0 + w.m_begin + w.m_valid - 1, p.kv_row0, p.n,
                                        kBlockN);
    w.n_blocks = iv.count;
    w.n_first = iv.first;
    w.top = iv.top;
    w.bottom = iv.bottom;
    return w;
  };

  if (tid == 0) {
    for (int i = 0; i < 2; ++i) {
      MbarInit(q_full + i, 1);
      MbarInit(q_empty + i, kConsumers);
      MbarInit(tile_full + i, 1);
      MbarInit(tile_empty + i, 4 * kConsumers);
    }
    for (int s = 0; s < kStages; ++s) {
      MbarInit(k_full + s, 1);
      MbarInit(v_full + s, 1);
      MbarInit(k_empty + s, 4 * kConsumers);
      MbarInit(v_empty + s, 4 * kConsumers);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (wg == 0) {  // producer
    SetMaxNRegDec<Cfg::kProducerRegs>();
    if (warp == 0 && lane == 0) {
      constexpr uint32_t kQBytes = Cfg::kQElems * 2, kKVBytes = Cfg::kKVElems * 2;
      uint32_t g = 0, q_uses = 0;
      int next = static_cast<int>(blockIdx.x);
      for (int k = 0;; ++k) {
        const int id = next, slot = k & 1;
        MbarWait(tile_empty + slot, ((k >> 1) & 1) ^ 1);
        s_tile[slot] = id;
        MbarArrive(tile_full + slot);
        if (id >= n_tiles) break;
        next = static_cast<int>(gridDim.x) + atomicAdd(tile_counter, 1);
        const FlatTile w = tile_of(id);
        if (w.n_blocks <= 0) continue;
        const uint32_t qb = q_uses & 1;
        if (q_uses >= 2) MbarWait(q_empty + qb, ((q_uses >> 1) & 1) ^ 1);
        MbarArriveExpectTx(q_full + qb, kQBytes);
        for (int pn = 0; pn < kPanels; ++pn)
          TmaLoad4d(s_q + qb * Cfg::kQElems + pn * kBlockM * 64, &maps.q, q_full + qb, pn * 64,
                    w.h, static_cast<int>(w.m_begin), w.b);
        ++q_uses;
        auto load = [&](int it, T* tiles, uint64_t* full, uint64_t* empty, const CUtensorMap* m) {
          const uint32_t gi = g + static_cast<uint32_t>(it), s = gi % kStages;
          MbarWait(empty + s, ((gi / kStages) & 1) ^ 1);
          MbarArriveExpectTx(full + s, kKVBytes);
          const int n0 = (w.n_first + w.n_blocks - 1 - it) * kBlockN;
          for (int pn = 0; pn < kPanels; ++pn)
            TmaLoad4d(tiles + s * Cfg::kKVElems + pn * kBlockN * 64, m, full + s, pn * 64, w.hk,
                      n0, w.b);
        };
        load(0, s_k, k_full, k_empty, &maps.k);
        for (int it = 0; it < w.n_blocks; ++it) {
          if (it + 1 < w.n_blocks) load(it + 1, s_k, k_full, k_empty, &maps.k);
          load(it, s_v, v_full, v_empty, &maps.v);
        }
        g += static_cast<uint32_t>(w.n_blocks);
      }
    }
    return;
  }

  // Consumers.
  SetMaxNRegInc<Cfg::kConsumerRegs>();
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;
  const int gq = lane >> 2, t = lane & 3;
  const int row_base = cw * 64 + warp * 16 + gq;
  const float scale_log2 = p.scale * kLog2e;
  auto release = [&](uint64_t* bar) {
    if (lane == 0) MbarArrive(bar);
  };
  const int my_turn = kTurnBarrier + cw, next_turn = kTurnBarrier + (cw + 1) % kConsumers;
  if (cw == kConsumers - 1) NamedBarrierArrive(kTurnBarrier + 0, 256);

  float acc_o[kNO];
#pragma unroll
  for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f}, corr[2] = {1.f, 1.f};
  float s[kNS], pr[kNS];
  uint32_t a[kBlockN / 16][4];

  // LSE (and O when not staged) of a tile from the given accumulators / statistics.
  auto epilogue = [&](const FlatTile& w, uint32_t qb, const float* mx, const float* sm) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float l = QuadSum(sm[hf]);
      const int r = row_base + hf * 8;
      if (r >= w.m_valid) continue;
      const int64_t row = w.m_begin + r;
      float lse_b = l > 0.f ? mx[hf] * kLn2 + logf(l) : -INFINITY;
      float wa = 0.f, wb = l > 0.f ? 1.f / l : 0.f;
      float* lse_ptr = p.lse + w.b * p.lse_batch_stride + w.h * p.lse_head_stride + row;
      if (p.accumulate) {
        const float lse_a = *lse_ptr;
        const float m2 = fmaxf(lse_a, lse_b);
        if (m2 == -INFINITY) {
          lse_b = -INFINITY;
          wb = 0.f;
        } else {
          const float ea = __expf(lse_a - m2), eb = __expf(lse_b - m2);
          const float inv = 1.f / (ea + eb);
          wa = ea * inv;
          wb *= eb * inv;
          lse_b = m2 + logf(ea + eb);
        }
      }
      if (t == 0) *lse_ptr = lse_b;
      if (maps.o_tma) {
        char* row0 = reinterpret_cast<char*>(s_q + qb * Cfg::kQElems) + r * 128;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt)
          *reinterpret_cast<uint32_t*>(row0 + (dt >> 3) * kBlockM * 128 +
                                       (((dt & 7) ^ (r & 7)) << 4) + t * 4) =
              Tr::Pack(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
        continue;
      }
      const int64_t o_off = w.b * p.o_batch_stride + row * p.o_row_stride + int64_t{w.h} * kD + 2 * t;
      if (p.out_f32) {
        float* o = static_cast<float*>(p.out) + o_off;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
          float2 v = make_float2(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
          if (p.accumulate) {
            const float2 old = *reinterpret_cast<const float2*>(o + dt * 8);
            v.x += old.x * wa;
            v.y += old.y * wa;
          }
          *reinterpret_cast<float2*>(o + dt * 8) = v;
        }
      } else {
        T* o = static_cast<T*>(p.out) + o_off;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt)
          *reinterpret_cast<uint32_t*>(o + dt * 8) =
              Tr::Pack(acc_o[4 * dt + 2 * hf] * wb, acc_o[4 * dt + 2 * hf + 1] * wb);
      }
    }
    if (maps.o_tma) {
      FenceProxyAsync();
      NamedBarrierSync(kOStagedBarrier + cw, 128);
      if (warp == 0 && lane == 0) {
        for (int pn = 0; pn < kPanels; ++pn)
          TmaStore4d(&maps.o, s_q + qb * Cfg::kQElems + pn * kBlockM * 64 + cw * 64 * 64, pn * 64,
                     w.h, static_cast<int>(w.m_begin) + cw * 64, w.b);
        BulkCommit();
        BulkWaitRead();
      }
    }
    if (warp == 0 && lane == 0) MbarArrive(q_empty + qb);  // this consumer is done with it
  };

  // The next tile with key blocks (tiles that see nothing get their epilogue here).
  int k = 0;  // tiles taken from the ring
  uint32_t q_uses = 0;
  auto next_tile = [&](FlatTile* w, IvRow* rows, uint32_t* qb) -> bool {
    while (true) {
      const int slot = k & 1;
      MbarWait(tile_full + slot, (k >> 1) & 1);
      const int id = s_tile[slot];
      __syncwarp();
      release(tile_empty + slot);
      ++k;
      if (id >= n_tiles) return false;
      *w = tile_of(id);
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row_base + hf * 8;
        rows[hf] = IvQueryRow(p.iv, w->b, p.q_row0 + w->m_begin + r, p.kv_row0, p.n,
                              r < w->m_valid);
      }
      if (w->n_blocks > 0) {
        *qb = q_uses & 1;
        ++q_uses;
        return true;
      }
      // No key: O = 0, LSE = -inf (a partial being accumulated stays as it is).
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = row_base + hf * 8;
        if (r >= w->m_valid) continue;
        float* lse_ptr = p.lse + w->b * p.lse_batch_stride + w->h * p.lse_head_stride +
                         w->m_begin + r;
        if (!p.accumulate && t == 0) *lse_ptr = -INFINITY;
        if (!p.accumulate) {
          const int64_t o_off =
              w->b * p.o_batch_stride + (w->m_begin + r) * p.o_row_stride + int64_t{w->h} * kD + 2 * t;
          if (p.out_f32) {
            float* o = static_cast<float*>(p.out) + o_off;
            for (int dt = 0; dt < kD / 8; ++dt) *reinterpret_cast<float2*>(o + dt * 8) = make_float2(0.f, 0.f);
          } else {
            T* o = static_cast<T*>(p.out) + o_off;
            for (int dt = 0; dt < kD / 8; ++dt) *reinterpret_cast<uint32_t*>(o + dt * 8) = 0u;
          }
        }
      }
    }
  };

  const uint32_t k_lo = FwdWsDescLo(s_k, 16);
  const uint32_t v_lo = FwdWsDescLo(s_v, kBlockN * 64 * 2);
  constexpr uint32_t kStageLo = Cfg::kKVElems * 2 / 16;
  constexpr uint32_t kQBufLo = Cfg::kQElems * 2 / 16;
  const uint32_t q_lo0 = FwdWsDescLo(s_q + cw * 64 * 64, 16);
  auto issue_s = [&](uint32_t qb, uint32_t stage) {
    const uint32_t ql = q_lo0 + qb * kQBufLo, ks = k_lo + stage * kStageLo;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint64_t dq = FwdWsDesc(ql + ((kk >> 2) * kBlockM * 64 + (kk & 3) * 16) * 2 / 16);
      const uint64_t dk = FwdWsDesc(ks + ((kk >> 2) * kBlockN * 64 + (kk & 3) * 16) * 2 / 16);
      WgmmaSS<T, kBlockN, 0, 0>::Run(s, dq, dk, kk > 0 ? 1 : 0);
    }
    WgmmaCommit();
  };
  auto issue_pv = [&](uint32_t stage) {
    const uint32_t vs = v_lo + stage * kStageLo;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
      WgmmaRS<T, kD, 1>::Run(acc_o, a[kk], FwdWsDesc(vs + kk * 16 * 64 * 2 / 16), 1);
    WgmmaCommit();
  };
  auto softmax = [&](const FlatTile& w, const IvRow* rows, int it) {
    if (it < w.top || it >= w.n_blocks - w.bottom) {
      const int n0 = (w.n_first + w.n_blocks - 1 - it) * kBlockN;
      int lo[2], hi[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        lo[hf] = rows[hf].lo - n0 - 2 * t;
        hi[hf] = rows[hf].hi - n0 - 2 * t;
      }
#pragma unroll
      for (int i = 0; i < kNS; ++i) {
        const int c = (i >> 2) * 8 + (i & 1);
        s[i] = (c >= lo[(i >> 1) & 1]) & (c < hi[(i >> 1) & 1]) ? s[i] : -INFINITY;
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v[kBlockN / 8];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) v[j] = fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = fmaxf(v[j], v[j + 8]);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = fmaxf(v[j], v[j + 4]);
      v[0] = fmaxf(fmaxf(v[0], v[2]), fmaxf(v[1], v[3]));
      const float mx = fmaxf(QuadMax(v[0]) * scale_log2, row_max[hf]);
      const float ref = mx == -INFINITY ? 0.f : mx;
      corr[hf] = FastExp2(row_max[hf] - ref);
      row_max[hf] = mx;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = FastExp2(s[4 * j + 2 * hf + e] * scale_log2 - ref);
          pr[4 * j + 2 * hf + e] = pv;
          sum += pv;
        }
      row_sum[hf] = row_sum[hf] * corr[hf] + sum;
    }
  };
  auto rescale_o = [&]() {
    if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
      for (int dt = 0; dt < kD / 8; ++dt) {
        acc_o[4 * dt + 0] *= corr[0];
        acc_o[4 * dt + 1] *= corr[0];
        acc_o[4 * dt + 2] *= corr[1];
        acc_o[4 * dt + 3] *= corr[1];
      }
    }
  };
  auto pack_p = [&]() {
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      a[kk][0] = Tr::Pack(pr[8 * kk + 0], pr[8 * kk + 1]);
      a[kk][1] = Tr::Pack(pr[8 * kk + 2], pr[8 * kk + 3]);
      a[kk][2] = Tr::Pack(pr[8 * kk + 4], pr[8 * kk + 5]);
      a[kk][3] = Tr::Pack(pr[8 * kk + 6], pr[8 * kk + 7]);
    }
  };

  FlatTile w;
  IvRow rows[2];
  uint32_t qb = 0;
  if (next_tile(&w, rows, &qb)) {
    // Item 0.
    uint32_t g = 0;
    MbarWait(q_full + qb, ((q_uses - 1) >> 1) & 1);
    MbarWait(k_full, 0);
    NamedBarrierSync(my_turn, 256);
    WgmmaFence();
    issue_s(qb, 0);
    NamedBarrierArrive(next_turn, 256);
    WgmmaWait<0>();
    FenceRegs<kNS>(s);
    release(k_empty);
    softmax(w, rows, 0);
    pack_p();
    int it = 0;
    bool more = true;
    while (true) {
      // The next item: block it + 1 of this tile, or block 0 of the next tile.
      const bool same = it + 1 < w.n_blocks;
      FlatTile nw = w;
      IvRow nrows[2] = {rows[0], rows[1]};
      uint32_t nqb = qb;
      if (!same) more = next_tile(&nw, nrows, &nqb);
      if (!more) break;
      const uint32_t gn = g + 1;
      const uint32_t sk = gn % kStages, sv = g % kStages;
      MbarWait(k_full + sk, (gn / kStages) & 1);
      MbarWait(v_full + sv, (g / kStages) & 1);
      if (!same) MbarWait(q_full + nqb, ((q_uses - 1) >> 1) & 1);
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      NamedBarrierSync(my_turn, 256);
      WgmmaFence();
      issue_s(nqb, sk);
      rescale_o();
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      WgmmaFence();
      issue_pv(sv);
      NamedBarrierArrive(next_turn, 256);
      WgmmaWait<1>();
      FenceRegs<kNS>(s);
      release(k_empty + sk);
      float old_max[2] = {row_max[0], row_max[1]}, old_sum[2] = {row_sum[0], row_sum[1]};
      if (!same) {
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.f;
      }
      softmax(nw, nrows, same ? it + 1 : 0);
      FenceRegs<kNS>(pr);
      FenceRegs<2>(row_sum);
      NamedBarrierSync(kPinBarrier + cw, 128);
      WgmmaWait<0>();
      FenceRegs<kNO>(acc_o);
      FenceRegs<kBlockN / 4>(&a[0][0]);
      release(v_empty + sv);
      if (!same) {
        epilogue(w, qb, old_max, old_sum);
#pragma unroll
        for (int i = 0; i < kNO; ++i) acc_o[i] = 0.f;
        w = nw;
        rows[0] = nrows[0];
        rows[1] = nrows[1];
        qb = nqb;
        it = 0;
      } else {
        ++it;
      }
      pack_p();
      g = gn;
    }
    // The last item's P V alone, then its tile's epilogue.
    const uint32_t sv = g % kStages;
    MbarWait(v_full + sv, (g / kStages) & 1);
    FenceRegs<kNO>(acc_o);
    FenceRegs<kBlockN / 4>(&a[0][0]);
    rescale_o();
    FenceRegs<kNO>(acc_o);
    FenceRegs<kBlockN / 4>(&a[0][0]);
    WgmmaFence();
    issue_pv(sv);
    WgmmaWait<0>();
    FenceRegs<kNO>(acc_o);
    release(v_empty + sv);
    epilogue(w, qb, row_max, row_sum);
  }
  if (cw == 0) NamedBarrierSync(kTurnBarrier + 0, 256);
#else
  __trap();
#endif
}

template <typename T, int kD, int kConsumers>
cudaError_t LaunchFwdSm90IvFlat(const FwdParams& p, cudaStream_t stream) {
  using Cfg = FwdFlatTraits<kD, 128, 2, kConsumers>;
  FwdTmaMaps maps{};
  if (p.m <= 0 || p.n <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0 ||
      !EncodeRowTensorMap<T>(&maps.q, p.q, kD, p.q_heads, p.m, p.batch, p.q_row_stride,
                             p.q_batch_stride, Cfg::kBlockM) ||
      !EncodeRowTensorMap<T>(&maps.k, p.k, kD, p.kv_heads, p.n, p.batch, p.k_row_stride,
                             p.k_batch_stride, 128) ||
      !EncodeRowTensorMap<T>(&maps.v, p.v, kD, p.kv_heads, p.n, p.batch, p.v_row_stride,
                             p.v_batch_stride, 128)) {
    return cudaErrorNotSupported;
  }
  maps.o_tma = !p.out_f32 && !p.accumulate &&
               EncodeRowTensorMap<T>(&maps.o, p.out, kD, p.q_heads, p.m, p.batch, p.o_row_stride,
                                     p.o_batch_stride, 64);
  auto kernel = FlashFwdSm90IvFlatKernel<T, kD, 128, 2, kConsumers>;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t tiles = ((p.m + Cfg::kBlockM - 1) / Cfg::kBlockM) * p.q_heads * p.batch;
  int dev = 0, sms = 0;
  if ((err = cudaGetDevice(&dev)) != cudaSuccess) return err;
  if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
    return err;
  int* counter = nullptr;
  if ((err = cudaMallocAsync(reinterpret_cast<void**>(&counter), sizeof(int), stream)) != cudaSuccess)
    return err;
  err = cudaMemsetAsync(counter, 0, sizeof(int), stream);
  if (err == cudaSuccess) {
    kernel<<<static_cast<unsigned>(tiles < sms ? tiles : sms), Cfg::kThreads, Cfg::kSmemBytes,
             stream>>>(p, maps, counter);
    err = cudaGetLastError();
  }
  const cudaError_t free_err = cudaFreeAsync(counter, stream);
  return err != cudaSuccess ? err : free_err;
}

}  // namespace dfa::cuda
