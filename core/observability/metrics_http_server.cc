#include "core/observability/metrics_http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "CivetServer.h"
#include "absl/strings/str_cat.h"
#include "civetweb.h"
#include "core/observability/process_metrics.h"

namespace dfa {
namespace {

// civetweb calls begin_request with a connection only; the server a connection belongs to is
// found by its civetweb context, recorded when the context is created (init_context runs inside
// the Exposer's constructor, on the thread that constructs it).
std::mutex routes_mu;
std::map<const mg_context*, const MetricsHttpServer*>& Routes() {
  static auto* routes = new std::map<const mg_context*, const MetricsHttpServer*>;
  return *routes;
}
thread_local const MetricsHttpServer* starting = nullptr;
thread_local const mg_context* started_context = nullptr;

void InitContext(const mg_context* ctx) {
  if (starting == nullptr) return;
  std::lock_guard<std::mutex> l(routes_mu);
  Routes()[ctx] = starting;
  started_context = ctx;
}

void Unroute(const MetricsHttpServer* server) {
  std::lock_guard<std::mutex> l(routes_mu);
  for (auto it = Routes().begin(); it != Routes().end();) {
    it = it->second == server ? Routes().erase(it) : std::next(it);
  }
}

void Reply(mg_connection* conn, bool head, int status, const std::string& body) {
  const char* reason = status == 200 ? "OK" : status == 503 ? "Service Unavailable" : "Error";
  const std::string text = body + "\n";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Cache-Control: no-store\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
            status, reason, text.size());
  if (!head) mg_write(conn, text.data(), text.size());
}

int BeginRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const bool healthz = std::strcmp(info->local_uri, "/healthz") == 0;
  const bool readyz = std::strcmp(info->local_uri, "/readyz") == 0;
  if (!healthz && !readyz) return 0;  // /metrics and the rest: the Exposer's handlers
  const MetricsHttpServer* server = nullptr;
  {
    std::lock_guard<std::mutex> l(routes_mu);
    auto it = Routes().find(mg_get_context(conn));
    if (it != Routes().end()) server = it->second;
  }
  if (server == nullptr) return 0;
  const bool head =
      info->request_method != nullptr && std::strcmp(info->request_method, "HEAD") == 0;
  if (!head && (info->request_method == nullptr || std::strcmp(info->request_method, "GET") != 0)) {
    Reply(conn, false, 405, "method not allowed: use GET or HEAD");
    return 405;
  }
  if (healthz) {
    Reply(conn, head, 200, "ok");
    return 200;
  }
  const MetricsHttpServer::Answer answer = server->Readyz();
  Reply(conn, head, answer.status, answer.body);
  return answer.status;
}

// Opens and closes one TCP connection to 127.0.0.1:port (errors ignored).
void Poke(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  close(fd);
}

}  // namespace

MetricsHttpServer::MetricsHttpServer()
    : common_(std::make_shared<prometheus::Registry>()),
      process_(std::make_shared<ProcessCollector>()) {
  AddBuildInfo(*common_);
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<int> MetricsHttpServer::Start(const std::string& bind_address,
                                             std::shared_ptr<prometheus::Registry> registry,
                                             ReadinessCheck ready) {
  if (exposer_) {
    return absl::FailedPreconditionError(absl::StrCat("metrics: already serving on port ", port_));
  }
  registry_ = std::move(registry);
  ready_ = std::move(ready);
  CivetCallbacks callbacks;  // zeroed by its constructor
  callbacks.begin_request = BeginRequest;
  callbacks.init_context = InitContext;
  starting = this;
  started_context = nullptr;
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(bind_address, 2, &callbacks);
  } catch (const std::exception& e) {  // civetweb reports bind errors by throwing
    starting = nullptr;
    Unroute(this);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", bind_address, ": ", e.what()));
  }
  starting = nullptr;
  if (started_context == nullptr) {  // no route: /healthz and /readyz would be 404
    exposer_.reset();
    return absl::InternalError("metrics: civetweb did not report its context (init_context)");
  }
  exposer_->RegisterCollectable(common_);
  exposer_->RegisterCollectable(process_);
  if (registry_) exposer_->RegisterCollectable(registry_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  port_ = ports.empty() ? 0 : ports.front();
  return port_;
}

MetricsHttpServer::Answer MetricsHttpServer::Readyz() const {
  const std::string reason = ready_ ? ready_() : std::string();
  if (reason.empty()) return {200, "ready"};
  return {503, absl::StrCat("not ready: ", reason)};
}

void MetricsHttpServer::Stop() {
  if (!exposer_) return;
  // civetweb's listener notices the stop flag only when its poll() returns (a timeout of a
  // second or two); a connection wakes it at once, so poke it while it stops.
  std::atomic<bool> stopped{false};
  std::thread poker([&] {
    while (!stopped) {
      Poke(port_);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  exposer_.reset();  // joins civetweb's threads: no request is being answered after this
  stopped = true;
  poker.join();
  Unroute(this);
}

}  // namespace dfa
