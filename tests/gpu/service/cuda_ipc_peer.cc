// Helper process for cuda_ipc_test: plays the client that owns a CUDA tensor.
//   cuda_ipc_peer DEVICE BYTES VALUE
// Allocates BYTES on DEVICE inside a larger allocation (so the offset is non-zero), fills them
// with VALUE, prints "<handle hex> <offset>" and waits for a line on stdin: "check V" verifies
// that every byte now equals V and prints "ok" or "bad"; "quit" exits.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/gpu/cuda_ipc.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: cuda_ipc_peer DEVICE BYTES VALUE\n");
    return 2;
  }
  const int device = std::atoi(argv[1]);
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  const int value = std::atoi(argv[3]);
  constexpr size_t kOffset = 4096;
  if (cudaSetDevice(device) != cudaSuccess) return 3;
  void* mem = nullptr;
  if (cudaMalloc(&mem, bytes + 2 * kOffset) != cudaSuccess) return 3;
  char* base = static_cast<char*>(mem);
  cudaMemset(base, 0, bytes + 2 * kOffset);
  cudaMemset(base + kOffset, value, bytes);
  cudaDeviceSynchronize();
  auto exported = dfa::ExportCudaIpc(base + kOffset);
  if (!exported.ok()) {
    std::fprintf(stderr, "%s\n", std::string(exported.status().message()).c_str());
    return 4;
  }
  for (unsigned char c : exported->handle) std::printf("%02x", c);
  std::printf(" %lld\n", static_cast<long long>(exported->offset));
  std::fflush(stdout);
  std::string cmd;
  while (std::cin >> cmd) {
    if (cmd == "quit") break;
    if (cmd == "check") {
      int v = 0;
      std::cin >> v;
      std::vector<unsigned char> host(bytes);
      cudaMemcpy(host.data(), base + kOffset, bytes, cudaMemcpyDeviceToHost);
      bool ok = true;
      for (unsigned char c : host) ok &= (c == v);
      std::printf("%s\n", ok ? "ok" : "bad");
      std::fflush(stdout);
    }
  }
  cudaFree(base);
  return 0;
}
