#include "coordinator/session_plan.h"

#include "absl/strings/str_cat.h"
#include "coordinator/spec_validation.h"

namespace dfa {
namespace {

struct Ring {
  int64_t seq_len;
  bool causal;
  int p;

  v1::RowRange Chunk(int i) const {
    v1::RowRange r;
    r.set_begin(seq_len * i / p);
    r.set_end(seq_len * (i + 1) / p);
    return r;
  }
  int Mod(int i) const { return ((i % p) + p) % p; }
  // Worker w at step t >= 1 computes against chunk w - t (wrapping); causal needs w - t >= 0.
  bool Computes(int w, int t) const { return !causal || w - t >= 0; }
};

void AddTransfer(google::protobuf::RepeatedPtrField<v1::PlanTransfer>* list, int peer,
                 v1::PlanTensor tensor, const v1::RowRange& rows) {
  v1::PlanTransfer* t = list->Add();
  t->set_peer(peer);
  t->set_tensor(tensor);
  *t->mutable_rows() = rows;
}

void AddCompute(v1::PlanStep* step, const v1::RowRange& q, const v1::RowRange& kv) {
  v1::PlanCompute* c = step->add_computes();
  *c->mutable_q_rows() = q;
  *c->mutable_kv_rows() = kv;
}

}  // namespace

v1::Plan FallbackRingPlan(int64_t seq_len, bool causal, int num_workers) {
  const Ring ring{seq_len, causal, num_workers};
  const int p = num_workers;
  v1::Plan plan;
  plan.set_schedule("ring");
  plan.set_seq_len(seq_len);
  plan.set_causal(causal);
  for (int w = 0; w < p; ++w) {
    v1::WorkerPlan* wp = plan.add_workers();
    *wp->add_owned() = ring.Chunk(w);
    const int next = ring.Mod(w + 1), prev = ring.Mod(w - 1);
    // Forward: step 0 the diagonal; step t receives chunk w-t's K/V from the left neighbour
    // and forwards chunk w-t+1's (its own at t = 1) to the right.
    for (int t = 0; t < p; ++t) {
      v1::PlanStep* step = wp->add_forward_steps();
      if (t > 0) {
        AddTransfer(step->mutable_sends(), next, v1::PLAN_KV, ring.Chunk(ring.Mod(w - t + 1)));
        AddTransfer(step->mutable_recvs(), prev, v1::PLAN_KV, ring.Chunk(ring.Mod(w - t)));
      }
      if (t == 0 || ring.Computes(w, t)) AddCompute(step, ring.Chunk(w), ring.Chunk(ring.Mod(w - t)));
    }
    // Backward: the same K/V rotation; the dK/dV partial of chunk w-t+1 computed at step t-1
    // goes to its owner at step t; one extra step returns the last partials.
    for (int t = 0; t <= p; ++t) {
      v1::PlanStep* step = wp->add_backward_steps();
      if (t > 0 && t < p) {
        AddTransfer(step->mutable_sends(), next, v1::PLAN_KV, ring.Chunk(ring.Mod(w - t + 1)));
        AddTransfer(step->mutable_recvs(), prev, v1::PLAN_KV, ring.Chunk(ring.Mod(w - t)));
      }
      if (t >= 2 && ring.Computes(w, t - 1)) {
        const int owner = ring.Mod(w - t + 1);
        AddTransfer(step->mutable_sends(), owner, v1::PLAN_DKV_PARTIAL, ring.Chunk(owner));
      }
      if (t >= 2) {
        const int helper = w + t - 1;  // computed (helper, w) at step t-1
        if (helper < p || !causal) {
          AddTransfer(step->mutable_recvs(), ring.Mod(helper), v1::PLAN_DKV_PARTIAL,
                      ring.Chunk(w));
        }
      }
      if (t == 0 || (t < p && ring.Computes(w, t))) {
        AddCompute(step, ring.Chunk(w), ring.Chunk(ring.Mod(w - t)));
      }
    }
  }
  return plan;
}

absl::StatusOr<v1::Plan> MakeSessionPlan(const v1::AttentionSpec& spec, absl::string_view schedule,
                                         const std::vector<double>& speeds) {
  RETURN_IF_ERROR(ValidateSchedule(schedule));
  if (speeds.empty()) return absl::InvalidArgumentError("num_workers: no workers to plan for");
  const int p = static_cast<int>(speeds.size());
  // Planner not linked yet: every schedule falls back to the ring, which is correct for any P
  // (only slower than the balanced schedules).
  v1::Plan plan = FallbackRingPlan(spec.seq_len(), spec.causal(), p);
  return plan;
}

int TotalSteps(const v1::Plan& plan, bool backward) {
  int total = 0;
  for (const v1::WorkerPlan& w : plan.workers()) {
    total += backward ? w.backward_steps_size() : w.forward_steps_size();
  }
  return total;
}

}  // namespace dfa
