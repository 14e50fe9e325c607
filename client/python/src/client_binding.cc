// dfa._dfa.Client and dfa._dfa.Session: the C++ Client/Session (client/client.h) for Python.
// The Python classes dfa.Client / dfa.Session (dfa/client.py) wrap these with defaults and
// docs. Every blocking call runs without the GIL (RunBlocking); Ctrl-C during a job cancels it.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "binding_util.h"
#include "client/grpc_util.h"
#include "client/shard_io.h"
#include "core/session_capability.h"
#include "core/wire/crc32c.h"
#include "tensors.h"

namespace dfa::python {
namespace {

using client::Client;
using client::ClientOptions;
using client::Session;
using client::SessionOptions;

std::unique_ptr<Client> Connect(const std::string& coordinator, const std::string& client_id,
                                double rpc_timeout, double job_timeout,
                                const std::string& tls_cert, const std::string& tls_key,
                                const std::string& tls_ca, const std::string& tls_server_name,
                                const std::string& token) {
  if (coordinator.find(':') == std::string::npos) {
    ThrowInvalid(absl::StrCat("coordinator: expected host:port, got '", coordinator, "'"));
  }
  ClientOptions o;
  o.coordinator = coordinator;
  o.client_id = client_id;
  o.rpc_timeout = Seconds(rpc_timeout, "rpc_timeout");
  o.job_timeout = Seconds(job_timeout, "job_timeout");
  o.security.cert_file = tls_cert;
  o.security.key_file = tls_key;
  o.security.ca_file = tls_ca;
  o.security.server_name = tls_server_name;
  o.security.auth_token = token;
  return Value(Client::Connect(o));
}

// SubmitJob for `session_id` as this client (tests: a foreign client is refused).
nb::dict SubmitRaw(Client& c, const std::string& session_id, const std::string& kind) {
  v1::SubmitJobRequest req;
  req.set_session_id(session_id);
  req.set_kind(ParseJobKind(kind));
  req.set_client_id(c.client_id());
  v1::Job job = Value(RunBlocking([&]() -> absl::StatusOr<v1::Job> {
    grpc::ClientContext ctx;
    client::SetDeadline(&ctx, c.options().rpc_timeout);
    AttachCapability(&ctx, c.SessionCapability(session_id));  // none for another's session
    v1::Job j;
    RETURN_IF_ERROR(client::FromGrpc(c.coordinator()->SubmitJob(&ctx, req, &j), "SubmitJob"));
    return j;
  }));
  return JobToDict(job);
}

// Session::Run with Ctrl-C cancelling the job.
nb::dict RunJob(Session& s, Client& c, const std::string& kind) {
  const v1::JobKind k = ParseJobKind(kind);
  std::mutex mu;
  std::string job_id;
  std::atomic<bool> cancel{false};
  auto observer = [&](const v1::Job& job) {
    std::lock_guard<std::mutex> lock(mu);
    if (job_id != job.job_id()) {
      job_id = job.job_id();
      if (cancel) (void)c.CancelJob(job_id);
    }
  };
  v1::Job job = Value(RunBlocking([&] { return s.Run(k, observer); },
                                  [&] {
                                    cancel = true;
                                    std::lock_guard<std::mutex> lock(mu);
                                    if (!job_id.empty()) (void)c.CancelJob(job_id);
                                  }));
  return JobToDict(job);
}

}  // namespace

void BindClient(nb::module_& m) {
  nb::class_<Client>(m, "Client")
      .def_static("connect", &Connect, nb::arg("coordinator"), nb::arg("client_id") = "",
                  nb::arg("rpc_timeout") = 30.0, nb::arg("job_timeout") = 1800.0,
                  nb::arg("tls_cert") = "", nb::arg("tls_key") = "", nb::arg("tls_ca") = "",
                  nb::arg("tls_server_name") = "", nb::arg("token") = "")
      .def_prop_ro("client_id", [](const Client& c) { return c.client_id(); })
      .def_prop_ro("coordinator", [](const Client& c) { return c.options().coordinator; })
      .def_prop_ro("tls", [](const Client& c) { return c.options().security.tls(); })
      .def("list_workers",
           [](Client& c) {
             auto r = Value(RunBlocking([&] { return c.ListWorkers(); }));
             nb::list out;
             for (const auto& w : r.workers()) out.append(WorkerToDict(w));
             return out;
           })
      .def("status",
           [](Client& c) { return StatusToDict(Value(RunBlocking([&] { return c.GetStatus(); }))); })
      .def("get_job",
           [](Client& c, const std::string& id) {
             return JobToDict(Value(RunBlocking([&] { return c.GetJob(id); })));
           })
      .def("cancel_job",
           [](Client& c, const std::string& id) {
             return JobToDict(Value(RunBlocking([&] { return c.CancelJob(id); })));
           })
      .def("wait_for_coordinator",
           [](Client& c, double timeout) {
             const absl::Duration d = Seconds(timeout, "timeout");
             Check(RunBlocking([&] { return c.WaitForCoordinator(d); }));
           },
           nb::arg("timeout"))
      .def("create_session",
           [](Client& c, int batch, int64_t seq_len, int q_heads, int kv_heads, int head_dim,
              bool causal, const std::string& dtype, double softmax_scale,
              const std::vector<std::vector<int64_t>>& doc_offsets, int64_t window_left,
              int64_t window_right, int num_workers, const std::string& schedule,
              int ttl_seconds) {
             SessionOptions o;
             o.spec = MakeSpec(batch, seq_len, q_heads, kv_heads, head_dim, causal, dtype,
                               softmax_scale, doc_offsets, window_left, window_right);
             if (num_workers < 0) {
               ThrowInvalid(absl::StrCat("num_workers: must be >= 0, got ", num_workers));
             }
             if (ttl_seconds < 0) {
               ThrowInvalid(absl::StrCat("ttl_seconds: must be >= 0, got ", ttl_seconds));
             }
             o.num_workers = num_workers;
             o.schedule = schedule;
             o.ttl_seconds = ttl_seconds;
             return Value(RunBlocking([&] { return c.CreateSession(o); }));
           },
           nb::arg("batch"), nb::arg("seq_len"), nb::arg("q_heads"), nb::arg("kv_heads"),
           nb::arg("head_dim"), nb::arg("causal"), nb::arg("dtype"), nb::arg("softmax_scale"),
           nb::arg("doc_offsets") = std::vector<std::vector<int64_t>>{},
           nb::arg("window_left") = -1, nb::arg("window_right") = -1,
           nb::arg("num_workers") = 0, nb::arg("schedule") = "", nb::arg("ttl_seconds") = 0,
           nb::keep_alive<0, 1>())
      .def("submit_job", &SubmitRaw, nb::arg("session_id"), nb::arg("kind"));

  nb::class_<Session>(m, "Session")
      .def_prop_ro("id", [](const Session& s) { return s.id(); })
      .def_prop_ro("num_workers", &Session::num_workers)
      .def_prop_ro("spec", [](const Session& s) { return SpecToDict(s.spec()); })
      .def_prop_ro("bytes_per_worker", [](const Session& s) { return s.info().bytes_per_worker(); })
      .def_prop_ro("shards",
                   [](const Session& s) {
                     nb::list out;
                     for (const auto& sh : s.info().shards()) out.append(ShardToDict(sh));
                     return out;
                   })
      .def("upload",
           [](Session& s, int kind, const InputArray& a, const std::string& path,
              int64_t chunk_bytes, int64_t segment_bytes) {
             const v1::TensorKind k = ParseTensorKind(kind, "kind");
             if (k != v1::TENSOR_Q && k != v1::TENSOR_K && k != v1::TENSOR_V &&
                 k != v1::TENSOR_DO) {
               ThrowInvalid(absl::StrCat("kind: uploads take Q, K, V or dO, got ",
                                         client::TensorKindName(k)));
             }
             const client::HostTensor view =
                 InputView(a, s.spec(), k, client::TensorKindName(k).c_str());
             const TransferOptions o = MakeTransferOptions(path, chunk_bytes, segment_bytes);
             client::TransferStats st = Value(RunBlocking([&] { return s.Upload(k, view, o); }));
             nb::dict d;
             d["bytes"] = st.bytes;
             d["chunks"] = st.chunks;
             d["seconds"] = st.seconds;
             return d;
           },
           nb::arg("kind"), nb::arg("array"), nb::arg("path") = "auto",
           nb::arg("chunk_bytes") = client::kDefaultChunkBytes,
           nb::arg("segment_bytes") = int64_t{64} << 20)
      .def("check_input",
           [](Session& s, int kind, const InputArray& a) {
             const v1::TensorKind k = ParseTensorKind(kind, "kind");
             (void)InputView(a, s.spec(), k, client::TensorKindName(k).c_str());
           },
           nb::arg("kind"), nb::arg("array"))
      .def("download",
           [](Session& s, int kind, const std::string& path, int64_t chunk_bytes,
              int64_t segment_bytes) {
             const v1::TensorKind k = ParseTensorKind(kind, "kind");
             if (k == v1::TENSOR_Q || k == v1::TENSOR_K || k == v1::TENSOR_V ||
                 k == v1::TENSOR_DO) {
               ThrowInvalid(absl::StrCat("kind: downloads take O, LSE, dQ, dK or dV, got ",
                                         client::TensorKindName(k)));
             }
             const TransferOptions o = MakeTransferOptions(path, chunk_bytes, segment_bytes);
             client::HostTensor t;
             Value(RunBlocking([&] { return s.Download(k, &t, o); }));
             return OutputArray(std::move(t));
           },
           nb::arg("kind"), nb::arg("path") = "auto",
           nb::arg("chunk_bytes") = client::kDefaultChunkBytes,
           nb::arg("segment_bytes") = int64_t{64} << 20)
      .def("generate_inputs",
           [](Session& s, uint64_t seed, bool with_grad_output) {
             Check(RunBlocking([&] { return s.GenerateInputs(seed, with_grad_output); }));
           },
           nb::arg("seed"), nb::arg("with_grad_output") = true)
      .def("run",
           // `client`: the Client that created the session (it cancels the job on Ctrl-C).
           [](Session& s, Client& c, const std::string& kind) { return RunJob(s, c, kind); },
           nb::arg("client"), nb::arg("kind"))
      .def("submit",
           [](Session& s, const std::string& kind) {
             const v1::JobKind k = ParseJobKind(kind);
             return JobToDict(Value(RunBlocking([&] { return s.Submit(k); })));
           },
           nb::arg("kind"))
      .def("watch",
           [](Session& s, const std::string& job_id) {
             return JobToDict(Value(RunBlocking([&] { return s.Watch(job_id, nullptr); })));
           },
           nb::arg("job_id"))
      .def("release", [](Session& s) { Check(RunBlocking([&] { return s.Release(); })); })
      .def("upload_chunk",
           [](Session& s, int rank, int kind, int batch_index, int64_t begin, int64_t end,
              nb::bytes data, int64_t crc) {
             if (rank < 0 || rank >= s.num_workers()) {
               ThrowInvalid(absl::StrCat("rank: must be in [0, ", s.num_workers(), "), got ", rank));
             }
             v1::TensorChunk chunk;
             chunk.set_kind(ParseTensorKind(kind, "kind"));
             chunk.set_batch_index(batch_index);
             chunk.mutable_rows()->set_begin(begin);
             chunk.mutable_rows()->set_end(end);
             chunk.set_data(std::string(data.c_str(), data.size()));
             chunk.set_crc32c(static_cast<uint32_t>(crc));
             auto r = Value(RunBlocking([&] {
               return s.DataClient(rank).UploadChunks(std::span<const v1::TensorChunk>(&chunk, 1));
             }));
             return r.bytes_received();
           },
           nb::arg("rank"), nb::arg("kind"), nb::arg("batch_index"), nb::arg("begin"),
           nb::arg("end"), nb::arg("data"), nb::arg("crc32c"));

  m.def("crc32c", [](nb::bytes data) {
    return Crc32c(data.c_str(), data.size());
  });
}

}  // namespace dfa::python
