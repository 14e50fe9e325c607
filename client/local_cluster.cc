#include "client/local_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"

namespace dfa::client {
namespace fs = std::filesystem;

namespace {

// Binds 127.0.0.1:port to see whether it is free; returns the port (0 if port was 0: the
// kernel's pick) or -1 when taken.
int TryBind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  int result = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    result = ntohs(addr.sin_port);
  }
  close(fd);
  return result;
}

// First port of the kernel's ephemeral range (outgoing connections take their local ports
// from it, so a port picked there can be taken by any connection before the daemon binds it).
int EphemeralLow() {
  int low = 32768, high = 60999;
  if (FILE* f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    fclose(f);
  }
  return low;
}

bool LooksLikeLostPort(const absl::Status& s) {
  const std::string m(s.message());
  return m.find("listen") != std::string::npos || m.find("bind") != std::string::npos ||
         m.find("Address already in use") != std::string::npos;
}

}  // namespace

absl::StatusOr<int> LocalCluster::FreePort() {
  // A random free port below the ephemeral range; the kernel's pick as the fallback. A port is
  // handed out at most once per process: a daemon binds its port some time after the pick, and
  // a second pick of the same (still free) port for another daemon of the same cluster would
  // put two daemons on one address.
  static std::mutex mu;
  static std::set<int> given;
  static std::mt19937 rng(std::random_device{}());
  std::lock_guard<std::mutex> lock(mu);
  const int low = 10000, high = EphemeralLow();
  if (high - low > 1000) {
    std::uniform_int_distribution<int> pick(low, high - 1);
    for (int i = 0; i < 256; ++i) {
      const int candidate = pick(rng);
      if (given.count(candidate)) continue;
      const int p = TryBind(candidate);
      if (p > 0) {
        given.insert(p);
        return p;
      }
    }
  }
  for (int i = 0; i < 64; ++i) {
    const int p = TryBind(0);
    if (p <= 0) return absl::UnavailableError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(errno)));
    if (given.insert(p).second) return p;
  }
  return absl::UnavailableError("no free port on 127.0.0.1 that this process has not handed out");
}

namespace {

// True once something accepts TCP connections on 127.0.0.1:port. Used before the first gRPC
// call: a gRPC channel whose first attempts were refused reconnects only after its backoff.
bool PortAccepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

// The TLS flags dfa-coordinator and dfa-worker share (not the token: workers take none).
void AppendSecurityFlags(const RpcSecurityOptions& s, std::vector<std::string>* argv) {
  if (!s.tls()) return;
  argv->push_back(absl::StrCat("--tls_cert=", s.cert_file));
  argv->push_back(absl::StrCat("--tls_key=", s.key_file));
  argv->push_back(absl::StrCat("--tls_ca=", s.ca_file));
  if (!s.server_name.empty()) argv->push_back(absl::StrCat("--tls_server_name=", s.server_name));
}

}  // namespace

absl::StatusOr<std::string> LocalCluster::FindBinary(const std::string& bin_dir,
                                                     const std::string& component,
                                                     const std::string& name) {
  std::vector<fs::path> candidates;
  if (!bin_dir.empty()) {
    candidates.push_back(fs::path(bin_dir) / name);
    candidates.push_back(fs::path(bin_dir) / component / name);
  }
  if (const char* env = getenv("DFA_BIN_DIR"); env != nullptr && *env != '\0') {
    candidates.push_back(fs::path(env) / name);
    candidates.push_back(fs::path(env) / component / name);
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    candidates.push_back(dir / name);
    candidates.push_back(dir.parent_path() / component / name);
    candidates.push_back(dir.parent_path().parent_path() / component / name);
  }
  std::string tried;
  for (const auto& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c.string();
    absl::StrAppend(&tried, "\n  ", c.string());
  }
  return absl::NotFoundError(absl::StrCat(name, " not found (build it: cmake --build <dir> --target ",
                                          name, "); tried:", tried));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const LocalClusterOptions& options) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = StartOnce(options);
  for (int attempt = 1; attempt < 3 && !c.ok() && LooksLikeLostPort(c.status()); ++attempt) {
    c = StartOnce(options);
  }
  return c;
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::StartOnce(
    const LocalClusterOptions& options) {
  if (options.workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--workers must be >= 1, got ", options.workers));
  }
  // Bad TLS files or token: the caller's error, named here rather than in a daemon's log.
  RETURN_IF_ERROR(RpcSecurity::Load(options.security).status());
  std::unique_ptr<LocalCluster> c(new LocalCluster(options));
  ASSIGN_OR_RETURN(c->coordinator_bin_,
                   FindBinary(options.bin_dir, "coordinator", "dfa-coordinator"));
  ASSIGN_OR_RETURN(c->worker_bin_, FindBinary(options.bin_dir, "worker", "dfa-worker"));
  c->log_dir_ = options.log_dir;
  if (c->log_dir_.empty()) {
    const char* tmp = getenv("TMPDIR");
    std::string templ = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/dfa-cluster-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::UnavailableError(absl::StrCat("mkdtemp ", templ, ": ", std::strerror(errno)));
    }
    c->log_dir_ = templ;
  } else {
    std::error_code ec;
    fs::create_directories(c->log_dir_, ec);
  }
  absl::Status s = c->StartCoordinator();
  for (int i = 0; s.ok() && i < options.workers; ++i) s = c->StartWorker(i);
  if (s.ok()) s = c->WaitForWorkers(options.workers, options.start_timeout);
  if (!s.ok()) {
    (void)c->Stop();
    return s;
  }
  return c;
}

