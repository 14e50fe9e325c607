#include "worker/worker_daemon.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <functional>
#include <condition_variable>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "core/log.h"
#include "core/observability/metrics_http_server.h"
#include "core/observability/readiness.h"
#include "core/random_id.h"
#include "kernels/attention_backend.h"
#include "worker/cancellable_backend.h"
#include "worker/job_runner.h"
#include "worker/registrar.h"
#include "worker/session_registry.h"
#include "worker/transport/session_transport.h"
#include "worker/worker_metrics.h"
#include "worker/worker_service.h"
#ifdef DFA_HAVE_NCCL
#include "worker/gpu/device_memory_pool.h"
#include "worker/gpu/gpu_backend_factory.h"
#endif

namespace dfa {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;  // chunks up to 32 MiB plus framing

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// Splits "host:port" / "[v6]:port".
absl::Status SplitHostPort(const std::string& a, std::string* host, int* port) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("listen = '", a, "' is not host:port"));
  }
  *host = a.substr(0, colon);
  if (!absl::SimpleAtoi(a.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("listen = '", a, "': bad port"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> ParseBytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  int64_t n = 0;
  if (i == 0 || !absl::SimpleAtoi(text.substr(0, i), &n)) {
    return absl::InvalidArgumentError(absl::StrCat("memory_limit = '", text, "' is not a size"));
  }
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();
  int shift = 0;
  if (unit == "K") shift = 10;
  else if (unit == "M") shift = 20;
  else if (unit == "G") shift = 30;
  else if (unit == "T") shift = 40;
  else if (!unit.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("memory_limit = '", text, "': unknown unit"));
  }
  if (n > (int64_t{1} << (62 - shift))) {
    return absl::InvalidArgumentError(absl::StrCat("memory_limit = '", text, "' is too large"));
  }
  return n << shift;
}

absl::Status ParseDeviceMemoryLimit(const std::string& text, int64_t* bytes, double* fraction) {
  *bytes = 0;
  *fraction = 0;
  double f = 0;
  if (text.find('.') != std::string::npos || text == "1") {
    if (!absl::SimpleAtod(text, &f) || !(f > 0) || f > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_memory_limit = '", text,
          "': a fraction of the device's memory must be in (0, 1]; a size needs a unit (40G)"));
    }
    *fraction = f;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> n = ParseBytes(text);
  if (!n.ok() || *n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device_memory_limit = '", text,
        "' is neither a size (40G, 512M) nor a fraction of the device's memory (0.5)"));
  }
  *bytes = *n;
  return absl::OkStatus();
}

class WorkerDaemon::Impl {
 public:
  WorkerOptions options;
  std::string backend_name;  // resolved: cpu or cuda
  std::string address, advertised;
  std::string boot_id = RandomId("");
  int metrics_port = 0;
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<WorkerMetrics> metrics;
  // Before what holds their tickets (sessions; the server's reactors), so they outlive them.
  std::unique_ptr<SessionAdmission> admission;
  std::unique_ptr<StreamLimits> streams;
  std::unique_ptr<SessionRegistry> sessions;
  std::unique_ptr<JobRunner> jobs;
  std::unique_ptr<WorkerServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<Registrar> registrar;
  // After what the readiness check reads (the registrar), so that it stops first.
  MetricsHttpServer http;  // /metrics, /healthz, /readyz
  std::unique_ptr<GrpcHealthMirror> health;  // "dfa.v1.Worker" and "" follow readiness
  std::atomic<bool> accepting{false};  // from the end of Start until Shutdown begins
  // GPU workers: the device memory pool, reported (capacity, peak use) when the worker stops.
  std::function<std::string()> pool_report;
  std::string device_uuid;  // GPU workers: RegisterWorkerRequest.device_uuid

  std::mutex mu;
  std::condition_variable cv;
  bool shutting_down = false;
  bool shut_down = false;

