#include "worker/executor/simulator.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/planner/plan_checker.h"
#include "worker/executor/memory_tracking_backend.h"
#include "worker/transport/inproc_transport.h"

namespace dfa {
namespace {

// Heads [h0, h0 + n) of a whole-sequence [B, S, heads, D] tensor (strided rows).
TensorView Global(const std::vector<float>& data, const AttentionShape& s, int64_t seq, int heads,
                  int h0, int n) {
  TensorView v;
  v.data = const_cast<float*>(data.data()) + int64_t{h0} * s.head_dim;
  v.dtype = DType::kF32;
  v.batch = s.batch;
  v.rows = seq;
  v.heads = n;
  v.head_dim = s.head_dim;
  v.row_stride = int64_t{heads} * s.head_dim;
  v.batch_stride = seq * v.row_stride;
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

// Streamed passes (SimulationOptions::streamed): the inputs are all there.
class PresentInputs final : public InputGate {
 public:
  absl::Status WaitRows(InputTensor, const RowRange&, absl::Duration,
                        const std::atomic<bool>*) override {
    return absl::OkStatus();
  }
};

// Streamed passes: keeps the bytes of every row announced final, for Check at the pass's end.
class SnapshotOutputs final : public OutputGate {
 public:
  SnapshotOutputs(AttentionBackend* backend, const SessionStorage* storage)
      : backend_(backend), storage_(storage) {}
  void set_forward(bool forward) {
    forward_ = forward;
    snaps_.clear();
  }
  void RowsFinal(OutputSide side, const RowRange& rows) override {
    Snap snap{side, rows, {}};
    absl::StatusOr<int64_t> local = storage_->LocalRow(rows);
    if (!local.ok()) {
      error_ = local.status();
      return;
    }
    snap.bytes = Read(side, *local, rows.size());
    snaps_.push_back(std::move(snap));
  }
  // OK when every announced row still holds what it held when announced.
  absl::Status Check(int worker) const {
    RETURN_IF_ERROR(error_);
    for (const Snap& s : snaps_) {
      const int64_t local = *storage_->LocalRow(s.rows);
      if (Read(s.side, local, s.rows.size()) != s.bytes) {
        return absl::InternalError(absl::StrCat(
            "worker ", worker, " ", forward_ ? "forward" : "backward",
            s.side == OutputSide::kKeys ? " key" : " query", " rows [", s.rows.begin, ", ",
            s.rows.end, ") changed after they were announced final"));
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Snap {
    OutputSide side;
    RowRange rows;
    std::vector<uint8_t> bytes;
  };
  // The rows' bytes of every tensor of `side`: O and LSE (forward), dQ (in Q's slot), or dK, dV.
  std::vector<uint8_t> Read(OutputSide side, int64_t local, int64_t n) const {
    std::vector<TensorView> views;
    if (side == OutputSide::kKeys) {
      views = {storage_->dk(), storage_->dv()};
    } else {
      views = {forward_ ? storage_->o() : storage_->dq()};
    }
    std::vector<uint8_t> out;
    for (const TensorView& v : views) {
      const int64_t elem = DTypeSize(v.dtype);
      for (int b = 0; b < v.batch; ++b) {
        const size_t at = out.size(), bytes = static_cast<size_t>(n * v.RowStride() * elem);
        out.resize(at + bytes);
        const char* src = static_cast<const char*>(v.data) +
                          (b * v.BatchStride() + local * v.RowStride()) * elem;
        (void)backend_->Copy(out.data() + at, src, bytes,
                             AttentionBackend::CopyKind::kDeviceToHost, nullptr);
      }
    }
    if (forward_ && side == OutputSide::kQueries) {
      const RowStatView lse = storage_->lse();
      for (int b = 0; b < lse.batch; ++b) {
        for (int h = 0; h < lse.heads; ++h) {
          const size_t at = out.size(), bytes = static_cast<size_t>(n * 4);
          out.resize(at + bytes);
          const float* src = lse.data + b * lse.BatchStride() + h * lse.HeadStride() + local;
          (void)backend_->Copy(out.data() + at, src, bytes,
                               AttentionBackend::CopyKind::kDeviceToHost, nullptr);
        }
      }
    }
    return out;
  }

  AttentionBackend* const backend_;
  const SessionStorage* const storage_;
  bool forward_ = true;
  std::vector<Snap> snaps_;
  absl::Status error_;
};

absl::Status RunWorker(const Plan& plan, const AttentionShape& shape, const SimulationInputs& in,
                       const SimulationOptions& opt, std::unique_ptr<Transport> transport,
                       SimulationResult* out, int w) {
  BackendOptions bo;
  bo.num_threads = opt.threads_per_worker;
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> inner, CreateBackend(opt.backend, bo));
  auto backend = std::make_unique<MemoryTrackingBackend>(std::move(inner));
  // The worker's head slice (plan.h "Head groups"): kv heads [k0, k0 + nk), q heads [q0, q0 + nq).
  const HeadRange heads = WorkerKvHeads(plan.workers[w], shape.kv_heads);
  const int per_kv = shape.q_heads / shape.kv_heads;
  const int k0 = heads.begin, nk = heads.size(), q0 = k0 * per_kv, nq = nk * per_kv;
  AttentionShape local = shape;
  local.kv_heads = nk;
  local.q_heads = nq;
  CheckOptions check;
  check.shape = shape;
  ASSIGN_OR_RETURN(const CheckReport report, CheckPlan(plan, check));
  ASSIGN_OR_RETURN(const WorkerMemory memory,
                   PlanWorkerMemory(plan, w, local, report, opt.step_tokens, opt.transfer_cut));
  out->predicted_bytes[w] = memory.peak();
  ASSIGN_OR_RETURN(std::unique_ptr<SessionStorage> st,
                   SessionStorage::Create(backend.get(), local, plan.workers[w].owned,
                                          memory.layout));
  const int64_t S = plan.seq_len;
  const int hq = shape.q_heads, hk = shape.kv_heads;
  RETURN_IF_ERROR(Move(*backend, Global(in.q, shape, S, hq, q0, nq), st->q(), *st, true));
  RETURN_IF_ERROR(Move(*backend, Global(in.k, shape, S, hk, k0, nk), st->k(), *st, true));
  RETURN_IF_ERROR(Move(*backend, Global(in.v, shape, S, hk, k0, nk), st->v(), *st, true));
  ExecutorOptions eo;
  eo.softmax_scale = opt.softmax_scale;
  eo.step_timeout = opt.step_timeout;
  eo.step_tokens = opt.step_tokens;
  eo.transfer_cut = opt.transfer_cut;
  // A masked plan (documents, window): the interval arrays every unit reads, in the backend's
  // memory as a worker holds them (worker/session_mask.h: one block of q_lo, q_hi, k_lo, k_hi),
  // counted in the measured peak as in the charge (WorkerMemory::mask).
  std::unique_ptr<void, std::function<void(void*)>> mask_block(nullptr, [](void*) {});
  int64_t mask_bytes = 0;
  if (plan.mask() == MaskKind::kIntervals) {
    const MaskIntervalArrays a = BuildMaskIntervals(plan.Mask(), shape.batch, S);
    const size_t n = a.q_lo.size();
    mask_bytes = static_cast<int64_t>(4 * n * sizeof(int32_t));
    ASSIGN_OR_RETURN(void* p, backend->Alloc(static_cast<size_t>(mask_bytes)));
    mask_block = std::unique_ptr<void, std::function<void(void*)>>(
        p, [b = backend.get()](void* q) { b->Free(q); });
    int32_t* base = static_cast<int32_t*>(p);
    const std::vector<int32_t>* arrays[] = {&a.q_lo, &a.q_hi, &a.k_lo, &a.k_hi};
    for (int i = 0; i < 4; ++i) {
      RETURN_IF_ERROR(backend->Copy(base + i * n, arrays[i]->data(), n * sizeof(int32_t),
                                    AttentionBackend::CopyKind::kHostToDevice, nullptr));
    }
    eo.mask_intervals = {base, base + n, base + 2 * n, base + 3 * n, a.seq};
  }
  PresentInputs present;
  SnapshotOutputs announced(backend.get(), st.get());
  if (opt.streamed) {
    eo.inputs = &present;
    eo.outputs = &announced;
  }
  PlanExecutor ex(backend.get(), transport.get(), st.get(), eo);
  // Measured from here: the session's storage and what its passes allocate.
  ASSIGN_OR_RETURN(out->forward[w], ex.RunForward(plan));
  RETURN_IF_ERROR(announced.Check(w));
  out->peak_bytes[w] = backend->peak_bytes();
  out->forward_peak_bytes[w] = backend->peak_bytes() - st->bytes() - mask_bytes;
  RETURN_IF_ERROR(Move(*backend, Global(out->out, shape, S, hq, q0, nq), st->o(), *st, false));
  // LSE: [B, Hq, S] global from [B, nq, rows] local, range by range.
  int64_t at = 0;
  for (const RowRange& r : st->owned()) {
    for (int b = 0; b < shape.batch; ++b) {
      for (int h = 0; h < nq; ++h) {
        const int64_t global = (int64_t{b} * hq + q0 + h) * S + r.begin;
        const int64_t local_row = (int64_t{b} * nq + h) * st->rows() + at;
        for (int64_t i = 0; i < r.size(); ++i) {
          out->lse[global + i] = st->lse().data[local_row + i];
        }
      }
    }
    at += r.size();
  }
  if (in.dout.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Move(*backend, Global(in.dout, shape, S, hq, q0, nq), st->dout(), *st, true));
  backend->ResetPeak();
  announced.set_forward(false);
  ASSIGN_OR_RETURN(out->backward[w], ex.RunBackward(plan));
  RETURN_IF_ERROR(announced.Check(w));
  out->peak_bytes[w] = std::max(out->peak_bytes[w], backend->peak_bytes());
  out->backward_peak_bytes[w] = backend->peak_bytes() - st->bytes() - mask_bytes;
  RETURN_IF_ERROR(Move(*backend, Global(out->dq, shape, S, hq, q0, nq), st->dq(), *st, false));
  RETURN_IF_ERROR(Move(*backend, Global(out->dk, shape, S, hk, k0, nk), st->dk(), *st, false));
  RETURN_IF_ERROR(Move(*backend, Global(out->dv, shape, S, hk, k0, nk), st->dv(), *st, false));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Plan& plan, const AttentionShape& shape,
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
  for (int w = 0; w < P; ++w) {
    const HeadRange h = plan.workers[w].kv_heads;
    if (!h.empty() && (h.begin < 0 || h.end > shape.kv_heads)) {
      return absl::InvalidArgumentError(absl::StrCat("plan.workers[", w, "].kv_heads [", h.begin,
                                                     ", ", h.end, ") outside [0, ",
                                                     shape.kv_heads, ") (shape.kv_heads)"));
    }
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
  res.peak_bytes.assign(P, 0);
  res.forward_peak_bytes.assign(P, 0);
  res.backward_peak_bytes.assign(P, 0);
  res.predicted_bytes.assign(P, 0);
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
