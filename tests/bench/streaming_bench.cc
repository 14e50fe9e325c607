// dfa-streaming-bench: one attention layer (forward + backward from host tensors through
// AttentionJob) on a local cluster, in three modes: serial (inputs uploaded before the job,
// outputs downloaded after it), inputs (uploaded while it starts: SubmitJob with
// inputs_streaming, docs/worker.md "Streaming inputs"; outputs after it) and in+out (outputs
// downloaded while it runs as well: outputs_streaming and awaited downloads, "Streaming
// outputs"), over gRPC chunks and shared memory. Prints the median wall time of Forward (upload
// Q, K, V + job + download O, LSE) and Backward (upload dO + job + download dQ, dK, dV) per mode
// and path, the upload alone (Session::Upload of Q, K, V) beside them, the layer's parts alone
// on a session of its own (all its transfers with nothing computing; its two jobs with nothing
// moving) and each mode's layer over the larger of the two ("/ max": 1 = every transfer hidden
// behind compute or the reverse), and how far each streamed mode's O and dQ, dK, dV are from
// the serial ones (max abs; the same plan: expected 0). A figure, not a test: nothing is
// asserted.
//
// usage: dfa-streaming-bench [seq=4096] [q_heads=8] [kv_heads=8] [head_dim=64] [repeats=3]
//                            [backend=cpu] [workers=2] [threads=1]
// GPU backends: the workers share the device, each limited to 0.9 / workers of its memory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/attention_job.h"
#include "client/local_cluster.h"
#include "core/dtype.h"