LocalCluster::~LocalCluster() { (void)Stop(); }

ClientOptions LocalCluster::client_options() const {
  ClientOptions co;
  co.coordinator = coordinator_.address;
  co.security = options_.security;
  return co;
}

absl::Status LocalCluster::StartCoordinator(int port) {
  if (port == 0) {
    ASSIGN_OR_RETURN(port, FreePort());
  }
  ASSIGN_OR_RETURN(coordinator_.metrics_port, FreePort());
  coordinator_.address = absl::StrCat("127.0.0.1:", port);
  std::vector<std::string> argv = {coordinator_bin_, absl::StrCat("--listen=", coordinator_.address),
                                   absl::StrCat("--metrics_port=", coordinator_.metrics_port)};
  AppendSecurityFlags(options_.security, &argv);
  if (!options_.security.auth_token.empty()) {
    // As a file readable by this user alone: a token on the command line is visible in ps.
    const std::string token_file = absl::StrCat(log_dir_, "/auth-token");
    const int fd = open(token_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("open ", token_file, ": ", std::strerror(errno)));
    }
    const std::string& token = options_.security.auth_token;
    const bool written = write(fd, token.data(), token.size()) == static_cast<ssize_t>(token.size());
    close(fd);
    if (!written) {
      return absl::UnavailableError(absl::StrCat("write ", token_file, ": ", std::strerror(errno)));
    }
    argv.push_back(absl::StrCat("--auth_token_file=", token_file));
  }
  for (const auto& a : options_.coordinator_args) argv.push_back(a);
  ASSIGN_OR_RETURN(coordinator_proc_,
                   ChildProcess::Start("dfa-coordinator", std::move(argv),
                                       absl::StrCat(log_dir_, "/coordinator.log")));
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  std::unique_ptr<Client> client;
  while (true) {
    if (!coordinator_proc_->Running()) {
      return absl::UnavailableError(absl::StrCat("dfa-coordinator exited during start. Log tail:\n",
                                                 coordinator_proc_->LogTail(15)));
    }
    if (client == nullptr && PortAccepts(port)) {
      ASSIGN_OR_RETURN(client, Client::Connect(client_options()));
    }
    if (client != nullptr && client->WaitForCoordinator(absl::Milliseconds(200)).ok()) {
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("dfa-coordinator not answering on ", coordinator_.address, " after ",
                       absl::FormatDuration(options_.start_timeout), ". Log tail:\n",
                       coordinator_proc_->LogTail(15)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// GPUs visible to this host: /dev/nvidia0, /dev/nvidia1, ... (0 where there are none).
static int CountLocalGpus() {
  int n = 0;
  while (std::filesystem::exists(absl::StrCat("/dev/nvidia", n))) ++n;
  return n;
}

absl::Status LocalCluster::StartWorker(int index) {
  ASSIGN_OR_RETURN(int port, FreePort());
  DaemonEndpoint ep;
  ASSIGN_OR_RETURN(ep.metrics_port, FreePort());
  ep.address = absl::StrCat("127.0.0.1:", port);
  const std::string id = absl::StrCat("worker-", index);
  std::vector<std::string> argv = {worker_bin_,
                                   absl::StrCat("--listen=", ep.address),
                                   absl::StrCat("--advertise=", ep.address),
                                   absl::StrCat("--coordinator=", coordinator_.address),
                                   absl::StrCat("--worker_id=", id),
                                   absl::StrCat("--backend=", options_.backend),
                                   absl::StrCat("--metrics_port=", ep.metrics_port)};
  if (options_.threads_per_worker > 0) {
    argv.push_back(absl::StrCat("--threads=", options_.threads_per_worker));
  }
  // GPU workers: one per GPU of this host, round robin (the device files tell how many).
  if (options_.backend != "cpu") {
    const int gpus = CountLocalGpus();
    if (gpus > 0) argv.push_back(absl::StrCat("--device=", index % gpus));
  }
  if (options_.memory_limit_bytes > 0) {
    argv.push_back(absl::StrCat("--memory_limit_bytes=", options_.memory_limit_bytes));
  } else if (options_.backend == "cpu") {
    // The workers share this host's memory: their default limits add up to the host's share.
    argv.push_back(absl::StrCat("--workers_per_host=", std::max(1, options_.workers)));
  }
  AppendSecurityFlags(options_.security, &argv);
  for (const auto& a : options_.worker_args) argv.push_back(a);
  ASSIGN_OR_RETURN(auto proc, ChildProcess::Start(absl::StrCat("dfa-worker ", id), std::move(argv),
                                                  absl::StrCat(log_dir_, "/", id, ".log")));
  worker_procs_.push_back(std::move(proc));
  workers_.push_back(ep);
  return absl::OkStatus();
}

absl::Status LocalCluster::WaitForWorkers(int n, absl::Duration timeout) {
  ClientOptions co = client_options();
  co.rpc_timeout = absl::Seconds(2);
  ASSIGN_OR_RETURN(auto client, Client::Connect(co));
  const absl::Time deadline = absl::Now() + timeout;
  int alive = 0;
  while (true) {
    for (auto& p : worker_procs_) {
      if (!p->Running()) {
        return absl::UnavailableError(absl::StrCat(p->name(), " exited during start. Log tail:\n",
                                                   p->LogTail(15)));
      }
    }
    if (!coordinator_proc_->Running()) {
      return absl::UnavailableError(absl::StrCat("dfa-coordinator exited. Log tail:\n",
                                                 coordinator_proc_->LogTail(15)));
    }
    auto list = client->ListWorkers();
    if (list.ok()) {
      alive = 0;
      for (const auto& w : list->workers()) alive += w.alive() ? 1 : 0;
      if (alive >= n) return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          alive, " of ", n, " workers registered after ", absl::FormatDuration(timeout),
          ". Last worker log tail:\n", worker_procs_.back()->LogTail(15)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status LocalCluster::AddWorker() {
  const int index = static_cast<int>(worker_procs_.size());
  RETURN_IF_ERROR(StartWorker(index));
  int live = 0;
  for (auto& p : worker_procs_) live += p->Running() ? 1 : 0;
  return WaitForWorkers(live, options_.start_timeout);
}

absl::Status LocalCluster::RestartCoordinator() {
  if (coordinator_proc_ == nullptr || stopped_) {
    return absl::FailedPreconditionError("RestartCoordinator: the cluster is not running");
  }
  const int port = std::stoi(coordinator_.address.substr(coordinator_.address.rfind(':') + 1));
  coordinator_proc_->Signal(SIGKILL);
  (void)coordinator_proc_->Stop(options_.stop_grace);  // reaps it; killed on purpose
  RETURN_IF_ERROR(StartCoordinator(port));
  int live = 0;
  for (auto& p : worker_procs_) live += p->Running() ? 1 : 0;
  return WaitForWorkers(live, options_.start_timeout);
}

absl::Status LocalCluster::Stop() {
  if (stopped_) return absl::OkStatus();
  stopped_ = true;
  absl::Status first;
  // Signal every daemon (workers first) so that they shut down in parallel, then wait for each.
  std::vector<bool> was_running;
  for (auto& p : worker_procs_) {
    was_running.push_back(p->Running());
    p->Signal(SIGTERM);
  }
  if (coordinator_proc_) coordinator_proc_->Signal(SIGTERM);
  for (size_t i = 0; i < worker_procs_.size(); ++i) {
    auto& p = worker_procs_[i];
    absl::Status s = p->Stop(options_.stop_grace);
    if (was_running[i] && first.ok()) first = s;  // a worker a test killed on purpose is no error
  }
  if (coordinator_proc_) {
    absl::Status s = coordinator_proc_->Stop(options_.stop_grace);
    if (first.ok()) first = s;
  }
  return first;
}

}  // namespace dfa::client
