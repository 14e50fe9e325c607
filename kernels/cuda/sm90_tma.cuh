// Hopper (sm_90a) vocabulary of the warp-specialised kernels: mbarriers, TMA bulk tensor copies
// (cp.async.bulk.tensor) that complete on an mbarrier, register reallocation (setmaxnreg) and
// named-barrier arrive. Device functions compile to nothing outside the sm_90a pass
// (DFA_WGMMA); only included by .cu files.
//
// Contracts:
// - An mbarrier is 8 bytes of shared memory, initialised by one thread (MbarInit) and published
//   with FenceMbarInit + a CTA barrier before anyone else touches it.
// - A "full" barrier of a stage is armed by the producer (MbarArriveExpectTx, count 1) with the
//   bytes its TMA copies will write; consumers wait on its phase parity (MbarWait).
// - An "empty" barrier counts consumer releases (MbarArrive); the producer waits on it with the
//   opposite parity before reusing the stage (a fresh barrier passes parity 1 at once).
#pragma once

#include <cstdint>

#include "kernels/cuda/sm90_common.cuh"

namespace dfa::cuda {

__device__ inline void MbarInit(uint64_t* bar, uint32_t count) {
#ifdef DFA_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count)
               : "memory");
#endif
}
__device__ inline void FenceMbarInit() {
#ifdef DFA_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ inline void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#ifdef DFA_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
#endif
}
__device__ inline void MbarArrive(uint64_t* bar) {
#ifdef DFA_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
#endif
}
// Arrives when `pred` is non-zero, as one predicated instruction (no branch: ptxas serialises
// wgmmas around divergent paths).
__device__ inline void MbarArriveIf(uint64_t* bar, int pred) {
#ifdef DFA_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(
          SmemAddr(bar)),
      "r"(pred)
      : "memory");
#endif
}
// Spins until the phase with parity `parity` of `bar` has completed.
__device__ inline void MbarWait(uint64_t* bar, uint32_t parity) {
#ifdef DFA_WGMMA
  asm volatile(
      "{\n.reg .pred done;\n"
      "DFA_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra DFA_MBAR_WAIT;\n}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
#endif
}

// 4-D TMA tile load (coordinates innermost first) into shared memory, completing on `bar`.
// `tmap` is the address of a CUtensorMap kernel parameter (__grid_constant__).
__device__ inline void TmaLoad4d(void* smem_dst, const void* tmap, uint64_t* bar, int c0, int c1,
                                 int c2, int c3) {
#ifdef DFA_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(SmemAddr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(SmemAddr(bar))
      : "memory");
#endif
}

// 4-D TMA tile store (coordinates innermost first) of a shared-memory box into the global
// tensor of `tmap` (elements outside the tensor are skipped), in the calling thread's bulk
// group: the source may be rewritten (or the CTA exit) after BulkWaitRead.
__device__ inline void TmaStore4d(const void* tmap, const void* smem_src, int c0, int c1, int c2,
                                  int c3) {
#ifdef DFA_WGMMA
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)),
      "r"(SmemAddr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

// Register reallocation of the calling warpgroup (all 128 threads, warp-uniform branch).
template <int kRegs>
__device__ inline void SetMaxNRegDec() {
#ifdef DFA_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ inline void SetMaxNRegInc() {
#ifdef DFA_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

// Arrives on named barrier `id` (counted with `threads`) without waiting.
__device__ inline void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// 4-D TMA tile reduce-add (coordinates innermost first) of a shared-memory box into the global
// tensor of `tmap` (fp32 add; elements outside the tensor are skipped), in the calling thread's
// bulk group: the source may be rewritten after BulkWaitRead, the sums are visible after BulkWait.
__device__ inline void TmaReduceAdd4d(const void* tmap, const void* smem_src, int c0, int c1,
                                      int c2, int c3) {
#ifdef DFA_WGMMA
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)),
      "r"(SmemAddr(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

// Arrives on named barrier `id` (counted with `threads`) when `pred` is non-zero, as one
// predicated instruction (no branch: ptxas serialises wgmmas around divergent paths).
__device__ inline void NamedBarrierArriveIf(int id, int threads, int pred) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p bar.arrive %0, %1;\n}\n" ::"r"(id),
      "r"(threads), "r"(pred)
      : "memory");
}

__device__ inline void BulkCommit() {
#ifdef DFA_WGMMA
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Waits until every bulk group of this thread has read its source.
__device__ inline void BulkWaitRead() {
#ifdef DFA_WGMMA
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}
// Waits until at most kPending of this thread's newest bulk groups have not yet read their
// source (the older groups' sources may be rewritten).
template <int kPending>
__device__ inline void BulkWaitReadPending() {
#ifdef DFA_WGMMA
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#endif
}
// Waits until every bulk group of this thread has completed.
__device__ inline void BulkWait() {
#ifdef DFA_WGMMA
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}

}  // namespace dfa::cuda
