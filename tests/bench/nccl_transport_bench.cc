// Bandwidth and per-step latency of NcclTransport between the GPUs of this host: every rank
// exchanges one message with its ring neighbours (both directions at once) per step, steps
// chained through the compute stream with no host synchronisation, as the executor does.
//   dfa-nccl-transport-bench [ranks=all GPUs] [steps=20]
// Prints, per message size: GB/s each way per rank and microseconds per step.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/gpu/nccl_transport.h"

int main(int argc, char** argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    std::printf("dfa-nccl-transport-bench: no GPU\n");
    return 0;
  }
  const int ranks = argc > 1 ? std::atoi(argv[1]) : gpus;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  if (ranks < 2) {
    std::printf("dfa-nccl-transport-bench: needs 2 ranks\n");
    return 0;
  }
  auto id = dfa::NewNcclUniqueId();
  if (!id.ok()) {
    std::fprintf(stderr, "%s\n", std::string(id.status().message()).c_str());
    return 1;
  }
  const std::vector<size_t> sizes = {size_t{1} << 10, size_t{1} << 20, size_t{16} << 20,
                                     size_t{128} << 20, size_t{256} << 20, size_t{1} << 30};
  std::vector<std::vector<double>> seconds(ranks, std::vector<double>(sizes.size()));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      dfa::NcclTransportOptions o;
      o.device = r % gpus;
      o.rank = r;
      o.size = ranks;
      o.unique_id = *id;
      auto t = dfa::NcclTransport::Create(o);
      if (!t.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, std::string(t.status().message()).c_str());
        std::exit(1);
      }
      cudaStream_t s;
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      const size_t max = sizes.back();
      void *a, *b, *c, *d;
      cudaMalloc(&a, max);
      cudaMalloc(&b, max);
      cudaMalloc(&c, max);
      cudaMalloc(&d, max);
      const int next = (r + 1) % ranks, prev = (r + ranks - 1) % ranks;
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      for (size_t i = 0; i < sizes.size(); ++i) {
        const size_t n = sizes[i];
        auto step = [&](int k) {
          dfa::TransportMessage sends[2] = {{next, k % 2 ? a : b, n}, {prev, k % 2 ? b : a, n}};
          dfa::TransportMessage recvs[2] = {{prev, k % 2 ? c : d, n}, {next, k % 2 ? d : c, n}};
          auto g = (*t)->Post({sends, ranks > 2 ? 2u : 1u}, {recvs, ranks > 2 ? 2u : 1u}, s);
          if (!g.ok() || !(*g)->Wait(s, absl::Seconds(60)).ok()) std::exit(1);
        };
        for (int k = 0; k < 3; ++k) step(k);
        cudaEventRecord(e0, s);
        for (int k = 0; k < steps; ++k) step(k);
        cudaEventRecord(e1, s);
        if (!(*t)->Drain(absl::Seconds(120)).ok()) std::exit(1);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        seconds[r][i] = ms / 1e3 / steps;
      }
      cudaFree(a);
      cudaFree(b);
      cudaFree(c);
      cudaFree(d);
      cudaStreamDestroy(s);
    });
  }
  for (auto& th : threads) th.join();
  std::printf("NcclTransport ring exchange, %d ranks on %d GPUs, %d steps each\n", ranks, gpus,
              steps);
  std::printf("%12s %14s %14s\n", "bytes", "GB/s each way", "us per step");
  for (size_t i = 0; i < sizes.size(); ++i) {
    double worst = 0;
    for (int r = 0; r < ranks; ++r) worst = std::max(worst, seconds[r][i]);
    std::printf("%12zu %14.1f %14.1f\n", sizes[i], sizes[i] / worst / 1e9, worst * 1e6);
  }
  return 0;
}
