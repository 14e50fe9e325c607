#include "worker/executor/simulator.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/executor/inproc_transport.h"

namespace dfa {
namespace {

TensorView Global(const std::vector<float>& data, const SessionShape& s, int64_t seq, int heads) {
  TensorView v;
  v.data = const_cast<float*>(data.data());
  v.dtype = DType::kF32;
  v.batch = s.batch;
  v.rows = seq;
  v.heads = heads;
  v.head_dim = s.head_dim;
  return v;
}

// Copies (converting) between the owned rows of a whole-sequence tensor and local storage.
absl::Status Move(AttentionBackend& b, const TensorView& global, const TensorView& local,
                  const SessionStorage& st, bool to_local) {
  int64_t at = 0;
  for (const RowRange& r : st.owned()) {
    TensorView g = global.Slice(r.begin, r.size());
    TensorView l = local.Slice(at, r.size());
    RETURN_IF_ERROR(to_local ? b.Convert(g, l, nullptr) : b.Convert(l, g, nullptr));
    at += r.size();
  }
  return absl::OkStatus();
}

absl::Status RunWorker(const Plan& plan, const SessionShape& shape, const SimulationInputs& in,
                       const SimulationOptions& opt, std::unique_ptr<Transport> transport,
                       SimulationResult* out, int w) {
  BackendOptions bo;
  bo.num_threads = opt.threads_per_worker;
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> backend, CreateBackend(opt.backend, bo));
  ASSIGN_OR_RETURN(std::unique_ptr<SessionStorage> st,
                   SessionStorage::Create(backend.get(), shape, plan.workers[w].owned));
  const int64_t S = plan.seq_len;
  const int hq = shape.q_heads, hk = shape.kv_heads;
  RETURN_IF_ERROR(Move(*backend, Global(in.q, shape, S, hq), st->q(), *st, true));
  RETURN_IF_ERROR(Move(*backend, Global(in.k, shape, S, hk), st->k(), *st, true));
  RETURN_IF_ERROR(Move(*backend, Global(in.v, shape, S, hk), st->v(), *st, true));
  ExecutorOptions eo;
  eo.softmax_scale = opt.softmax_scale;
  eo.step_timeout = opt.step_timeout;
  PlanExecutor ex(backend.get(), transport.get(), st.get(), eo);
  ASSIGN_OR_RETURN(out->forward[w], ex.RunForward(plan));
  RETURN_IF_ERROR(Move(*backend, Global(out->out, shape, S, hq), st->o(), *st, false));
  // LSE: [B, Hq, S] global from [B, Hq, rows] local, range by range.
  int64_t at = 0;
  for (const RowRange& r : st->owned()) {
    for (int64_t bh = 0; bh < int64_t{shape.batch} * hq; ++bh) {
      for (int64_t i = 0; i < r.size(); ++i) {
        out->lse[bh * S + r.begin + i] = st->lse().data[bh * st->rows() + at + i];
      }
    }
    at += r.size();
  }
  if (in.dout.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Move(*backend, Global(in.dout, shape, S, hq), st->dout(), *st, true));
  ASSIGN_OR_RETURN(out->backward[w], ex.RunBackward(plan));
  RETURN_IF_ERROR(Move(*backend, Global(out->dq, shape, S, hq), st->dq(), *st, false));
  RETURN_IF_ERROR(Move(*backend, Global(out->dk, shape, S, hk), st->dk(), *st, false));
  RETURN_IF_ERROR(Move(*backend, Global(out->dv, shape, S, hk), st->dv(), *st, false));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Plan& plan, const SessionShape& shape,
                                          const SimulationInputs& in,
                                          const SimulationOptions& opt) {
  RETURN_IF_ERROR(shape.Validate());
  const int P = plan.num_workers();
  if (P < 1) return absl::InvalidArgumentError("plan has no workers");
  const int64_t S = plan.seq_len;
  const size_t nq = static_cast<size_t>(int64_t{shape.batch} * S * shape.q_heads * shape.head_dim);
  const size_t nk = static_cast<size_t>(int64_t{shape.batch} * S * shape.kv_heads * shape.head_dim);
  if (in.q.size() != nq) return absl::InvalidArgumentError(absl::StrCat("inputs.q: ", in.q.size(), " values, expected ", nq));
  if (in.k.size() != nk) return absl::InvalidArgumentError(absl::StrCat("inputs.k: ", in.k.size(), " values, expected ", nk));
  if (in.v.size() != nk) return absl::InvalidArgumentError(absl::StrCat("inputs.v: ", in.v.size(), " values, expected ", nk));
  if (!in.dout.empty() && in.dout.size() != nq) {
    return absl::InvalidArgumentError(absl::StrCat("inputs.dout: ", in.dout.size(), " values, expected ", nq));
  }
  SimulationResult res;
  res.out.assign(nq, 0.f);
  res.lse.assign(static_cast<size_t>(int64_t{shape.batch} * shape.q_heads * S), 0.f);
  if (!in.dout.empty()) {
    res.dq.assign(nq, 0.f);
    res.dk.assign(nk, 0.f);
    res.dv.assign(nk, 0.f);
  }
  res.forward.resize(P);
  res.backward.resize(P);
  ASSIGN_OR_RETURN(std::shared_ptr<InprocHub> hub, CreateInprocHub(P));
  std::vector<absl::Status> status(P);
  std::vector<std::thread> threads;
  for (int w = 0; w < P; ++w) {
    ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, CreateInprocTransport(hub, w));
    threads.emplace_back([&, w, t = std::move(t)]() mutable {
      status[w] = RunWorker(plan, shape, in, opt, std::move(t), &res, w);
      if (!status[w].ok()) AbortInprocHub(*hub);  // let the others fail fast
    });
  }
  for (std::thread& t : threads) t.join();
  // Report the root cause, not the CANCELLED of the workers aborted after it.
  for (const absl::Status& s : status) {
    if (!s.ok() && !absl::IsCancelled(s)) return s;
  }
  for (const absl::Status& s : status) RETURN_IF_ERROR(s);
  return res;
}

}  // namespace dfa
