// Bounds on the worker's client data-plane streams (Worker.Upload and Worker.Download): how
// many are open at once, in total and per client_id, and how long one may sit idle.
//
//   StreamLimits limits(options);                      // one per daemon
//   auto ticket = limits.Open(ctx, "Upload");          // RESOURCE_EXHAUSTED over max_streams
//   ticket->SetClient(client_id);                      // ... over max_streams_per_client
//   ticket->Touch();                                   // after every message read or written
//   (the reactor destroys the ticket in OnDone)
//
// A stream that moves no message for `idle_timeout` (a client that opened it and went quiet,
// or stopped reading a Download) is cancelled (ServerContext::TryCancel): its reactor then ends
// it and its ticket frees the slot. The sweeper thread looks every idle_timeout / 4 (at most
// once a second). Over a limit, the new stream is refused with RESOURCE_EXHAUSTED naming the
// flag (--max_data_streams, --max_data_streams_per_client) and open streams are unaffected.
//
// Threads: everything is thread-safe. A ticket must be destroyed before gRPC is done with its
// call (in or before the reactor's OnDone), since the sweeper may cancel the call until then.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "core/status.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_callback.h"

namespace dfa {

struct StreamLimitOptions {
  int max_streams = 256;            // Upload + Download streams open at once
  int max_streams_per_client = 64;  // of them, per client_id
  absl::Duration idle_timeout = absl::Seconds(60);  // <= 0: never time out
};

class StreamLimits {
 public:
  struct Entry;

  // The slot of one open stream; frees it on destruction.
  class Ticket {
   public:
    ~Ticket();
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // A message was read or written.
    void Touch();
    // Counts the stream against `client_id` (the first call; later calls must name the same
    // client). RESOURCE_EXHAUSTED over max_streams_per_client.
    absl::Status SetClient(const std::string& client_id);

   private:
    friend class StreamLimits;
    Ticket(StreamLimits* limits, std::shared_ptr<Entry> entry)
        : limits_(limits), entry_(std::move(entry)) {}
    StreamLimits* const limits_;
    std::shared_ptr<Entry> entry_;
  };

  explicit StreamLimits(StreamLimitOptions options);
  ~StreamLimits();  // stops the sweeper; tickets must be gone (the server is shut down first)

  // A slot for a new stream of `method` ("Upload", "Download") on call `ctx`.
  absl::StatusOr<std::unique_ptr<Ticket>> Open(grpc::CallbackServerContext* ctx,
                                               const char* method);

  int open() const;             // streams open now
  int64_t idle_cancels() const;  // streams cancelled for idleness since start
  const StreamLimitOptions& options() const { return options_; }

 private:
  void Release(const std::shared_ptr<Entry>& entry);
  void Sweep();

  const StreamLimitOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::shared_ptr<Entry>> open_;
  std::map<std::string, int> per_client_;
  bool stop_ = false;
  std::atomic<int64_t> idle_cancels_{0};
  std::thread sweeper_;
};

// A reactor that only answers `status` (a stream refused before it starts).
template <typename Reactor>
class RefusedStream final : public Reactor {
 public:
  explicit RefusedStream(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace dfa
