#include "worker/worker_metrics.h"

#include "dfa/v1/worker.pb.h"
#include "google/protobuf/descriptor.h"

namespace dfa {
namespace {

// Step times from 100 µs to ~100 s.
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3, 10, 30, 100};
}

}  // namespace

WorkerMetrics::WorkerMetrics(std::string worker_id)
    : worker_(std::move(worker_id)),
      registry_(std::make_shared<prometheus::Registry>()),
      busy_(prometheus::BuildHistogram()
                .Name("dfa_worker_step_busy_seconds")
                .Help("Per plan step: time the worker computed")
                .Register(*registry_)),
      idle_(prometheus::BuildHistogram()
                .Name("dfa_worker_step_idle_seconds")
                .Help("Per plan step: time the worker waited for data")
                .Register(*registry_)),
      flops_(prometheus::BuildCounter()
                 .Name("dfa_worker_attention_flops_total")
                 .Help("Attention FLOPs computed (forward 4*B*H*S^2*D, halved when causal)")
                 .Register(*registry_)),
      launches_(prometheus::BuildCounter()
                    .Name("dfa_worker_kernel_launches_total")
                    .Help("Attention backend calls by op")
                    .Register(*registry_)),
      sent_(prometheus::BuildCounter()
                .Name("dfa_transport_sent_bytes_total")
                .Help("Worker-to-worker bytes sent")
                .Register(*registry_)),
      received_(prometheus::BuildCounter()
                    .Name("dfa_transport_received_bytes_total")
                    .Help("Worker-to-worker bytes received")
                    .Register(*registry_)),
      client_bytes_(prometheus::BuildCounter()
                        .Name("dfa_worker_client_bytes_total")
                        .Help("Client data plane bytes")
                        .Register(*registry_)),
      sessions_(prometheus::BuildGauge()
                    .Name("dfa_worker_sessions")
                    .Help("Sessions open on the worker")
                    .Register(*registry_)
                    .Add({{"worker", worker_}})),
      memory_used_(prometheus::BuildGauge()
                       .Name("dfa_worker_memory_used_bytes")
                       .Help("Bytes held by sessions")
                       .Register(*registry_)
                       .Add({{"worker", worker_}})),
      memory_limit_(prometheus::BuildGauge()
                        .Name("dfa_worker_memory_limit_bytes")
                        .Help("The worker's configured session memory limit")
                        .Register(*registry_)
                        .Add({{"worker", worker_}})),
      grpc_errors_(prometheus::BuildCounter()
                       .Name("dfa_grpc_errors_total")
                       .Help("RPCs answered with a non-OK status")
                       .Register(*registry_)),
      requests_(prometheus::BuildCounter()
                    .Name("dfa_worker_requests_total")
                    .Help("RPCs the worker answered, by method and status code")
                    .Register(*registry_)) {
  // Every method's OK series exists from the start, so that error ratios have a denominator.
  const google::protobuf::ServiceDescriptor* service =
      v1::OpenSessionRequest::descriptor()->file()->FindServiceByName("Worker");
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    requests_.Add(
        {{"worker", worker_}, {"rpc", std::string(service->method(i)->name())}, {"code", "OK"}});
  }
  // Series that dashboards query exist from the start (at zero).
  for (const char* kind : {"forward", "backward"}) {
    busy_.Add({{"worker", worker_}, {"kind", kind}}, StepBuckets());
    idle_.Add({{"worker", worker_}, {"kind", kind}}, StepBuckets());
    flops_.Add({{"worker", worker_}, {"kind", kind}});
  }
  for (const char* op : {"forward", "backward", "merge", "delta"}) {
    launches_.Add({{"worker", worker_}, {"op", op}});
  }
  for (const char* dir : {"upload", "download"}) {
    for (const char* path : {"grpc", "shm"}) {
      client_bytes_.Add({{"worker", worker_}, {"direction", dir}, {"path", path}});
    }
  }
}

void WorkerMetrics::ObserveStep(const std::string& kind, double busy, double idle) {
  busy_.Add({{"worker", worker_}, {"kind", kind}}, StepBuckets()).Observe(busy);
  idle_.Add({{"worker", worker_}, {"kind", kind}}, StepBuckets()).Observe(idle);
}

void WorkerMetrics::AddFlops(const std::string& kind, double flops) {
  flops_.Add({{"worker", worker_}, {"kind", kind}}).Increment(flops);
}

void WorkerMetrics::AddLaunches(const std::string& op, double n) {
  launches_.Add({{"worker", worker_}, {"op", op}}).Increment(n);
}

void WorkerMetrics::AddTransportBytes(const std::string& transport, int peer, double sent,
                                      double received) {
  const prometheus::Labels labels = {
      {"worker", worker_}, {"transport", transport}, {"peer", std::to_string(peer)}};
  if (sent > 0) sent_.Add(labels).Increment(sent);
  if (received > 0) received_.Add(labels).Increment(received);
}

void WorkerMetrics::AddClientBytes(const std::string& direction, const std::string& path,
                                   double bytes) {
  client_bytes_.Add({{"worker", worker_}, {"direction", direction}, {"path", path}})
      .Increment(bytes);
}

void WorkerMetrics::SetSessions(int n) { sessions_.Set(n); }

void WorkerMetrics::SetMemory(double used, double limit) {
  memory_used_.Set(used);
  memory_limit_.Set(limit);
}

void WorkerMetrics::CountGrpcError(const std::string& method, const std::string& code) {
  grpc_errors_.Add({{"component", "worker"}, {"method", method}, {"code", code}}).Increment();
}

void WorkerMetrics::CountRequest(const std::string& method, const std::string& code) {
  requests_.Add({{"worker", worker_}, {"rpc", method}, {"code", code}}).Increment();
}

}  // namespace dfa
