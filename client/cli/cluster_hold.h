// What a `dfa` command holds on a cluster — its session and the job running on it — given back
// when the command is interrupted: on Ctrl-C (Interrupts, mode kCleanUpAndExit) the job is
// cancelled and the session released, each call bounded by kCallTimeout, straight through the
// coordinator stub (the main thread may be inside the Session).
// Thread-safe; the Client must outlive the hold.
#pragma once

#include <mutex>
#include <string>

#include "absl/time/time.h"
#include "client/client.h"

namespace dfa::cli {

class ClusterHold {
 public:
  static constexpr absl::Duration kCallTimeout = absl::Seconds(5);

  explicit ClusterHold(client::Client* client);
  ~ClusterHold();
  ClusterHold(const ClusterHold&) = delete;
  ClusterHold& operator=(const ClusterHold&) = delete;

  // The session held now (nullptr: none); its id and capability are copied.
  void SetSession(const client::Session* session);
  // The job running on it now ("" when none).
  void SetJob(const std::string& job_id);
  // Cancels the job and releases the session (what an interrupt does).
  void GiveBack();

 private:
  client::Client* client_;
  int handle_ = 0;
  std::mutex mu_;
  std::string session_id_, capability_, job_id_;
};

}  // namespace dfa::cli
