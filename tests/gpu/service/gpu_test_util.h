// Helpers for tests that need GPUs: they skip cleanly (GTEST_SKIP) on machines without them.
#pragma once

#include <cuda_runtime_api.h>

inline int VisibleGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

#define SKIP_UNLESS_GPUS(n)                                                        \
  do {                                                                             \
    const int have_ = VisibleGpus();                                               \
    if (have_ < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, found " << have_; \
  } while (0)
