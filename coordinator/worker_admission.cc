#include "coordinator/worker_admission.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "core/log.h"
#include "core/rpc_security.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace dfa {
namespace {

constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// grpc.health.v1.HealthCheckRequest {string service = 1;} in protobuf wire format.
grpc::ByteBuffer EncodeHealthRequest(const std::string& service) {
  std::string bytes;
  if (!service.empty()) {
    bytes.push_back(0x0a);  // field 1, length-delimited
    for (uint64_t n = service.size(); ; n >>= 7) {
      if (n < 0x80) {
        bytes.push_back(static_cast<char>(n));
        break;
      }
      bytes.push_back(static_cast<char>((n & 0x7f) | 0x80));
    }
    bytes += service;
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// grpc.health.v1.HealthCheckResponse {ServingStatus status = 1;}: the status (0 when absent
// or unparsable; SERVING is 1).
uint64_t DecodeServingStatus(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return 0;
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  uint64_t status = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t tag = static_cast<uint8_t>(bytes[i++]);
    if (tag != 0x08) return 0;  // only field 1 (varint) is expected
    uint64_t v = 0;
    for (int shift = 0; i < bytes.size() && shift < 64; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    status = v;
  }
  return status;
}

}  // namespace

HealthCheck CheckHealth(const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
                        absl::Duration timeout) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::ByteBuffer request = EncodeHealthRequest(service);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, kHealthCheckMethod, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  HealthCheck check;
  if (status.ok()) {
    const uint64_t serving = DecodeServingStatus(response);
    check.answer = serving == 1 ? HealthAnswer::kServing : HealthAnswer::kOther;
    check.detail = absl::StrCat("health status ", serving);
    return check;
  }
  check.detail = absl::StrCat("gRPC ", status.error_code(), ": ", status.error_message());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
      check.answer = HealthAnswer::kNoAnswer;
      break;
    default:  // NOT_FOUND (unknown service), UNIMPLEMENTED (no health service), ...
      check.answer = HealthAnswer::kOther;
  }
  return check;
}

bool WorkerAdmission::HolderAnswers(const RegisteredWorker& holder,
                                    const v1::RegisterWorkerRequest& request) {
  const std::string& address = holder.info.address();
  if (holder.info.boot_id().empty()) {
    if (request.address() == address) return false;  // the same address: it restarted
    return CheckHealth(stubs_->NewChannel(address), "", check_timeout_).answer !=
           HealthAnswer::kNoAnswer;
  }
  return CheckHealth(stubs_->NewChannel(address), WorkerBootHealthService(holder.info.boot_id()),
                     check_timeout_)
             .answer == HealthAnswer::kServing;
}

absl::StatusOr<Admission> WorkerAdmission::Admit(const v1::RegisterWorkerRequest& request) {
  RETURN_IF_ERROR(ValidateRegistration(request));
  Admission admission;
  uint64_t replaces = 0;
  std::optional<RegisteredWorker> holder = registry_->Get(request.worker_id());
  if (holder && registry_->Live(*holder, absl::Now())) {
    const bool renewal = !request.boot_id().empty() &&
                         request.boot_id() == holder->info.boot_id() &&
                         request.address() == holder->info.address();
    if (renewal) {
      ASSIGN_OR_RETURN(admission.incarnation,
                       registry_->Register(request, absl::Now(), 0, &admission.replaced));
      return admission;
    }
    if (HolderAnswers(*holder, request)) return IdHeldError(*holder, registry_->lease());
    replaces = holder->incarnation;
  }

  std::shared_ptr<grpc::Channel> channel = stubs_->NewChannel(request.address());
  const bool has_boot_id = !request.boot_id().empty();
  const HealthCheck check = CheckHealth(
      channel, has_boot_id ? WorkerBootHealthService(request.boot_id()) : std::string(),
      check_timeout_);
  if (check.answer == HealthAnswer::kNoAnswer) {
    return absl::UnavailableError(absl::StrCat(
        "address: worker ", request.worker_id(), " cannot be reached at ", request.address(),
        " from the coordinator within ", absl::FormatDuration(check_timeout_), " (",
        check.detail, "); is --advertise an address the coordinator and clients can reach?"));
  }
  if (has_boot_id && check.answer != HealthAnswer::kServing) {
    return absl::UnavailableError(absl::StrCat(
        "address: the server at ", request.address(), " is not worker ", request.worker_id(),
        " (it does not report this worker's boot_id: ", check.detail,
        "); is --advertise this worker's own address?"));
  }
  ASSIGN_OR_RETURN(admission.incarnation,
                   registry_->Register(request, absl::Now(), replaces, &admission.replaced));
  stubs_->Install(request.address(), std::move(channel));
  DFA_LOG(INFO) << "worker " << request.worker_id() << " joined at " << request.address()
                << " (host " << request.host() << ", backend " << request.backend()
                << ", device " << request.device() << ", memory limit " << request.memory_limit_bytes()
                << " bytes, incarnation " << admission.incarnation << ")";
  return admission;
}

}  // namespace dfa
