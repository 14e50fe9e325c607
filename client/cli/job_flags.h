// Flags shared by `dfa demo`, `dfa submit` and `dfa bench`: the attention spec and the session.
//   --batch B --seq S --heads H --kv-heads HK --head-dim D --dtype bf16|f16|f32
//   --causal | --full  --scale X  --workers N  --schedule NAME  --seed N  --ttl SECONDS
//   --doc-lengths L1,L2,...  --window LEFT[,RIGHT]   (client/cli/mask_flags.h)
// and those of every command that talks to a cluster (--coordinator, security).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "client/cli/args.h"
#include "client/cli/command.h"
#include "client/client.h"

namespace dfa::cli {

struct JobFlags {
  client::SessionOptions session;
  uint64_t seed = 1;
};

// Reads the flags above; `default_seq` and `default_workers` differ per command.
absl::StatusOr<JobFlags> ParseJobFlags(Args& args, int64_t default_seq, int default_workers);
// Their help, with the same defaults (`workers_help` says what the default worker count means).
FlagGroup JobFlagGroup(int64_t default_seq, const std::string& workers_help);

// Transport security of every command that talks to a cluster (docs/security.md):
//   --tls-cert FILE --tls-key FILE --tls-ca FILE [--tls-server-name NAME]  (all three or none)
//   --auth-token TOKEN (default: $DFA_AUTH_TOKEN)
absl::StatusOr<RpcSecurityOptions> ParseSecurityFlags(Args& args);
FlagGroup SecurityFlagGroup();

// --coordinator HOST:PORT (required) and the security flags: a connected client.
absl::StatusOr<std::unique_ptr<client::Client>> ConnectFromArgs(Args& args);
FlagInfo CoordinatorFlag(const std::string& help);

// --path: "auto", "grpc" or "shm".
absl::StatusOr<client::TransferPath> ParseTransferPath(const std::string& path);

// "B=1 S=2048 Hq=8 Hkv=8 D=64 bf16 causal" (+ " docs=3 window=128,0" for a masked spec)
std::string DescribeSpec(const v1::AttentionSpec& spec);

}  // namespace dfa::cli
