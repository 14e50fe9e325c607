#include "core/session_capability.h"

#include "absl/strings/str_cat.h"
#include "core/random_id.h"

namespace dfa {

void AttachCapability(grpc::ClientContext* ctx, const std::string& capability) {
  if (!capability.empty()) ctx->AddMetadata(kSessionCapabilityMetadata, capability);
}

std::string PresentedCapability(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kSessionCapabilityMetadata);
  if (it == md.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

absl::Status VerifyCapability(absl::string_view expected, absl::string_view presented,
                              absl::string_view session_id) {
  if (presented.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("session_capability: missing for session ", session_id, " (metadata \"",
                     kSessionCapabilityMetadata, "\" from CreateSessionResponse)"));
  }
  // An empty `expected` matches nothing: a session always has a capability where this is asked.
  if (expected.empty() || !ConstantTimeEquals(expected, presented)) {
    return absl::PermissionDeniedError(
        absl::StrCat("session_capability: wrong capability for session ", session_id,
                     " (metadata \"", kSessionCapabilityMetadata, "\")"));
  }
  return absl::OkStatus();
}

}  // namespace dfa
