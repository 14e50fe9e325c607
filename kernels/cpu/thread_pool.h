// A small fixed pool of worker threads for the CPU kernels.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dfa::cpu {

class ThreadPool {
 public:
  // `num_threads` counts the calling thread: a pool of 1 starts no threads. 0 means the CPUs
  // this process may use (UsableCpus(), core/host_limits.h: affinity and cgroup CPU limit).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Runs fn(task, thread) for every task in [0, num_tasks), handing tasks out dynamically in
  // increasing order; `thread` in [0, size()) identifies the running thread (the caller is 0),
  // so fn may use per-thread scratch. Returns when all tasks are done. One caller at a time.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t, int)>& fn);

 private:
  void WorkerLoop(int thread);
  void RunTasks(int thread);

  int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  int busy_ = 0;             // workers still in the current job, guarded by mu_
  bool stop_ = false;        // guarded by mu_
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace dfa::cpu
