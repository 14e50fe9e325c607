#include "coordinator/coordinator_metrics.h"

#include "core/job_labels.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/support/status_code_enum.h"

namespace dfa {
namespace {

const char* CodeName(int code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  return code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
}

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100, 300, 1000};
  return *kBuckets;
}

// Control-plane time per job: 0.1 ms (a warm loopback round trip) to 1 s.
const prometheus::Histogram::BucketBoundaries& OverheadBuckets() {
  static const auto* const kBuckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.03, 0.1, 0.3, 1};
  return *kBuckets;
}

}  // namespace


CoordinatorMetrics::CoordinatorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      latency_(prometheus::BuildHistogram()
                   .Name("dfa_coordinator_job_latency_seconds")
                   .Help("Job latency from submission to its final state")
                   .Register(*registry_)),
      overhead_(prometheus::BuildHistogram()
                    .Name("dfa_coordinator_job_overhead_seconds")
                    .Help("Running job's wall time outside its slowest worker (control plane)")
                    .Register(*registry_)),
      jobs_(prometheus::BuildCounter()
                .Name("dfa_coordinator_jobs_total")
                .Help("Finished jobs by kind and final state")
                .Register(*registry_)),
      flops_(prometheus::BuildCounter()
                 .Name("dfa_coordinator_attention_flops_total")
                 .Help("Attention FLOPs of succeeded jobs")
                 .Register(*registry_)),
      queue_depth_(prometheus::BuildGauge()
                       .Name("dfa_coordinator_queue_depth")
                       .Help("Jobs queued, not yet running")
                       .Register(*registry_)
                       .Add({})),
      sessions_(prometheus::BuildGauge()
                    .Name("dfa_coordinator_sessions")
                    .Help("Open sessions")
                    .Register(*registry_)
                    .Add({})),
      memory_reserved_(prometheus::BuildGauge()
                           .Name("dfa_coordinator_memory_reserved_bytes")
                           .Help("Bytes reserved by sessions over all workers")
                           .Register(*registry_)
                           .Add({})),
      live_workers_(prometheus::BuildGauge()
                        .Name("dfa_coordinator_live_workers")
                        .Help("Workers with a valid lease")
                        .Register(*registry_)
                        .Add({})),
      client_leases_(prometheus::BuildGauge()
                         .Name("dfa_coordinator_client_leases")
                         .Help("Client leases held (attached, or lost and within their grace)")
                         .Register(*registry_)
                         .Add({})),
      lease_reclaimed_(prometheus::BuildCounter()
                           .Name("dfa_coordinator_lease_reclaimed_sessions_total")
                           .Help("Sessions released because their client's lease was lost")
                           .Register(*registry_)
                           .Add({})),
      grpc_errors_(prometheus::BuildCounter()
                       .Name("dfa_grpc_errors_total")
                       .Help("RPCs answered with a non-OK status")
                       .Register(*registry_)),
      requests_(prometheus::BuildCounter()
                    .Name("dfa_coordinator_requests_total")
                    .Help("RPCs the coordinator answered, by method and status code")
                    .Register(*registry_)) {
  // Every method's OK series exists from the start, so that error ratios have a denominator.
  const google::protobuf::ServiceDescriptor* service =
      v1::GetJobRequest::descriptor()->file()->FindServiceByName("Coordinator");
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    requests_.Add({{"rpc", std::string(service->method(i)->name())}, {"code", "OK"}});
  }
  // Create every job series at zero, so that rate() and the dashboard see them from the start.
  for (v1::JobKind kind : {v1::JOB_FORWARD, v1::JOB_BACKWARD}) {
    const std::string k = JobKindLabel(kind);
    latency_.Add({{"kind", k}}, LatencyBuckets());
    overhead_.Add({{"kind", k}}, OverheadBuckets());
    flops_.Add({{"kind", k}});
    for (v1::JobState state : {v1::JOB_SUCCEEDED, v1::JOB_FAILED, v1::JOB_CANCELLED}) {
      jobs_.Add({{"kind", k}, {"state", JobStateLabel(state)}});
    }
  }
}

absl::StatusOr<int> CoordinatorMetrics::Serve(int port, ReadinessCheck ready) {
  absl::StatusOr<int> bound =
      http_.Start(absl::StrCat("0.0.0.0:", port), registry_, std::move(ready));
  if (!bound.ok()) {
    return absl::Status(bound.status().code(),
                        absl::StrCat("metrics_port: ", bound.status().message()));
  }
  return bound;
}

CoordinatorMetrics::~CoordinatorMetrics() { StopServing(); }

void CoordinatorMetrics::StopServing() { http_.Stop(); }

void CoordinatorMetrics::JobFinished(v1::JobKind kind, v1::JobState state, double latency_seconds,
                                     double flops) {
  const std::string k = JobKindLabel(kind);
  latency_.Add({{"kind", k}}, LatencyBuckets()).Observe(latency_seconds);
  jobs_.Add({{"kind", k}, {"state", JobStateLabel(state)}}).Increment();
  if (state == v1::JOB_SUCCEEDED) flops_.Add({{"kind", k}}).Increment(flops);
}

void CoordinatorMetrics::JobOverhead(v1::JobKind kind, double seconds) {
  overhead_.Add({{"kind", JobKindLabel(kind)}}, OverheadBuckets()).Observe(seconds);
}

void CoordinatorMetrics::SetQueueDepth(int jobs) { queue_depth_.Set(jobs); }
void CoordinatorMetrics::SetSessions(int sessions) { sessions_.Set(sessions); }
void CoordinatorMetrics::SetMemoryReserved(int64_t bytes) {
  memory_reserved_.Set(static_cast<double>(bytes));
}
void CoordinatorMetrics::SetLiveWorkers(int workers) { live_workers_.Set(workers); }
void CoordinatorMetrics::SetClientLeases(int leases) { client_leases_.Set(leases); }
void CoordinatorMetrics::LeaseSessionsReclaimed(int sessions) {
  lease_reclaimed_.Increment(sessions);
}

void CoordinatorMetrics::RpcAnswered(absl::string_view method, int code) {
  requests_.Add({{"rpc", std::string(method)}, {"code", CodeName(code)}}).Increment();
  if (code != 0) GrpcError(method, code);
}

void CoordinatorMetrics::GrpcError(absl::string_view method, int code) {
  grpc_errors_
      .Add(
          {{"component", "coordinator"}, {"method", std::string(method)}, {"code", CodeName(code)}})
      .Increment();
}

}  // namespace dfa