  // "" when the worker can serve: standalone, or registered with its coordinator within the
  // lease of the coordinator's latest answer (Registrar::registered_until).
  std::string NotReadyReason() const {
    if (!accepting.load(std::memory_order_acquire)) {
      return "not serving (starting or shutting down)";
    }
    if (!registrar) return "";
    const absl::Time until = registrar->registered_until();
    const absl::Time now = absl::Now();
    if (now < until) return "";
    if (until == absl::InfinitePast()) {
      return absl::StrCat("not registered with the coordinator at ", options.coordinator);
    }
    return absl::StrCat("no answer from the coordinator at ", options.coordinator,
                        " within its lease (ran out ",
                        absl::FormatDuration(absl::Trunc(now - until, absl::Milliseconds(1))),
                        " ago)");
  }

  void Shutdown() {
    {
      std::unique_lock<std::mutex> l(mu);
      if (shutting_down) {
        cv.wait(l, [this] { return shut_down; });
        return;
      }
      shutting_down = true;
    }
    accepting.store(false, std::memory_order_release);
    if (health) health->Stop();
    if (registrar) registrar->Stop();
    // Jobs stop within one CancellableBackend piece (CPU) or transport wait; then in-flight
    // RPCs (uploads, downloads) get options.shutdown_grace before gRPC cancels them.
    if (jobs) jobs->CancelAll();
    if (server) {
      server->Shutdown(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.shutdown_grace));
      server->Wait();
    }
    if (sessions) sessions->CloseAll();
    if (pool_report) DFA_LOG(INFO) << pool_report();
    http.Stop();
    std::lock_guard<std::mutex> l(mu);
    shut_down = true;
    cv.notify_all();
  }
};

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Start(const WorkerOptions& o) {
  auto impl = std::make_unique<Impl>();
  impl->options = o;
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(o.listen, &host, &port));
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads = ", o.threads, " must be >= 0"));
  }
  if (o.memory_limit_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("memory_limit_bytes = ", o.memory_limit_bytes, " must be >= 0"));
  }
  if (o.workers_per_host < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("workers_per_host = ", o.workers_per_host, " must be >= 1"));
  }
  if (o.max_rpc_threads < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rpc_threads = ", o.max_rpc_threads, " must be >= 8"));
  }
  if (o.admission.max_sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sessions = ", o.admission.max_sessions, " must be >= 1"));
  }
  if (o.streams.max_streams < 1 || o.streams.max_streams_per_client < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_data_streams = ", o.streams.max_streams, " and max_data_streams_per_client = ",
        o.streams.max_streams_per_client, " must be >= 1"));
  }
  if (!(o.speed > 0) || o.speed > 1e6) {
    return absl::InvalidArgumentError(absl::StrCat("speed = ", o.speed, " must be > 0"));
  }
  if (o.step_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_tokens = ", o.step_tokens, " must be >= 1"));
  }
  if (o.metrics_port < -1 || o.metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port = ", o.metrics_port, " must be in [0, 65535]"));
  }
  // Resolve the backend once (also checks it can run here).
  BackendOptions bo;
  bo.num_threads = o.threads;
  bo.device = o.cuda_device;
  {
    auto probe = CreateBackend(o.backend, bo);
    if (!probe.ok()) {
      return absl::Status(probe.status().code(),
                          absl::StrCat("backend = '", o.backend, "': ", probe.status().message()));
    }
    impl->backend_name = std::string((*probe)->Name());
  }
  if (!o.device_memory_limit.empty()) {
    int64_t b = 0;
    double f = 0;
    RETURN_IF_ERROR(ParseDeviceMemoryLimit(o.device_memory_limit, &b, &f));
    if (impl->backend_name != "cuda" && impl->backend_name != "cudnn") {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_memory_limit = '", o.device_memory_limit, "' is for cuda or cudnn workers; ",
          "backend '", impl->backend_name, "' holds sessions in host memory (--memory_limit)"));
    }
  }
  int64_t limit =
      o.memory_limit_bytes > 0 ? o.memory_limit_bytes : DefaultMemoryLimit(o.workers_per_host);
  std::function<absl::StatusOr<std::unique_ptr<AttentionBackend>>()> make_backend =
      [name = impl->backend_name, bo]() { return CreateBackend(name, bo); };
