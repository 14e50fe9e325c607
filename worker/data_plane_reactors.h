// The client data plane's two streaming RPCs, Worker.Upload and Worker.Download, as gRPC
// callback reactors over raw grpc::ByteBuffers (the generated WithRawCallbackMethod_* of
// proto/dfa/v1/worker.proto). Chunks are parsed and written by core/wire/chunk_wire.h, so chunk
// data goes from gRPC's receive slices straight into session storage and from storage into the
// slice gRPC sends: one copy each way, no protobuf copy. On the wire the messages are the
// proto's (UploadRequest / UploadResponse, DownloadRequest / TensorChunk).
//
// Flow control: one message at a time. Upload reads a chunk, checks its CRC32C and writes it
// into the session, then asks for the next; Download fills one chunk, writes it, and fills the
// next only after gRPC reports that write done. Neither holds more than one chunk, whatever the
// tensor's size; a slow peer slows the stream (HTTP/2 flow control) instead of growing memory.
//
// Access: `capability` is what the call presented (metadata "x-dfa-session-capability"); the
// session is looked up with SessionRegistry::FindForClient, for Upload at its first message and
// for Download before anything is read, so a missing or wrong capability ends the call with
// PERMISSION_DENIED before any byte of the session is written or read.
//
// Outcome: the same codes and messages as every Worker handler (worker/rpc_outcome.h), counted
// under "Upload" / "Download". A peer that cancels, or whose deadline passes, ends the stream
// at the next read or write; Download then answers CANCELLED ("client went away").
//
// Awaited outputs (DownloadRequest.await_job_id): a chunk whose rows are not final yet is
// waited for on a thread of the call (worker/session_output_gate.h AwaitOutputRows), never on a
// callback thread; a client that goes away ends the wait within 20 ms (OnCancel).
//
// Threads: gRPC runs the reactions on its callback threads, one reaction of a call at a time.
// A reaction copies one chunk under the session's mutex (held only for short copies elsewhere)
// and never waits on anything else. The reactors delete themselves when gRPC is done with them.
#pragma once

#include <atomic>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "worker/session_registry.h"
#include "worker/stream_limits.h"
#include "worker/worker_metrics.h"

namespace dfa {

// What the reactors use; both outlive every call (the daemon shuts the server down first).
struct DataPlaneState {
  SessionRegistry* sessions = nullptr;
  // Set once the daemon knows its worker id; may be null before.
  const std::atomic<WorkerMetrics*>* metrics = nullptr;
  // A Download's longest wait per chunk under await_job_id when the request leaves
  // await_timeout_ms 0 (the worker's step timeout).
  absl::Duration await_timeout = absl::Seconds(120);
};

// A reactor for one Upload call: a stream of UploadRequest, answered by `response` (a serialized
// UploadResponse with the bytes and chunks received).
// `ticket` (may be null) is the stream's slot in the worker's StreamLimits
// (worker/stream_limits.h): touched at every message, counted for the client_id once known,
// released when the reactor is done.
grpc::ServerReadReactor<grpc::ByteBuffer>* NewUploadReactor(
    const DataPlaneState& state, std::string capability, grpc::ByteBuffer* response,
    std::unique_ptr<StreamLimits::Ticket> ticket = nullptr);

// A reactor for one Download call: `request` is a serialized DownloadRequest; the reactor
// streams its rows as TensorChunks.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewDownloadReactor(
    const DataPlaneState& state, std::string capability, const grpc::ByteBuffer& request,
    std::unique_ptr<StreamLimits::Ticket> ticket = nullptr);

}  // namespace dfa
