// Client data-plane rates on the GPU machine: the same tensor moved to/from the session's cuda
// workers by CUDA IPC from this process's GPU 0 (UploadDevice / DownloadDevice) against the host
// paths (shared memory, gRPC) from host memory. Prints figures (best of N); not a test.
//   dfa-device-ipc-bench [seq_len=262144] [repeat=3] [heads=32] [head_dim=128]
// Starts a coordinator and one cuda worker per GPU (up to 2) from the directory of this program
// (or the build tree), like device_ipc_service_test.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "client/cuda_tensor_io.h"
#include "client/local_cluster.h"

namespace dfa {
namespace {

std::string SiblingBinDir() {
  std::error_code ec;
  const auto dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  return !ec && std::filesystem::exists(dir / "dfa-worker") ? dir.string() : "";
}

// Best seconds of `repeat` runs of fn (which returns the seconds it measured).
absl::StatusOr<double> Best(int repeat, const std::function<absl::StatusOr<double>()>& fn) {
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    ASSIGN_OR_RETURN(const double s, fn());
    best = std::min(best, s);
  }
  return best;
}

absl::Status Run(int64_t seq, int repeat, int heads, int head_dim) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    return absl::UnavailableError("no GPU visible");
  }
  client::LocalClusterOptions o;
  o.backend = "cuda";
  o.workers = std::min(2, gpus);
  o.threads_per_worker = 0;
  o.bin_dir = SiblingBinDir();
  o.start_timeout = absl::Seconds(60);
  ASSIGN_OR_RETURN(auto cluster, client::LocalCluster::Start(o));
  ASSIGN_OR_RETURN(auto c, client::Client::Connect(cluster->client_options()));
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_seq_len(seq);
  spec.set_q_heads(heads);
  spec.set_kv_heads(heads);
  spec.set_head_dim(head_dim);
  spec.set_causal(true);
  spec.set_dtype(v1::DTYPE_BF16);
  client::SessionOptions so;
  so.spec = spec;
  ASSIGN_OR_RETURN(auto s, c->CreateSession(so));
  ASSIGN_OR_RETURN(client::HostTensor host, client::MakeTensor(spec, v1::TENSOR_Q));
  client::FillRandom(1, &host);
  const size_t bytes = host.bytes.size();
  void* dev = nullptr;
  if (cudaSetDevice(0) != cudaSuccess || cudaMalloc(&dev, bytes) != cudaSuccess ||
      cudaMemcpy(dev, host.bytes.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::InternalError("cannot allocate the client's device tensor");
  }
  const client::DeviceTensor t =
      client::DeviceTensor::Dense(dev, DType::kBF16, {1, seq, heads, head_dim});
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("dfa-device-ipc-bench: %d cuda worker(s), Q = %.2f GB (S=%lld, H=%d, D=%d, bf16)\n",
              o.workers, gb, static_cast<long long>(seq), heads, head_dim);
  auto report = [&](const char* what, absl::StatusOr<double> sec) {
    if (sec.ok()) {
      std::printf("  %-34s %8.3f s  %7.2f GB/s\n", what, *sec, gb / *sec);
    } else {
      std::printf("  %-34s failed: %s\n", what, std::string(sec.status().message()).c_str());
    }
  };
  auto timed = [](absl::StatusOr<client::TransferStats> st) -> absl::StatusOr<double> {
    if (!st.ok()) return st.status();
    return st->seconds;
  };
  report("upload Q   cuda ipc (device->device)",
         Best(repeat, [&] { return timed(client::UploadDevice(*s, v1::TENSOR_Q, t)); }));
  client::TransferOptions shm, grpc;
  shm.path = client::TransferPath::kSharedMemory;
  grpc.path = client::TransferPath::kGrpc;
  report("upload Q   shared memory (host)",
         Best(repeat, [&] { return timed(s->Upload(v1::TENSOR_Q, host, shm)); }));
  report("upload Q   gRPC (host)",
         Best(repeat, [&] { return timed(s->Upload(v1::TENSOR_Q, host, grpc)); }));
  RETURN_IF_ERROR(s->GenerateInputs(7, false));
  RETURN_IF_ERROR(s->Run(v1::JOB_FORWARD).status());
  report("download O cuda ipc (device->device)",
         Best(repeat, [&] { return timed(client::DownloadDevice(*s, v1::TENSOR_O, t)); }));
  client::HostTensor out;
  report("download O shared memory (host)",
         Best(repeat, [&] { return timed(s->Download(v1::TENSOR_O, &out, shm)); }));
  report("download O gRPC (host)",
         Best(repeat, [&] { return timed(s->Download(v1::TENSOR_O, &out, grpc)); }));
  const absl::Status released = s->Release();  // the workers unmap it; then free
  cudaFree(dev);
  return released;
}

}  // namespace
}  // namespace dfa

int main(int argc, char** argv) {
  const int64_t seq = argc > 1 ? std::atoll(argv[1]) : 262144;
  const int repeat = argc > 2 ? std::atoi(argv[2]) : 3;
  const int heads = argc > 3 ? std::atoi(argv[3]) : 32;
  const int head_dim = argc > 4 ? std::atoi(argv[4]) : 128;
  const absl::Status st = dfa::Run(seq, std::max(1, repeat), heads, head_dim);
  if (!st.ok()) {
    std::fprintf(stderr, "dfa-device-ipc-bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