#ifdef DFA_HAVE_NCCL
  if (impl->backend_name == "cuda" || impl->backend_name == "cudnn") {
    // Sessions of a GPU worker live in one device memory pool (worker/gpu/): no cudaMalloc or
    // cudaFree inside a job. Its size is the memory limit (default: free device memory).
    // --device_memory_limit (bytes or a fraction of the device) sizes it when given, so that
    // a training process can share the GPU.
    int64_t device_bytes = std::max<int64_t>(0, o.memory_limit_bytes);
    double device_fraction = 0;
    if (!o.device_memory_limit.empty()) {
      RETURN_IF_ERROR(
          ParseDeviceMemoryLimit(o.device_memory_limit, &device_bytes, &device_fraction));
    }
    auto pool_bytes = DevicePoolBytes(o.cuda_device, device_bytes, device_fraction);
    if (!pool_bytes.ok()) return pool_bytes.status();
    std::shared_ptr<DeviceMemoryPool> pool;
    auto factory = MakePooledCudaBackendFactory(bo, *pool_bytes, size_t{8} << 30, &pool,
                                                impl->backend_name);
    if (!factory.ok()) return factory.status();
    make_backend = *std::move(factory);
    auto uuid = DeviceUuid(o.cuda_device);
    if (!uuid.ok()) return uuid.status();
    impl->device_uuid = *std::move(uuid);
    limit = static_cast<int64_t>(pool->capacity());
    impl->pool_report = [pool] {
      return absl::StrCat("device memory pool capacity ", pool->capacity(),
                          " bytes, peak used ", pool->peak_used(), " bytes");
    };
  }
