// The session capability on the wire: the secret the coordinator issues at CreateSession
// (core/random_id.h: NewCapability) travels as gRPC metadata `x-dfa-session-capability` on every
// call about that session — client -> coordinator (SubmitJob, GetJob, WatchJob, CancelJob,
// ReleaseSession), client -> worker (Upload, Download, GenerateInputs, SharedMemoryTransfer,
// DeviceTransfer) and coordinator -> worker (RunJob, CloseSession). OpenSession carries it in
// its request (OpenSessionRequest.session_capability), which is how a worker learns it.
//
// Checks compare in constant time and answer PERMISSION_DENIED naming the session and the
// metadata key, never echoing what was presented. docs/security.md has the threat model.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"

namespace dfa {

inline constexpr char kSessionCapabilityMetadata[] = "x-dfa-session-capability";
// A client lease's secret (Coordinator.HoldLease) on CreateSession, beside its lease_id.
inline constexpr char kLeaseSecretMetadata[] = "x-dfa-lease-secret";
// A client group's secret (Coordinator.JoinClientGroup) on Worker.ClientGroupTransfer.
inline constexpr char kClientGroupSecretMetadata[] = "x-dfa-client-group-secret";
// Longest capability OpenSession accepts (NewCapability makes 43 characters).
inline constexpr size_t kMaxCapabilityLength = 256;

// Adds the capability to a call (nothing when `capability` is empty).
void AttachCapability(grpc::ClientContext* ctx, const std::string& capability);

// The capability a call presented ("" when none; the first when several).
std::string PresentedCapability(const grpc::ServerContextBase& ctx);

// OK when `presented` equals `expected` (non-empty); PERMISSION_DENIED naming `session_id`
// otherwise (missing, or wrong).
absl::Status VerifyCapability(absl::string_view expected, absl::string_view presented,
                              absl::string_view session_id);

}  // namespace dfa
