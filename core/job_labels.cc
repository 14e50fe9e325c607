#include "core/job_labels.h"

namespace dfa {

std::string JobKindLabel(v1::JobKind kind) {
  return kind == v1::JOB_BACKWARD ? "backward" : "forward";
}

std::string JobStateLabel(v1::JobState state) {
  switch (state) {
    case v1::JOB_SUCCEEDED:
      return "succeeded";
    case v1::JOB_FAILED:
      return "failed";
    case v1::JOB_CANCELLED:
      return "cancelled";
    case v1::JOB_RUNNING:
      return "running";
    case v1::JOB_QUEUED:
      return "queued";
    default:
      return "unspecified";
  }
}

}  // namespace dfa
