#include "client/cli/offload_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/job_flags.h"
#include "client/local_cluster.h"

#if DFA_CLI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "client/attention_job.h"
#include "client/device_attention_job.h"
#include "kernels/attention_backend.h"
#endif

namespace dfa::cli {

FlagGroup OffloadFlagGroup() {
  return {"Offload (--offload: one layer from CUDA memory, docs/gpu-service.md)",
          {{"offload", "", "run this benchmark instead (needs a GPU on this host)"},
           {"seqs", "S,S,..", "sequence lengths (default 16K,64K,256K); --heads, --kv-heads, "
                              "--head-dim default to 32, 8, 128, bf16, causal"},
           {"rounds", "R", "alternating rounds per S; best and median reported (default 5)"},
           {"paths", "ipc,shm,grpc", "service paths to run (default all three)"},
           {"host-max-seq", "S", "host paths (shm, grpc) only up to this S (default 64K)"},
           {"worker-memory", "SIZE|FRACTION",
            "the local worker's --device_memory_limit (default 0.5)"}}};
}

#if !DFA_CLI_HAVE_CUDA
absl::Status RunOffloadBench(Args&) {
  return absl::UnimplementedError(
      "dfa bench --offload: this dfa was built without CUDA (the same-host GPU path)");
}
#else
namespace {

using client::DeviceTensor;

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// A device buffer of cudaMalloc (what a caching allocator's block is).
struct DeviceBuffer {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p) cudaFree(p);
  }
  absl::Status Alloc(size_t n) {
    bytes = n;
    return Cuda(cudaMalloc(&p, n), "cudaMalloc");
  }
};

struct Round {
  double step = 0, transfer = 0, compute = 0, control = 0;
  int64_t ipc_bytes = 0;
};

struct WayResult {
  std::string way;
  std::vector<Round> rounds;
  double error = 0;  // max |got - local| / max |local| over O, dQ, dK, dV
  double Best() const {
    double b = 1e30;
    for (const Round& r : rounds) b = std::min(b, r.step);
    return b;
  }
  const Round& BestRound() const {
    return *std::min_element(rounds.begin(), rounds.end(),
                             [](const Round& a, const Round& b) { return a.step < b.step; });
  }
  double Median() const {
    std::vector<double> s;
    for (const Round& r : rounds) s.push_back(r.step);
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : s[s.size() / 2];
  }
};

