#include "client/cli/job_flags.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "client/cli/mask_flags.h"
#include "core/dtype.h"
#include "core/spec_validation.h"

namespace dfa::cli {

absl::StatusOr<JobFlags> ParseJobFlags(Args& args, int64_t default_seq, int default_workers) {
  JobFlags f;
  v1::AttentionSpec& spec = f.session.spec;
  ASSIGN_OR_RETURN(int64_t batch, args.GetInt("batch", 1, 1, 1 << 20));
  ASSIGN_OR_RETURN(int64_t seq, args.GetInt("seq", default_seq, 1, int64_t{1} << 40));
  ASSIGN_OR_RETURN(int64_t heads, args.GetInt("heads", 8, 1, 1 << 16));
  ASSIGN_OR_RETURN(int64_t kv_heads, args.GetInt("kv-heads", heads, 1, 1 << 16));
  ASSIGN_OR_RETURN(int64_t head_dim, args.GetInt("head-dim", 64, 1, 1 << 16));
  ASSIGN_OR_RETURN(std::string dtype, args.GetString("dtype", "bf16"));
  ASSIGN_OR_RETURN(bool causal, args.GetBool("causal", true));
  ASSIGN_OR_RETURN(bool full, args.GetBool("full", false));
  ASSIGN_OR_RETURN(double scale, args.GetDouble("scale", 0.0, 0.0, 1e6));
  ASSIGN_OR_RETURN(int64_t workers, args.GetInt("workers", default_workers, 0, 4096));
  ASSIGN_OR_RETURN(f.session.schedule, args.GetString("schedule", "balanced"));
  ASSIGN_OR_RETURN(int64_t seed, args.GetInt("seed", 1, 0, INT64_MAX));
  ASSIGN_OR_RETURN(int64_t ttl, args.GetInt("ttl", 0, 0, 7 * 24 * 3600));
  if (args.Has("causal") && full && causal) {
    return absl::InvalidArgumentError("--causal and --full exclude each other");
  }
  if (heads % kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heads (", heads, ") must be a multiple of --kv-heads (", kv_heads, ")"));
  }
  spec.set_batch(static_cast<int32_t>(batch));
  spec.set_seq_len(seq);
  spec.set_q_heads(static_cast<int32_t>(heads));
  spec.set_kv_heads(static_cast<int32_t>(kv_heads));
  spec.set_head_dim(static_cast<int32_t>(head_dim));
  ASSIGN_OR_RETURN(v1::DType dt, client::ParseDType(dtype));
  spec.set_dtype(dt);
  spec.set_causal(!full);
  spec.set_softmax_scale(static_cast<float>(scale));
  ASSIGN_OR_RETURN(const MaskSpec mask, ParseMaskFlags(args, seq, !full));
  SetSpecMask(mask, &spec);
  f.session.num_workers = static_cast<int>(workers);
  f.session.ttl_seconds = static_cast<int>(ttl);
  f.seed = static_cast<uint64_t>(seed);
  return f;
}

FlagGroup JobFlagGroup(int64_t default_seq, const std::string& workers_help) {
  FlagGroup g = {
      "Job",
      {{"batch", "B", "batch size (default 1)"},
       {"seq", "S", absl::StrCat("sequence length, e.g. 16K (default ", default_seq, ")")},
       {"heads", "H", "query heads (default 8)"},
       {"kv-heads", "HK", "key/value heads; H must be a multiple (default H)"},
       {"head-dim", "D", "head dimension (default 64)"},
       {"dtype", "bf16|f16|f32", "element type (default bf16)"},
       {"causal", "", "causal mask (the default)"},
       {"full", "", "no mask"},
       {"scale", "X", "softmax scale (default 1/sqrt(D))"},
       {"workers", "N", workers_help},
       {"schedule", "NAME", "balanced, ring, distflash, zigzag, heads, auto (default balanced)"},
       {"seed", "N", "seed of the random inputs (default 1)"},
       {"ttl", "SECONDS", "session time to live when idle (default: the coordinator's)"}}};
  for (FlagInfo& f : MaskFlagInfos()) g.flags.push_back(std::move(f));
  return g;
}

FlagGroup SecurityFlagGroup() {
  return {"Security (docs/security.md)",
          {{"tls-cert", "FILE", "client certificate (PEM); with --tls-key and --tls-ca: mTLS"},
           {"tls-key", "FILE", "its private key (PEM)"},
           {"tls-ca", "FILE", "CA bundle the servers' certificates must chain to"},
           {"tls-server-name", "NAME", "name to expect in the servers' certificates"},
           {"auth-token", "TOKEN", "bearer token for the coordinator (default $DFA_AUTH_TOKEN)"},
           {"auth-token-file", "FILE", "file holding the bearer token (instead of --auth-token)"}}};
}

FlagInfo CoordinatorFlag(const std::string& help) { return {"coordinator", "HOST:PORT", help}; }

absl::StatusOr<std::unique_ptr<client::Client>> ConnectFromArgs(Args& args) {
  ASSIGN_OR_RETURN(std::string addr, args.GetString("coordinator", ""));
  if (addr.empty()) return absl::InvalidArgumentError("--coordinator HOST:PORT is required");
  client::ClientOptions o;
  o.coordinator = addr;
  ASSIGN_OR_RETURN(o.security, ParseSecurityFlags(args));
  return client::Client::Connect(o);
}

absl::StatusOr<RpcSecurityOptions> ParseSecurityFlags(Args& args) {
  RpcSecurityOptions s;
  ASSIGN_OR_RETURN(s.cert_file, args.GetString("tls-cert", ""));
  ASSIGN_OR_RETURN(s.key_file, args.GetString("tls-key", ""));
  ASSIGN_OR_RETURN(s.ca_file, args.GetString("tls-ca", ""));
  ASSIGN_OR_RETURN(s.server_name, args.GetString("tls-server-name", ""));
  ASSIGN_OR_RETURN(std::string token_file, args.GetString("auth-token-file", ""));
  if (!token_file.empty()) {
    if (args.Has("auth-token")) {
      return absl::InvalidArgumentError("--auth-token and --auth-token-file: give one");
    }
    ASSIGN_OR_RETURN(s.auth_token, ReadTokenFile(token_file, "--auth-token-file"));
    return s;
  }
  const char* env_token = std::getenv("DFA_AUTH_TOKEN");
  ASSIGN_OR_RETURN(s.auth_token, args.GetString("auth-token", env_token ? env_token : ""));
  return s;
}

absl::StatusOr<client::TransferPath> ParseTransferPath(const std::string& p) {
  if (p == "auto") return client::TransferPath::kAuto;
  if (p == "grpc") return client::TransferPath::kGrpc;
  if (p == "shm") return client::TransferPath::kSharedMemory;
  return absl::InvalidArgumentError(absl::StrCat("--path: '", p, "' (expected auto, grpc or shm)"));
}

std::string DescribeSpec(const v1::AttentionSpec& spec) {
  auto dt = client::FromProtoDType(spec.dtype());
  return absl::StrCat("B=", spec.batch(), " S=", spec.seq_len(), " Hq=", spec.q_heads(),
                      " Hkv=", spec.kv_heads(), " D=", spec.head_dim(), " ",
                      dt.ok() ? std::string(DTypeName(*dt)) : "?",
                      spec.causal() ? " causal" : " full", DescribeMask(MaskSpecOf(spec)));
}

}  // namespace dfa::cli
