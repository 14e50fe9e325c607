#include "core/planner/plan_proto.h"

#include "absl/strings/str_cat.h"

namespace dfa {
namespace {

void RowsToProto(const RowRange& r, v1::RowRange* out) {
  out->set_begin(r.begin);
  out->set_end(r.end);
}

absl::StatusOr<RowRange> RowsFromProto(const v1::RowRange& r, const std::string& field) {
  if (r.begin() < 0 || r.end() < r.begin()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": bad row range [", r.begin(), ", ", r.end(), ")"));
  }
  return RowRange{r.begin(), r.end()};
}

void StepsToProto(const std::vector<PlanStep>& steps,
                  google::protobuf::RepeatedPtrField<v1::PlanStep>* out) {
  for (const PlanStep& s : steps) {
    v1::PlanStep* ps = out->Add();
    for (const Transfer& x : s.sends) {
      v1::PlanTransfer* t = ps->add_sends();
      t->set_peer(x.peer);
      t->set_tensor(static_cast<v1::PlanTensor>(x.tensor));
      RowsToProto(x.rows, t->mutable_rows());
      t->set_lead(x.lead);
    }
    for (const Transfer& x : s.recvs) {
      v1::PlanTransfer* t = ps->add_recvs();
      t->set_peer(x.peer);
      t->set_tensor(static_cast<v1::PlanTensor>(x.tensor));
      RowsToProto(x.rows, t->mutable_rows());
      t->set_lead(x.lead);
    }
    for (const ComputeOp& c : s.computes) {
      v1::PlanCompute* pc = ps->add_computes();
      RowsToProto(c.q_rows, pc->mutable_q_rows());
      RowsToProto(c.kv_rows, pc->mutable_kv_rows());
    }
  }
}

absl::StatusOr<Transfer> TransferFromProto(const v1::PlanTransfer& t, const std::string& field) {
  if (t.peer() < 0) return absl::InvalidArgumentError(absl::StrCat(field, ".peer is negative"));
  if (t.tensor() < v1::PLAN_Q || t.tensor() > v1::PLAN_DKV_PARTIAL) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".tensor: unknown kind ", t.tensor()));
  }
  ASSIGN_OR_RETURN(RowRange rows, RowsFromProto(t.rows(), field + ".rows"));
  if (t.lead() < 0) return absl::InvalidArgumentError(absl::StrCat(field, ".lead is negative"));
  return Transfer{t.peer(), static_cast<PlanTensor>(t.tensor()), rows, t.lead()};
}

absl::StatusOr<std::vector<PlanStep>> StepsFromProto(
    const google::protobuf::RepeatedPtrField<v1::PlanStep>& steps, const std::string& field) {
  std::vector<PlanStep> out;
  for (int i = 0; i < steps.size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    PlanStep s;
    for (int j = 0; j < steps[i].sends_size(); ++j) {
      ASSIGN_OR_RETURN(Transfer x, TransferFromProto(steps[i].sends(j), absl::StrCat(f, ".sends[", j, "]")));
      s.sends.push_back(x);
    }
    for (int j = 0; j < steps[i].recvs_size(); ++j) {
      ASSIGN_OR_RETURN(Transfer x, TransferFromProto(steps[i].recvs(j), absl::StrCat(f, ".recvs[", j, "]")));
      s.recvs.push_back(x);
    }
    for (int j = 0; j < steps[i].computes_size(); ++j) {
      const std::string cf = absl::StrCat(f, ".computes[", j, "]");
      ASSIGN_OR_RETURN(RowRange q, RowsFromProto(steps[i].computes(j).q_rows(), cf + ".q_rows"));
      ASSIGN_OR_RETURN(RowRange kv, RowsFromProto(steps[i].computes(j).kv_rows(), cf + ".kv_rows"));
      s.computes.push_back(ComputeOp{q, kv});
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

void PlanToProto(const Plan& plan, v1::Plan* out) {
  out->Clear();
  out->set_schedule(plan.schedule);
  out->set_seq_len(plan.seq_len);
  out->set_causal(plan.causal);
  for (const WorkerPlan& w : plan.workers) {
    v1::WorkerPlan* pw = out->add_workers();
    for (const RowRange& r : w.owned) RowsToProto(r, pw->add_owned());
    StepsToProto(w.forward, pw->mutable_forward_steps());
    StepsToProto(w.backward, pw->mutable_backward_steps());
    if (!w.kv_heads.empty()) {
      pw->mutable_kv_heads()->set_begin(w.kv_heads.begin);
      pw->mutable_kv_heads()->set_end(w.kv_heads.end);
    }
  }
}

absl::StatusOr<Plan> PlanFromProto(const v1::Plan& proto) {
  Plan plan;
  plan.schedule = proto.schedule();
  plan.seq_len = proto.seq_len();
  plan.causal = proto.causal();
  if (plan.seq_len < 1) return absl::InvalidArgumentError("plan.seq_len must be >= 1");
  for (int w = 0; w < proto.workers_size(); ++w) {
    const v1::WorkerPlan& pw = proto.workers(w);
    const std::string f = absl::StrCat("plan.workers[", w, "]");
    WorkerPlan wp;
    for (int i = 0; i < pw.owned_size(); ++i) {
      ASSIGN_OR_RETURN(RowRange r, RowsFromProto(pw.owned(i), absl::StrCat(f, ".owned[", i, "]")));
      wp.owned.push_back(r);
    }
    ASSIGN_OR_RETURN(wp.forward, StepsFromProto(pw.forward_steps(), f + ".forward_steps"));
    ASSIGN_OR_RETURN(wp.backward, StepsFromProto(pw.backward_steps(), f + ".backward_steps"));
    if (pw.has_kv_heads() && pw.kv_heads().end() != 0) {
      if (pw.kv_heads().begin() < 0 || pw.kv_heads().end() <= pw.kv_heads().begin()) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".kv_heads = [", pw.kv_heads().begin(),
                                                       ", ", pw.kv_heads().end(),
                                                       ") must be a non-empty range >= 0"));
      }
      wp.kv_heads = {pw.kv_heads().begin(), pw.kv_heads().end()};
    }
    plan.workers.push_back(std::move(wp));
  }
  return plan;
}

}  // namespace dfa