float ToFloat(const uint8_t* p, DType t) {
  if (t == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (t == DType::kBF16) {
    uint32_t u = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // f16
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
  float v = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
                     : std::ldexp(static_cast<float>(man | 1024), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

// Device tensor contents as floats (for the comparison; once per S).
absl::StatusOr<std::vector<float>> Fetch(const void* p, int64_t n, DType t) {
  std::vector<uint8_t> raw(static_cast<size_t>(n * DTypeSize(t)));
  RETURN_IF_ERROR(Cuda(cudaMemcpy(raw.data(), p, raw.size(), cudaMemcpyDeviceToHost), "fetch"));
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = ToFloat(&raw[i * DTypeSize(t)], t);
  return out;
}

double RelError(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff = 0, scale = 1e-6;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(got[i] - ref[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(ref[i])));
  }
  return diff / scale;
}

class OffloadLayer {
 public:
  OffloadLayer(client::Client* c, v1::AttentionSpec spec, int device)
      : client_(c), spec_(std::move(spec)), device_(device) {}

  absl::Status Init() {
    dtype_ = static_cast<DType>(spec_.dtype());
    const int64_t b = spec_.batch(), s = spec_.seq_len(), d = spec_.head_dim();
    nq_ = b * s * spec_.q_heads() * d;
    nkv_ = b * s * spec_.kv_heads() * d;
    const size_t es = DTypeSize(dtype_);
    using Sized = std::initializer_list<std::pair<DeviceBuffer*, int64_t>>;
    for (auto [buf, n] : Sized{{&q_, nq_}, {&k_, nkv_}, {&v_, nkv_}, {&do_, nq_}, {&o_, nq_},
                               {&dq_, nq_}, {&dk_, nkv_}, {&dv_, nkv_}, {&lo_, nq_}}) {
      RETURN_IF_ERROR(buf->Alloc(static_cast<size_t>(n) * es));
    }
    for (auto [buf, n] : Sized{{&ldq_, nq_}, {&ldk_, nkv_}, {&ldv_, nkv_}}) {
      RETURN_IF_ERROR(buf->Alloc(static_cast<size_t>(n) * 4));
    }
    RETURN_IF_ERROR(lse_.Alloc(static_cast<size_t>(b * spec_.q_heads() * s) * 4));
    RETURN_IF_ERROR(delta_.Alloc(lse_.bytes));
    // Random inputs, generated on the host once.
    int seed = 1;
    using Kinds = std::initializer_list<std::pair<DeviceBuffer*, v1::TensorKind>>;
    for (auto [buf, kind] : Kinds{{&q_, v1::TENSOR_Q}, {&k_, v1::TENSOR_K}, {&v_, v1::TENSOR_V},
                                  {&do_, v1::TENSOR_DO}}) {
      ASSIGN_OR_RETURN(client::HostTensor h, client::MakeTensor(spec_, kind));
      client::FillRandom(static_cast<uint64_t>(seed++), &h);
      RETURN_IF_ERROR(Cuda(cudaMemcpy(buf->p, h.data(), buf->bytes, cudaMemcpyHostToDevice),
                           "upload inputs"));
    }
    BackendOptions bo;
    bo.device = device_;
    ASSIGN_OR_RETURN(backend_, CreateBackend("cudnn", bo));
    return absl::OkStatus();
  }

  DeviceTensor Ref(const DeviceBuffer& b, int heads, DType t) const {
    return DeviceTensor::Dense(b.p, t, {spec_.batch(), spec_.seq_len(), heads, spec_.head_dim()});
  }
  TensorView View(const DeviceBuffer& b, int heads, DType t) const {
    TensorView v;
    v.data = b.p;
    v.dtype = t;
    v.batch = spec_.batch();
    v.rows = spec_.seq_len();
    v.heads = heads;
    v.head_dim = spec_.head_dim();
    return v;
  }
  RowStatView Stats(const DeviceBuffer& b) const {
    RowStatView s;
    s.data = static_cast<float*>(b.p);
    s.batch = spec_.batch();
    s.heads = spec_.q_heads();
    s.rows = spec_.seq_len();
    return s;
  }

  // The same layer in this process: the kernels' backend on the buffers, nothing moved.
  absl::StatusOr<Round> Local() {
    const int hq = spec_.q_heads(), hkv = spec_.kv_heads();
    ForwardArgs fa;
    fa.scale = client::EffectiveScale(spec_);
    fa.mask = spec_.causal() ? MaskKind::kCausal : MaskKind::kFull;
    fa.q = View(q_, hq, dtype_);
    fa.k = View(k_, hkv, dtype_);
    fa.v = View(v_, hkv, dtype_);
    fa.out = View(lo_, hq, dtype_);
    fa.lse = Stats(lse_);
    BackwardArgs ba;
    ba.scale = fa.scale;
    ba.mask = fa.mask;
    ba.q = fa.q;
    ba.k = fa.k;
    ba.v = fa.v;
    ba.dout = View(do_, hq, dtype_);
    ba.lse = fa.lse;
    ba.delta = Stats(delta_);
    ba.out = fa.out;
    ba.dq = View(ldq_, hq, DType::kF32);
    ba.dk = View(ldk_, hkv, DType::kF32);
    ba.dv = View(ldv_, hkv, DType::kF32);
    RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    const absl::Time t = absl::Now();
    RETURN_IF_ERROR(backend_->Forward(fa));
    RETURN_IF_ERROR(backend_->ComputeDelta(ba.dout, fa.out, ba.delta, nullptr));
    for (const DeviceBuffer* g : {&ldq_, &ldk_, &ldv_}) {
      RETURN_IF_ERROR(backend_->Memset(g->p, 0, g->bytes, nullptr));
    }
    RETURN_IF_ERROR(backend_->Backward(ba));
    RETURN_IF_ERROR(backend_->Synchronize(nullptr));
    Round r;
    r.step = r.compute = absl::ToDoubleSeconds(absl::Now() - t);
    return r;
  }

  absl::StatusOr<Round> Ipc() {
    if (!ipc_) {
      client::AttentionJobOptions o;
      o.session.spec = spec_;
      ipc_ = std::make_unique<client::DeviceAttentionJob>(client_, o);
    }
    const int hq = spec_.q_heads(), hkv = spec_.kv_heads();
    const DeviceTensor dq = Ref(dq_, hq, dtype_), dk = Ref(dk_, hkv, dtype_),
                       dv = Ref(dv_, hkv, dtype_), o = Ref(o_, hq, dtype_);
    RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    const absl::Time t = absl::Now();
    RETURN_IF_ERROR(
        ipc_->Forward(Ref(q_, hq, dtype_), Ref(k_, hkv, dtype_), Ref(v_, hkv, dtype_), &o)
            .status());
    const client::DevicePhaseTimes f = ipc_->last_times();
    RETURN_IF_ERROR(ipc_->Backward(Ref(do_, hq, dtype_), dq, dk, dv).status());
    const client::DevicePhaseTimes b = ipc_->last_times();
    Round r;
    r.step = absl::ToDoubleSeconds(absl::Now() - t);
    r.transfer = f.transfer + b.transfer;
    r.compute = f.compute() + b.compute();
    r.control = f.control() + b.control();
    r.ipc_bytes = f.bytes + b.bytes;
    return r;
  }

  // A host path: the device tensors copied to host memory, the C++ AttentionJob over shared
  // memory or gRPC, the results copied back into the device buffers.
  absl::StatusOr<Round> Host(client::TransferPath path) {
    std::unique_ptr<client::AttentionJob>& job = host_[static_cast<int>(path)];
    if (!job) {
      client::AttentionJobOptions o;
      o.session.spec = spec_;
      o.transfer.path = path;
      o.download_lse = false;
      job = std::make_unique<client::AttentionJob>(client_, o);
      using Kinds = std::initializer_list<std::pair<client::HostTensor*, v1::TensorKind>>;
      for (auto [t, kind] : Kinds{{&hq_, v1::TENSOR_Q}, {&hk_, v1::TENSOR_K},
                                  {&hv_, v1::TENSOR_V}, {&hdo_, v1::TENSOR_DO}}) {
        ASSIGN_OR_RETURN(*t, client::MakeTensor(spec_, kind));
      }
    }
    RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    const absl::Time t = absl::Now();
    using Pairs = std::initializer_list<std::pair<client::HostTensor*, DeviceBuffer*>>;
    for (auto [h, d] : Pairs{{&hq_, &q_}, {&hk_, &k_}, {&hv_, &v_}}) {
      RETURN_IF_ERROR(Cuda(cudaMemcpy(h->data(), d->p, d->bytes, cudaMemcpyDeviceToHost), "d2h"));
    }
    v1::Job fj, bj;
    ASSIGN_OR_RETURN(client::ForwardOutputs fo, job->Forward(hq_, hk_, hv_, &fj));
    RETURN_IF_ERROR(Cuda(cudaMemcpy(o_.p, fo.o.data(), o_.bytes, cudaMemcpyHostToDevice), "h2d"));
    RETURN_IF_ERROR(Cuda(cudaMemcpy(hdo_.data(), do_.p, do_.bytes, cudaMemcpyDeviceToHost), "d2h"));
    ASSIGN_OR_RETURN(client::BackwardOutputs bo, job->Backward(hdo_, &bj));
    for (auto [h, d] : Pairs{{&bo.dq, &dq_}, {&bo.dk, &dk_}, {&bo.dv, &dv_}}) {
      if (static_cast<size_t>(h->size_bytes()) != d->bytes) {
        return absl::InternalError(absl::StrCat("gradient of ", h->size_bytes(), " bytes, buffer ",
                                                d->bytes));
      }
      RETURN_IF_ERROR(Cuda(cudaMemcpy(d->p, h->data(), d->bytes, cudaMemcpyHostToDevice), "h2d"));
    }
    Round r;
    r.step = absl::ToDoubleSeconds(absl::Now() - t);
    r.compute = fj.wall_seconds() + bj.wall_seconds();
    r.transfer = r.step - r.compute;
    return r;
  }

  // The service's outputs now in o_, dq_, dk_, dv_ against the local ones.
  absl::StatusOr<double> Error() {
    double worst = 0;
    struct Pair {
      const DeviceBuffer* got;
      const DeviceBuffer* ref;
      int64_t n;
      DType ref_type;
    };
    for (const Pair& p : {Pair{&o_, &lo_, nq_, dtype_}, Pair{&dq_, &ldq_, nq_, DType::kF32},
                          Pair{&dk_, &ldk_, nkv_, DType::kF32},
                          Pair{&dv_, &ldv_, nkv_, DType::kF32}}) {
      ASSIGN_OR_RETURN(std::vector<float> got, Fetch(p.got->p, p.n, dtype_));
      ASSIGN_OR_RETURN(std::vector<float> ref, Fetch(p.ref->p, p.n, p.ref_type));
      worst = std::max(worst, RelError(got, ref));
    }
    return worst;
  }

  void Release() {
    if (ipc_) (void)ipc_->Release();
    for (auto& j : host_) {
      if (j) (void)j->Release();
    }
  }

 private:
  client::Client* client_;
  v1::AttentionSpec spec_;
  int device_;
  DType dtype_ = DType::kBF16;
  int64_t nq_ = 0, nkv_ = 0;
  DeviceBuffer q_, k_, v_, do_, o_, dq_, dk_, dv_, lo_, ldq_, ldk_, ldv_, lse_, delta_;
  std::unique_ptr<AttentionBackend> backend_;
  std::unique_ptr<client::DeviceAttentionJob> ipc_;
  std::unique_ptr<client::AttentionJob> host_[3];
  client::HostTensor hq_, hk_, hv_, hdo_;
};

double TargetFor(int64_t seq) { return seq >= 65536 ? 1.05 : 1.30; }

absl::Status BenchSeq(client::Client* c, v1::AttentionSpec spec, int rounds,
                      const std::vector<std::string>& paths, int64_t host_max_seq) {
  OffloadLayer layer(c, spec, 0);
  RETURN_IF_ERROR(layer.Init());
  std::vector<WayResult> ways;
  ways.push_back({"local", {}, 0});
  for (const std::string& p : paths) {
    if (p == "ipc" || spec.seq_len() <= host_max_seq) ways.push_back({p, {}, 0});
  }
  auto run = [&](const std::string& way) -> absl::StatusOr<Round> {
    if (way == "local") return layer.Local();
    if (way == "ipc") return layer.Ipc();
    return layer.Host(way == "shm" ? client::TransferPath::kSharedMemory
                                   : client::TransferPath::kGrpc);
  };
  absl::Status st;
  for (WayResult& w : ways) {  // warm-up: sessions, mapped handles, plans; the errors
    auto r = run(w.way);
    if (!r.ok()) {
      st = absl::Status(r.status().code(), absl::StrCat(w.way, ": ", r.status().message()));
      break;
    }
    if (w.way != "local") {
      auto e = layer.Error();
      if (!e.ok()) {
        st = e.status();
        break;
      }
      w.error = *e;
    }
  }
  for (int i = 0; st.ok() && i < rounds; ++i) {
    for (WayResult& w : ways) {  // alternating
      auto r = run(w.way);
      if (!r.ok()) {
        st = absl::Status(r.status().code(), absl::StrCat(w.way, ": ", r.status().message()));
        break;
      }
      w.rounds.push_back(*r);
    }
  }
  layer.Release();
  RETURN_IF_ERROR(st);
  const double local = ways[0].Best();
  std::printf("S=%-7lld local (this process, cudnn backend) %9.2f ms (median %.2f)\n",
              static_cast<long long>(spec.seq_len()), 1e3 * local, 1e3 * ways[0].Median());
  for (size_t i = 1; i < ways.size(); ++i) {
    const WayResult& w = ways[i];
    const Round& b = w.BestRound();
    const double ratio = w.Best() / local;
    std::printf("  %-5s %9.2f ms (median %.2f) = %.3fx local | transfer %.2f ms, compute %.2f ms",
                w.way.c_str(), 1e3 * w.Best(), 1e3 * w.Median(), ratio, 1e3 * b.transfer,
                1e3 * b.compute);
    if (w.way == "ipc") {
      std::printf(", control plane %.2f ms, %.2f GB moved | target <= %.2fx: %s", 1e3 * b.control,
                  b.ipc_bytes / 1e9, TargetFor(spec.seq_len()),
                  ratio <= TargetFor(spec.seq_len()) ? "met" : "NOT met");
    }
    std::printf(" | max rel. error vs local %.2e%s\n", w.error,
                w.error <= 2e-2 ? "" : " (TOO LARGE)");
  }
  std::fflush(stdout);
  for (size_t i = 1; i < ways.size(); ++i) {
    if (ways[i].error > 2e-2) {
      return absl::InternalError(absl::StrCat(ways[i].way, " output differs from the local one by ",
                                              ways[i].error, " (relative)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOffloadBench(Args& args) {
  ASSIGN_OR_RETURN(std::string coordinator, args.GetString("coordinator", ""));
  ASSIGN_OR_RETURN(std::string bin_dir, args.GetString("bin-dir", ""));
  ASSIGN_OR_RETURN(std::string backend, args.GetString("backend", "cudnn"));
  ASSIGN_OR_RETURN(std::string memory, args.GetString("worker-memory", "0.5"));
  ASSIGN_OR_RETURN(std::string seqs_text, args.GetString("seqs", "16K,64K,256K"));
  ASSIGN_OR_RETURN(int64_t batch, args.GetInt("batch", 1, 1, 1024));
  ASSIGN_OR_RETURN(int64_t heads, args.GetInt("heads", 32, 1, 1024));
  ASSIGN_OR_RETURN(int64_t kv_heads, args.GetInt("kv-heads", 8, 1, 1024));
  ASSIGN_OR_RETURN(int64_t head_dim, args.GetInt("head-dim", 128, 1, 1024));
  ASSIGN_OR_RETURN(std::string dtype_name, args.GetString("dtype", "bf16"));
  ASSIGN_OR_RETURN(int64_t rounds, args.GetInt("rounds", 5, 1, 1000));
  ASSIGN_OR_RETURN(std::string paths_text, args.GetString("paths", "ipc,shm,grpc"));
  ASSIGN_OR_RETURN(int64_t host_max_seq, args.GetInt("host-max-seq", 65536, 0, int64_t{1} << 40));
  ASSIGN_OR_RETURN(bool full, args.GetBool("full", false));
  ASSIGN_OR_RETURN(RpcSecurityOptions security, ParseSecurityFlags(args));
  (void)args.GetBool("offload", true);
  RETURN_IF_ERROR(args.CheckNoUnknown());
  std::vector<int64_t> seqs;
  for (absl::string_view s : absl::StrSplit(seqs_text, ',', absl::SkipEmpty())) {
    ASSIGN_OR_RETURN(int64_t n, ParseCount("--seqs", std::string(s)));
    if (n <= 0) return absl::InvalidArgumentError("--seqs: lengths must be > 0");
    seqs.push_back(n);
  }
  if (seqs.empty()) return absl::InvalidArgumentError("--seqs: give at least one length");
  std::vector<std::string> paths;
  for (absl::string_view p : absl::StrSplit(paths_text, ',', absl::SkipEmpty())) {
    if (p != "ipc" && p != "shm" && p != "grpc") {
      return absl::InvalidArgumentError(
          absl::StrCat("--paths: '", p, "' is not ipc, shm or grpc"));
    }
    paths.emplace_back(p);
  }
  ASSIGN_OR_RETURN(v1::DType dtype, client::ParseDType(dtype_name));
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError("dfa bench --offload: no CUDA device on this host");
  }
  std::unique_ptr<client::LocalCluster> local;
  if (coordinator.empty()) {
    client::LocalClusterOptions lo;
    lo.workers = 1;
    lo.backend = backend;
    lo.bin_dir = bin_dir;
    lo.security = security;
    lo.worker_args = {absl::StrCat("--device_memory_limit=", memory)};
    ASSIGN_OR_RETURN(local, client::LocalCluster::Start(lo));
    coordinator = local->coordinator_address();
  }
  client::ClientOptions co;
  co.coordinator = coordinator;
  co.security = security;
  ASSIGN_OR_RETURN(auto c, client::Client::Connect(co));
  cudaDeviceProp prop;
  (void)cudaGetDeviceProperties(&prop, 0);
  std::printf("offload bench: %s; %s worker(s), --device_memory_limit=%s; B=%lld Hq=%lld "
              "Hkv=%lld D=%lld %s %s, %lld alternating rounds, best (median)\n",
              prop.name, local ? backend.c_str() : "the cluster's", memory.c_str(),
              static_cast<long long>(batch), static_cast<long long>(heads),
              static_cast<long long>(kv_heads), static_cast<long long>(head_dim),
              dtype_name.c_str(), full ? "full" : "causal", static_cast<long long>(rounds));
  absl::Status st;
  for (int64_t seq : seqs) {
    v1::AttentionSpec spec;
    spec.set_batch(static_cast<int>(batch));
    spec.set_seq_len(seq);
    spec.set_q_heads(static_cast<int>(heads));
    spec.set_kv_heads(static_cast<int>(kv_heads));
    spec.set_head_dim(static_cast<int>(head_dim));
    spec.set_dtype(dtype);
    spec.set_causal(!full);
    st = BenchSeq(c.get(), spec, static_cast<int>(rounds), paths, host_max_seq);
    if (!st.ok()) break;
  }
  if (local) {
    absl::Status stop = local->Stop();
    if (st.ok()) st = stop;
  }
  return st;
}
#endif

}  // namespace dfa::cli
