// CUDA IPC between two processes of this host: the helper cuda_ipc_peer plays a client owning
// a CUDA tensor; this test plays the worker, which maps it and copies device to device.
#include "core/gpu/cuda_ipc.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/gpu/service/gpu_test_util.h"

extern char** environ;

namespace dfa {
namespace {

// The helper binary: beside this test's executable (builds carried to another machine), else
// where the build put it.
std::string PeerPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) {
    std::string self(buf, n);
    std::string beside = self.substr(0, self.rfind('/') + 1) + "cuda_ipc_peer";
    if (access(beside.c_str(), X_OK) == 0) return beside;
  }
  return DFA_CUDA_IPC_PEER;
}

// The helper process, with a line-based pipe both ways.
class Peer {
 public:
  Peer(int device, size_t bytes, int value) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    posix_spawn_file_actions_addclose(&fa, to_child[1]);
    posix_spawn_file_actions_addclose(&fa, from_child[0]);
    std::string dev = std::to_string(device), n = std::to_string(bytes), v = std::to_string(value);
    std::string path = PeerPath();
    char* argv[] = {path.data(), dev.data(), n.data(), v.data(), nullptr};
    if (posix_spawn(&pid_, path.c_str(), &fa, nullptr, argv, environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
    close(to_child[0]);
    close(from_child[1]);
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
  }
  ~Peer() {
    if (in_) {
      std::fputs("quit\n", in_);
      std::fclose(in_);
    }
    if (out_) std::fclose(out_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  bool started() const { return pid_ > 0 && in_ && out_; }
  std::string ReadLine() {
    char buf[512];
    if (!std::fgets(buf, sizeof(buf), out_)) return "";
    std::string s(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    return s;
  }
  void Send(const std::string& line) {
    std::fputs((line + "\n").c_str(), in_);
    std::fflush(in_);
  }

 private:
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
};

bool ParseExport(const std::string& line, std::string* handle, int64_t* offset) {
  auto space = line.find(' ');
  if (space != 128) return false;
  handle->clear();
  for (size_t i = 0; i < 128; i += 2) {
    handle->push_back(static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16)));
  }
  return absl::SimpleAtoi(line.substr(space + 1), offset);
}

void RoundTrip(int peer_device, int my_device) {
  constexpr size_t kBytes = 3 << 20;
  Peer peer(peer_device, kBytes, 0x5a);
  ASSERT_TRUE(peer.started());
  std::string handle;
  int64_t offset = 0;
  const std::string line = peer.ReadLine();
  ASSERT_TRUE(ParseExport(line, &handle, &offset)) << "peer said: " << line;
  EXPECT_EQ(offset, 4096);

  ASSERT_EQ(cudaSetDevice(my_device), cudaSuccess);
  CudaIpcImporter importer(my_device);
  void* local = nullptr;
  ASSERT_EQ(cudaMalloc(&local, kBytes), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  // Client -> worker (upload).
  ASSERT_TRUE(importer.Copy(handle, offset, local, kBytes, /*to_local=*/true, s).ok());
  std::vector<uint8_t> host(kBytes);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), local, kBytes, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host.front(), 0x5a);
  EXPECT_EQ(host.back(), 0x5a);
  // Worker -> client (download), through the cached mapping.
  ASSERT_EQ(cudaMemsetAsync(local, 0x33, kBytes, s), cudaSuccess);
  ASSERT_TRUE(importer.Copy(handle, offset, local, kBytes, /*to_local=*/false, s).ok());
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  peer.Send(absl::StrCat("check ", 0x33));
  EXPECT_EQ(peer.ReadLine(), "ok");
  // A range past the exported allocation is refused, naming the range.
  auto bad = importer.Map(handle, offset, size_t{1} << 40);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_EQ(importer.Map("short", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  cudaStreamDestroy(s);
  cudaFree(local);
}

TEST(CudaIpcTest, SameDeviceUploadAndDownload) {
  SKIP_UNLESS_GPUS(1);
  RoundTrip(0, 0);
}

TEST(CudaIpcTest, PeerDeviceUploadAndDownload) {
  SKIP_UNLESS_GPUS(2);
  RoundTrip(1, 0);
}

TEST(CudaIpcTest, HostPointerCannotBeExported) {
  SKIP_UNLESS_GPUS(1);
  std::vector<char> host(64);
  EXPECT_FALSE(ExportCudaIpc(host.data()).ok());
}

}  // namespace
}  // namespace dfa
