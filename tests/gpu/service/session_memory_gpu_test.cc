// On one GPU: a causal session's forward and backward through PooledBackend (the worker's
// device pool, the cudnn backend a cudnn worker runs) peak at the bytes admission charges
// (core/planner/worker_memory.h WorkerMemory::peak), within 2% -- the pool's own 256-byte
// rounding is all that differs. 32 heads x 128, bf16, P = 1 (balanced: one causal unit, the
// chunked backward) at 64K tokens in key chunks of 16K, and at the default chunk. Prints the
// figure per token. Skips without a GPU.
#include <cuda_runtime.h>

#include <cstdio>

#include "core/planner/plan_checker.h"
#include "core/planner/planner.h"
#include "core/planner/worker_memory.h"
#include "gtest/gtest.h"
#include "worker/executor/plan_executor.h"
#include "worker/gpu/device_memory_pool.h"
#include "worker/gpu/pooled_backend.h"
#include "worker/transport/inproc_transport.h"

namespace dfa {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(SessionMemoryGpuTest, PoolPeakIsTheCharge) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU";
  const int64_t S = 65536;
  const AttentionShape shape{1, 32, 32, 128, DType::kBF16};
  absl::StatusOr<Plan> plan = MakePlan({"balanced", 1, S, true, {}});
  ASSERT_TRUE(plan.ok()) << plan.status();
  CheckOptions check;
  check.shape = shape;
  absl::StatusOr<CheckReport> report = CheckPlan(*plan, check);
  ASSERT_TRUE(report.ok());
  for (int64_t step : {int64_t{16384}, kDefaultStepTokens}) {
    absl::StatusOr<WorkerMemory> m = PlanWorkerMemory(*plan, 0, shape, *report, step);
    ASSERT_TRUE(m.ok());
    absl::StatusOr<std::unique_ptr<DeviceMemoryPool>> pool =
        DeviceMemoryPool::Create(0, static_cast<size_t>(m->peak()) + (size_t{1} << 30));
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::shared_ptr<DeviceMemoryPool> shared = std::move(*pool);
    BackendOptions bo;
    bo.scratch = PoolScratchAllocator(shared);
    absl::StatusOr<std::unique_ptr<AttentionBackend>> inner = CreateBackend("cudnn", bo);
    if (!inner.ok()) inner = CreateBackend("cuda", bo);
    ASSERT_TRUE(inner.ok()) << inner.status();
    PooledBackend backend(std::move(*inner), shared);
    {
      absl::StatusOr<std::unique_ptr<SessionStorage>> st =
          SessionStorage::Create(&backend, shape, plan->workers[0].owned, m->layout);
      ASSERT_TRUE(st.ok()) << st.status();
      EXPECT_EQ((*st)->bytes(), m->storage.total);
      absl::StatusOr<std::shared_ptr<InprocHub>> hub = CreateInprocHub(1);
      ASSERT_TRUE(hub.ok());
      absl::StatusOr<std::unique_ptr<Transport>> t = CreateInprocTransport(*hub, 0);
      ASSERT_TRUE(t.ok());
      ExecutorOptions eo;
      eo.step_tokens = step;
      PlanExecutor ex(&backend, t->get(), st->get(), eo);
      ASSERT_TRUE(ex.RunForward(*plan).ok());
      ASSERT_TRUE(ex.RunBackward(*plan).ok());
      ASSERT_TRUE(backend.Synchronize(nullptr).ok());
    }
    const double peak = static_cast<double>(shared->peak_used());
    std::printf("S %lld step %lld: pool peak %.3f GB = %.2f KB per token; charged %.3f GB "
                "(%.2f KB per token)\n",
                static_cast<long long>(S), static_cast<long long>(step), peak / 1e9,
                peak / S / 1024, m->peak() / 1e9, m->peak() / 1024.0 / S);
    EXPECT_LE(peak, m->peak() * 1.02);
    EXPECT_GE(peak, m->peak() * 0.98);
  }
}

}  // namespace
}  // namespace dfa
