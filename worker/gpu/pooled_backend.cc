#include "worker/gpu/pooled_backend.h"

#include <cuda_runtime_api.h>

namespace dfa {

void PooledBackend::Free(void* p) {
  if (p == nullptr) return;
  // Like cudaFree: no queued work may still touch the block once it can be handed out again.
  cudaSetDevice(pool_->device());
  cudaDeviceSynchronize();
  (void)pool_->Free(p);
}

}  // namespace dfa