namespace dfa {
namespace {

// max |a - b| over the elements (infinity when the shapes differ).
double MaxAbsDiff(const client::HostTensor& a, const client::HostTensor& b) {
  if (a.elements() != b.elements() || a.dtype != b.dtype) return INFINITY;
  double m = 0;
  for (int64_t i = 0; i < a.elements(); ++i) {
    m = std::max(m, static_cast<double>(std::abs(LoadAsFloat(a.data(), a.dtype, i) -
                                                 LoadAsFloat(b.data(), b.dtype, i))));
  }
  return m;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  auto arg = [&](int i, const char* def) { return std::string(argc > i ? argv[i] : def); };
  const int64_t seq = std::atoll(arg(1, "4096").c_str());
  const int hq = std::atoi(arg(2, "8").c_str()), hkv = std::atoi(arg(3, "8").c_str());
  const int dim = std::atoi(arg(4, "64").c_str()), repeats = std::atoi(arg(5, "3").c_str());
  const std::string backend = arg(6, "cpu");
  const int workers = std::atoi(arg(7, "2").c_str()), threads = std::atoi(arg(8, "1").c_str());

  client::LocalClusterOptions co;
  co.workers = workers;
  co.backend = backend;
  co.threads_per_worker = threads;
  // GPU workers on one device share it: each takes an equal part of 90% of its memory.
  if (backend != "cpu") {
    co.worker_args.push_back(absl::StrCat("--device_memory_limit=", 0.9 / std::max(workers, 1)));
  }
  auto cluster = client::LocalCluster::Start(co);
  if (!cluster.ok()) {
    std::fprintf(stderr, "cluster: %s\n", cluster.status().ToString().c_str());
    return 1;
  }
  auto c = client::Client::Connect((*cluster)->client_options());
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    return 1;
  }
  v1::AttentionSpec spec;
  spec.set_batch(1);
  spec.set_seq_len(seq);
  spec.set_q_heads(hq);
  spec.set_kv_heads(hkv);
  spec.set_head_dim(dim);
  spec.set_causal(true);
  spec.set_dtype(v1::DTYPE_BF16);
  client::HostTensor q = *client::MakeTensor(spec, v1::TENSOR_Q);
  client::HostTensor k = *client::MakeTensor(spec, v1::TENSOR_K);
  client::HostTensor v = *client::MakeTensor(spec, v1::TENSOR_V);
  client::HostTensor dout = *client::MakeTensor(spec, v1::TENSOR_DO);
  client::FillRandom(1, &q);
  client::FillRandom(2, &k);
  client::FillRandom(3, &v);
  client::FillRandom(4, &dout);
  const double mib = (q.size_bytes() + k.size_bytes() + v.size_bytes()) / 1048576.0;
  std::printf("causal bf16 B=1 S=%lld Hq=%d Hkv=%d D=%d, %d %s workers x %d threads; Q+K+V "
              "%.1f MiB; median of %d\n",
              static_cast<long long>(seq), hq, hkv, dim, workers, backend.c_str(), threads, mib,
              repeats);
  std::printf("%-5s %-10s %12s %12s %12s %12s %7s\n", "path", "mode", "upload ms", "forward ms",
              "backward ms", "layer ms", "/ max");
  for (client::TransferPath path :
       {client::TransferPath::kGrpc, client::TransferPath::kSharedMemory}) {
    // The parts alone, on a session of its own: every transfer of the layer (Q, K, V up; O, LSE
    // down; dO up; dQ, dK, dV down) timed with nothing computing, and the two jobs between them.
    client::SessionOptions so;
    so.spec = spec;
    so.num_workers = workers;
    auto probe = (*c)->CreateSession(so);
    if (!probe.ok()) {
      std::fprintf(stderr, "session: %s\n", probe.status().ToString().c_str());
      return 1;
    }
    client::TransferOptions t;
    t.path = path;
    std::vector<double> up, moved, computed;
    for (int r = 0; r <= repeats; ++r) {
      double qkv = 0, transfers = 0, jobs = 0;
      absl::Status st;
      auto timed = [&](double* into, auto&& f) {
        const absl::Time t0 = absl::Now();
        if (st.ok()) st = f();
        *into += absl::ToDoubleMilliseconds(absl::Now() - t0);
      };
      client::HostTensor out;
      timed(&qkv, [&] {
        return (*probe)->Upload({{v1::TENSOR_Q, &q}, {v1::TENSOR_K, &k}, {v1::TENSOR_V, &v}}, t)
            .status();
      });
      transfers += qkv;
      timed(&jobs, [&] { return (*probe)->Run(v1::JOB_FORWARD).status(); });
      timed(&transfers, [&] { return (*probe)->Upload(v1::TENSOR_DO, dout, t).status(); });
      for (v1::TensorKind kind : {v1::TENSOR_O, v1::TENSOR_LSE}) {
        timed(&transfers, [&] { return (*probe)->Download(kind, &out, t).status(); });
      }
      timed(&jobs, [&] { return (*probe)->Run(v1::JOB_BACKWARD).status(); });
      for (v1::TensorKind kind : {v1::TENSOR_DQ, v1::TENSOR_DK, v1::TENSOR_DV}) {
        timed(&transfers, [&] { return (*probe)->Download(kind, &out, t).status(); });
      }
      if (!st.ok()) {
        std::fprintf(stderr, "parts alone: %s\n", st.ToString().c_str());
        return 1;
      }
      if (r == 0) continue;
      up.push_back(qkv);
      moved.push_back(transfers);
      computed.push_back(jobs);
    }
    (void)(*probe)->Release();
    client::ForwardOutputs serial_fwd;
    client::BackwardOutputs serial_bwd;
    struct Mode {
      const char* name;
      bool inputs, outputs;
    };
    for (const Mode& mode : {Mode{"serial", false, false}, Mode{"inputs", true, false},
                             Mode{"in+out", true, true}}) {
      const bool streaming = mode.inputs;
      client::AttentionJobOptions o;
      o.session.spec = spec;
      o.session.num_workers = workers;
      o.transfer.path = path;
      o.max_retries = 0;
      o.stream_inputs = mode.inputs;
      o.stream_outputs = mode.outputs;
      client::AttentionJob job(c->get(), o);
      std::vector<double> fwd, bwd;
      char diff[160] = "";
      for (int r = 0; r <= repeats; ++r) {  // the first run warms up (connections, segments)
        absl::Time t0 = absl::Now();
        auto f = job.Forward(q, k, v);
        const double tf = absl::ToDoubleMilliseconds(absl::Now() - t0);
        if (!f.ok()) {
          std::fprintf(stderr, "forward: %s\n", f.status().ToString().c_str());
          return 1;
        }
        t0 = absl::Now();
        auto b = job.Backward(dout);
        const double tb = absl::ToDoubleMilliseconds(absl::Now() - t0);
        if (!b.ok()) {
          std::fprintf(stderr, "backward: %s\n", b.status().ToString().c_str());
          return 1;
        }
        if (r == repeats) {
          if (!streaming) {
            serial_fwd = std::move(*f);
            serial_bwd = std::move(*b);
          } else {
            std::snprintf(diff, sizeof(diff),
                        "      %s vs serial, max abs: O %.3g, dQ %.3g, dK %.3g, dV %.3g\n",
                        mode.name,
                        MaxAbsDiff(f->o, serial_fwd.o),
                        MaxAbsDiff(b->dq, serial_bwd.dq),
                        MaxAbsDiff(b->dk, serial_bwd.dk),
                        MaxAbsDiff(b->dv, serial_bwd.dv));
          }
        }
        if (r == 0) continue;
        fwd.push_back(tf);
        bwd.push_back(tb);
      }
      const double layer = Median(fwd) + Median(bwd);
      std::printf("%-5s %-10s %12.1f %12.1f %12.1f %12.1f %7.3f\n",
                  path == client::TransferPath::kGrpc ? "grpc" : "shm",
                  mode.name, Median(up), Median(fwd), Median(bwd), layer,
                  layer / std::max(Median(moved), Median(computed)));
      std::fputs(diff, stdout);
    }
    std::printf("%-5s parts alone: transfers %.1f ms, jobs %.1f ms (their sum %.1f, max %.1f)\n",
                path == client::TransferPath::kGrpc ? "grpc" : "shm", Median(moved),
                Median(computed), Median(moved) + Median(computed),
                std::max(Median(moved), Median(computed)));
  }
  return 0;
}

}  // namespace
}  // namespace dfa

int main(int argc, char** argv) { return dfa::Main(argc, argv); }
