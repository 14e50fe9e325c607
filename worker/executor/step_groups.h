// Group scheduling of one pass (internal to the executor; the order itself is described in
// plan_executor.h). A step's transfers travel in transport groups:
//   early groups  its non-partial transfers (Q, K/V, grad_in), one group per lead L (plan.h):
//                 prepared and posted at the start of step t-1-L (before the pass for t-1-L <
//                 0), waited for at the start of step t;
//   late group    its partials (O/LSE, dQ, dK/dV), posted right after step t-1's computes are
//                 queued and waited for right after step t's (before step t+1's late group is
//                 posted), when what it brought is merged.
// Preparing a group allocates its receive buffers (PassBuffers; adjacent K/V messages from one
// peer share one buffer so their ops can fuse) and its sends: owned storage, a buffer received
// earlier (forwarding) or a partial, packed into a dense staging buffer where not contiguous.
// Messages are listed in the order both sides share: by peer, then the plan's canonical order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "core/planner/plan.h"
#include "core/status.h"
#include "worker/executor/pass_buffers.h"
#include "worker/executor/pass_context.h"
#include "core/transport.h"

namespace dfa::executor_internal {

class StepGroups {
 public:
  StepGroups(PassContext* ctx, PassBuffers* buffers) : ctx_(*ctx), buffers_(*buffers) {}

  // Start of a pass: checks every non-partial transfer's lead (INVALID_ARGUMENT outside [0, t])
  // and sizes the schedule to the pass's steps.
  absl::Status Init();
  // The (step, lead) early groups the start of step `post` posts (-1: before the pass), in step
  // order.
  std::vector<std::pair<int, int>> PostedAt(int post) const;
  // Early group (t, lead): receive buffers allocated, sends packed (queued on the compute
  // stream). Not posted yet.
  absl::Status PrepareEarly(int t, int lead);
  // Whether the prepared early group (t, lead) has any message.
  bool HasMessages(int t, int lead) const;
  // Posts the prepared early group (t, lead) (nothing when it has no message).
  absl::Status LaunchEarly(int t, int lead);
  // Waits for every early group of step t (the errors name the step), then drops them.
  absl::Status WaitEarly(int t);
  // Posts step t's late group: buffers for the partials it receives, sends of the partials
  // this worker computed for their owners.
  absl::Status PostLate(int t);
  // Waits for step t's late group, hands each partial it brought to `merge`, then drops it.
  absl::Status FinishLate(int t, const std::function<absl::Status(const Buffer&)>& merge);

 private:
  struct Group {
    std::vector<TransportMessage> sends, recvs;  // prepared, not yet posted (early groups)
    std::unique_ptr<PendingGroup> pending;
    std::vector<std::unique_ptr<DeviceBuffer>> staging;  // packed sends
    std::vector<std::unique_ptr<Buffer>> arrivals;       // received partials, merged after Wait
  };
  // The early group's receives and sends.
  absl::Status PrepareEarlyRecvs(int t, const std::vector<Transfer>& recvs, Group* g);
  absl::Status PrepareEarlySends(int t, const std::vector<Transfer>& sends, Group* g);
  // The last step that reads a buffer received at step t (its computes and forwarding sends).
  int LastUse(const Transfer& recv, int t) const;

  PassContext& ctx_;
  PassBuffers& buffers_;
  std::vector<std::map<int, Group>> early_;  // [step][lead]
  std::vector<Group> late_;                  // [step]
  std::vector<std::set<int>> leads_;         // [step]: leads of its non-partial transfers
};

}  // namespace dfa::executor_internal