#endif
  impl->budget = std::make_unique<MemoryBudget>(limit);

  auto security = RpcSecurity::Load(o.security);
  if (!security.ok()) return security.status();
  // The channel to the coordinator carries the worker token, not a client's.
  auto registrar_security = (*security)->WithToken(o.worker_token, "--worker_token");
  if (!registrar_security.ok()) return registrar_security.status();

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(o.listen, (*security)->ServerCredentials(), &bound_port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // No SO_REUSEPORT: a second daemon on a port already in use fails to bind (and says so)
  // instead of sharing the port's connections with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Synchronous handlers take a thread each (RunJob for a job's length): beyond the cap gRPC
  // answers RESOURCE_EXHAUSTED ("Server Threadpool Exhausted") instead of starting threads.
  grpc::ResourceQuota quota("dfa-worker");
  quota.SetMaxThreads(o.max_rpc_threads);
  builder.SetResourceQuota(quota);

  // Metrics carry the worker id, which may depend on the bound port: they are attached to the
  // service right after binding, before anyone (coordinator, client) learns the address.
  std::string worker_id = o.worker_id;
  impl->sessions = std::make_unique<SessionRegistry>(
      impl->backend_name, o.cuda_device, impl->budget.get(), make_backend);
  if (o.threads > 0) {
    impl->sessions->set_cancel_piece_flops(CancellableBackend::kFlopsPerThreadPiece * o.threads);
  }
  impl->sessions->set_step_tokens(o.step_tokens);
  impl->jobs = std::make_unique<JobRunner>(impl->sessions.get(), nullptr, o.step_timeout);
  impl->service = std::make_unique<WorkerServiceImpl>(impl->sessions.get(), impl->jobs.get(),
                                                      impl->budget.get(), nullptr);
  impl->streams = std::make_unique<StreamLimits>(o.streams);
  impl->service->set_stream_limits(impl->streams.get());
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || bound_port == 0) {
    return absl::UnavailableError(absl::StrCat("listen = '", o.listen, "': cannot bind"));
  }
  // The descriptor baseline is what the listening daemon holds before any session.
  impl->admission = std::make_unique<SessionAdmission>(o.admission);
  impl->sessions->set_admission(impl->admission.get());
  // The coordinator checks that the process at our advertised address is us (and whether a
  // holder of our id is still alive) through this name: RegisterWorkerRequest.boot_id.
  impl->server->GetHealthCheckService()->SetServingStatus(WorkerBootHealthService(impl->boot_id),
                                                          true);
  // Ready (/readyz 200; gRPC health "dfa.v1.Worker" and "" SERVING) while NotReadyReason is
  // empty, so NOT_SERVING until Start has finished; the boot id's name stays SERVING regardless.
  {
    Impl* self = impl.get();
    impl->health = std::make_unique<GrpcHealthMirror>(
        impl->server->GetHealthCheckService(),
        std::vector<std::string>{v1::Worker::service_full_name(), ""},
        [self] { return self->NotReadyReason(); });
  }
  impl->address = absl::StrCat(host, ":", bound_port);
  if (!o.advertise.empty()) {
    impl->advertised = o.advertise;
  } else if (host == "0.0.0.0" || host == "[::]" || host == "::") {
    impl->advertised = absl::StrCat(HostName(), ":", bound_port);
  } else {
    impl->advertised = impl->address;
  }
  if (worker_id.empty()) worker_id = absl::StrCat("worker-", HostName(), "-", bound_port);
  impl->options.worker_id = worker_id;
  impl->metrics = std::make_unique<WorkerMetrics>(worker_id);
  impl->metrics->SetMemory(0, static_cast<double>(limit));
  impl->jobs->set_metrics(impl->metrics.get());
  impl->service->set_metrics(impl->metrics.get());
  if (o.metrics_port >= 0) {
    const std::string bind = absl::StrCat(host == "127.0.0.1" || host == "localhost"
                                              ? std::string("127.0.0.1")
                                              : std::string("0.0.0.0"),
                                          ":", o.metrics_port);
    Impl* self = impl.get();
    auto bound = impl->http.Start(bind, impl->metrics->registry(),
                                  [self] { return self->NotReadyReason(); });
    if (!bound.ok()) {
      impl->server->Shutdown();
      return absl::Status(bound.status().code(), absl::StrCat("metrics_port = ", o.metrics_port,
                                                              ": ", bound.status().message()));
    }
    impl->metrics_port = *bound;
  }
  if (!o.coordinator.empty()) {
    v1::RegisterWorkerRequest reg;
    reg.set_worker_id(worker_id);
    reg.set_address(impl->advertised);
    reg.set_host(HostName());
    // The coordinator places by device class ("cpu" or "cuda"); which GPU kernels run
    // (our own or cuDNN's) is this worker's business, reported in `device`.
    const bool gpu = impl->backend_name == "cuda" || impl->backend_name == "cudnn";
    reg.set_backend(gpu ? "cuda" : impl->backend_name);
    reg.set_device(gpu ? absl::StrCat("cuda:", o.cuda_device, " (", impl->backend_name, ")")
                       : std::string("cpu"));
    reg.set_memory_limit_bytes(limit);
    reg.set_speed(o.speed);
    reg.set_boot_id(impl->boot_id);
    reg.set_device_uuid(impl->device_uuid);
    for (const std::string& t : SupportedTransports(impl->backend_name)) reg.add_transports(t);
    MemoryBudget* budget = impl->budget.get();
    SessionRegistry* sessions = impl->sessions.get();
    WorkerServiceImpl* service = impl->service.get();
    impl->registrar = std::make_unique<Registrar>(
        o.coordinator, std::move(reg), [budget] { return budget->used(); },
        [sessions, service] {
          sessions->CloseAll();
          service->UpdateGauges();
        },
        *registrar_security);
    impl->registrar->Start();
  }
  impl->accepting.store(true, std::memory_order_release);  // the registrar is visible now
  return std::unique_ptr<WorkerDaemon>(new WorkerDaemon(std::move(impl)));
}

WorkerDaemon::WorkerDaemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerDaemon::~WorkerDaemon() { Shutdown(); }
void WorkerDaemon::Shutdown() { impl_->Shutdown(); }
void WorkerDaemon::Wait() {
  std::unique_lock<std::mutex> l(impl_->mu);
  impl_->cv.wait(l, [this] { return impl_->shut_down; });
}
const std::string& WorkerDaemon::worker_id() const { return impl_->options.worker_id; }
const std::string& WorkerDaemon::boot_id() const { return impl_->boot_id; }
const std::string& WorkerDaemon::address() const { return impl_->address; }
const std::string& WorkerDaemon::advertised_address() const { return impl_->advertised; }
int WorkerDaemon::metrics_port() const { return impl_->metrics_port; }
int64_t WorkerDaemon::memory_limit_bytes() const { return impl_->budget->limit(); }

}  // namespace dfa
