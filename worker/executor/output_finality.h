// When each owned row's outputs are final in one worker's pass (internal to the executor): the
// step after which no unit, merge or send of the pass reads or writes them again. Read from the
// plan as it runs (CutTransfers), so it is exact for the steps the executor runs.
//
// Forward, query side (O, LSE): the last step with a unit on the owned query rows (written in
// its computes) or a kOutPartial for them (merged at the end of that step).
// Backward, query side (dQ, written into Q's slot): the last step with a unit on the owned
// query rows, a kDqPartial for them, or a kGradIn send of them (it reads Q's slot).
// Backward, key side (dK, dV, written into K's and V's slots): the last step with a unit on the
// owned key rows, a kDkvPartial for them, or a kKV send of them.
// Rows no step touches become final at the end of the pass.
#pragma once

#include <vector>

#include "core/planner/plan.h"

namespace dfa::executor_internal {

struct OutputFinality {
  // [t]: local row ranges (rows of the worker's storage, owned ranges packed in order) whose
  // outputs are final once step t has ended, sorted and disjoint.
  std::vector<std::vector<RowRange>> queries;
  std::vector<std::vector<RowRange>> keys;  // backward only (empty lists in a forward)
};

OutputFinality FinalRowsByStep(const Plan& plan, int rank, bool forward);

// The global range of local rows `local` (inside one owned range of `owned`).
RowRange GlobalRows(const std::vector<RowRange>& owned, const RowRange& local);

}  // namespace dfa::executor_internal
