// Flags shared by `dfa demo`, `dfa submit` and `dfa bench`: the attention spec and the session.
//   --batch B --seq S --heads H --kv-heads HK --head-dim D --dtype bf16|f16|f32
//   --causal | --full  --scale X  --workers N  --schedule NAME  --seed N
#pragma once

#include <cstdint>
#include <string>

#include "client/cli/args.h"
#include "client/client.h"

namespace dfa::cli {

struct JobFlags {
  client::SessionOptions session;
  uint64_t seed = 1;
};

// Reads the flags above; `default_seq` and `default_workers` differ per command.
absl::StatusOr<JobFlags> ParseJobFlags(Args& args, int64_t default_seq, int default_workers);

// Transport security of every command that talks to a cluster (docs/security.md):
//   --tls-cert FILE --tls-key FILE --tls-ca FILE [--tls-server-name NAME]  (all three or none)
//   --auth-token TOKEN (default: $DFA_AUTH_TOKEN)
absl::StatusOr<RpcSecurityOptions> ParseSecurityFlags(Args& args);
// The usage lines of the flags above.
inline constexpr char kSecurityUsage[] =
    "Security: [--tls-cert FILE --tls-key FILE --tls-ca FILE [--tls-server-name NAME]] (mTLS)\n"
    "          [--auth-token TOKEN] (default $DFA_AUTH_TOKEN; sent as 'authorization: Bearer')\n";

// --path: "auto", "grpc" or "shm".
absl::StatusOr<client::TransferPath> ParseTransferPath(const std::string& path);

// "B=1 S=2048 Hq=8 Hkv=8 D=64 bf16 causal"
std::string DescribeSpec(const v1::AttentionSpec& spec);

}  // namespace dfa::cli
