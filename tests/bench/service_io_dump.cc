// Runs one forward+backward job through the service (gRPC control plane, client data plane) on
// seeded inputs and writes inputs and results as raw little-endian files, so that
// verify_against_torch.py can check them against PyTorch on the same inputs.
//   dfa-service-io-dump --coordinator HOST:PORT --out DIR [--seq 4096] [--heads 32] [--kv_heads 32]
//                       [--head_dim 128] [--causal] [--workers 2] [--schedule balanced] [--seed 7]
// DIR/meta.json describes every file: q k v dout o (BSHD, bf16), lse (fp32 BHS), dq dk dv.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "client/attention_job.h"
#include "client/client.h"
#include "client/host_tensor.h"

ABSL_FLAG(std::string, coordinator, "", "coordinator address HOST:PORT");
ABSL_FLAG(std::string, out, "", "output directory (must exist)");
ABSL_FLAG(int64_t, seq, 4096, "sequence length");
ABSL_FLAG(int32_t, heads, 32, "query heads");
ABSL_FLAG(int32_t, kv_heads, 0, "key/value heads (0: = heads)");
ABSL_FLAG(int32_t, head_dim, 128, "head dimension");
ABSL_FLAG(bool, causal, true, "causal mask");
ABSL_FLAG(int32_t, workers, 0, "workers (0: all)");
ABSL_FLAG(std::string, schedule, "balanced", "plan schedule");
ABSL_FLAG(uint64_t, seed, 7, "input seed");

namespace {

using dfa::client::HostTensor;

absl::Status Write(const std::string& dir, const std::string& name, const HostTensor& t,
                   std::string* meta) {
  std::ofstream f(dir + "/" + name + ".bin", std::ios::binary);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", dir, "/", name, ".bin"));
  const char* dtype = t.dtype == dfa::DType::kBF16 ? "bf16" : t.dtype == dfa::DType::kF16 ? "f16" : "f32";
  absl::StrAppend(meta, meta->size() > 1 ? ",\n" : "", "  \"", name, "\": {\"dtype\": \"", dtype,
                  "\", \"layout\": \"", t.row_stats ? "BHS" : "BSHD", "\", \"shape\": [", t.batch,
                  ", ", t.rows, ", ", t.heads, ", ", t.head_dim, "]}");
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_out);
  if (dir.empty()) return absl::InvalidArgumentError("--out is required");
  dfa::client::ClientOptions co;
  co.coordinator = absl::GetFlag(FLAGS_coordinator);
  ASSIGN_OR_RETURN(auto client, dfa::client::Client::Connect(co));
  dfa::client::AttentionJobOptions jo;
  dfa::v1::AttentionSpec& spec = jo.session.spec;
  spec.set_batch(1);
  spec.set_seq_len(absl::GetFlag(FLAGS_seq));
  spec.set_q_heads(absl::GetFlag(FLAGS_heads));
  spec.set_kv_heads(absl::GetFlag(FLAGS_kv_heads) ? absl::GetFlag(FLAGS_kv_heads)
                                                  : absl::GetFlag(FLAGS_heads));
  spec.set_head_dim(absl::GetFlag(FLAGS_head_dim));
  spec.set_causal(absl::GetFlag(FLAGS_causal));
  spec.set_dtype(dfa::v1::DTYPE_BF16);
  jo.session.num_workers = absl::GetFlag(FLAGS_workers);
  jo.session.schedule = absl::GetFlag(FLAGS_schedule);
  jo.max_retries = 0;
  ASSIGN_OR_RETURN(HostTensor q, dfa::client::MakeTensor(spec, dfa::v1::TENSOR_Q));
  ASSIGN_OR_RETURN(HostTensor k, dfa::client::MakeTensor(spec, dfa::v1::TENSOR_K));
  ASSIGN_OR_RETURN(HostTensor v, dfa::client::MakeTensor(spec, dfa::v1::TENSOR_V));
  ASSIGN_OR_RETURN(HostTensor dout, dfa::client::MakeTensor(spec, dfa::v1::TENSOR_DO));
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  dfa::client::FillRandom(seed, &q);
  dfa::client::FillRandom(seed + 1, &k);
  dfa::client::FillRandom(seed + 2, &v);
  dfa::client::FillRandom(seed + 3, &dout);
  dfa::client::AttentionJob job(client.get(), jo);
  dfa::v1::Job fj, bj;
  ASSIGN_OR_RETURN(auto fwd, job.Forward(q, k, v, &fj));
  ASSIGN_OR_RETURN(auto bwd, job.Backward(dout, &bj));
  std::printf("forward  %.4f s on %d workers (schedule %s)\nbackward %.4f s\n", fj.wall_seconds(),
              fj.workers_size(), absl::GetFlag(FLAGS_schedule).c_str(), bj.wall_seconds());
  std::string meta = "{\n";
  absl::StrAppend(&meta, "  \"causal\": ", spec.causal() ? "true" : "false",
                  ",\n  \"scale\": ", dfa::client::EffectiveScale(spec));
  RETURN_IF_ERROR(Write(dir, "q", q, &meta));
  RETURN_IF_ERROR(Write(dir, "k", k, &meta));
  RETURN_IF_ERROR(Write(dir, "v", v, &meta));
  RETURN_IF_ERROR(Write(dir, "dout", dout, &meta));
  RETURN_IF_ERROR(Write(dir, "o", fwd.o, &meta));
  RETURN_IF_ERROR(Write(dir, "lse", fwd.lse, &meta));
  RETURN_IF_ERROR(Write(dir, "dq", bwd.dq, &meta));
  RETURN_IF_ERROR(Write(dir, "dk", bwd.dk, &meta));
  RETURN_IF_ERROR(Write(dir, "dv", bwd.dv, &meta));
  meta += "\n}\n";
  std::ofstream(dir + "/meta.json") << meta;
  return job.Release();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "dfa-service-io-dump: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
