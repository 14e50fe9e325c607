// A blocking streaming call whose messages are raw grpc::ByteBuffers, on gRPC's public generic
// API: grpc::GenericStub with one CompletionQueue per call, driven by the calling thread (one
// operation at a time, as the synchronous ClientWriter / ClientReader do internally). The
// data plane uses it to send and receive chunks framed by core/wire/chunk_wire.h without a
// protobuf copy; the bytes on the wire are the method's ordinary protobuf messages, so the call
// is the same as one made through the generated stub (gRPC does not put the call type on the
// wire: a client-streaming or server-streaming method is called here as a bidi stream).
//
//   grpc::ClientContext ctx;                      // outlives the RawStream
//   RawStream call(&stub, &ctx, "/dfa.v1.Worker/Upload");
//   while (...) if (!call.Write(buffer)) break;   // false: the server ended the call
//   call.WritesDone();
//   grpc::ByteBuffer reply;  call.Read(&reply);
//   grpc::Status st = call.Finish();
//
// Thread safety: one thread at a time; TryCancel on the context may come from any thread. The
// destructor cancels a call that was not finished and waits for gRPC to let go of it.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace dfa::client {

class RawStream {
 public:
  // Starts a call of `method` ("/package.Service/Method") on `ctx`. cork_metadata: the call's
  // metadata waits for the first message (then WriteLast sends metadata, message and half-close
  // in one batch, as a generated server-streaming call does).
  RawStream(grpc::GenericStub* stub, grpc::ClientContext* ctx, const std::string& method,
            bool cork_metadata = false);
  ~RawStream();
  RawStream(const RawStream&) = delete;
  RawStream& operator=(const RawStream&) = delete;

  // Sends one message; false when the call has ended (Finish says why).
  bool Write(const grpc::ByteBuffer& message);
  // Sends the last message and half-closes in one operation.
  bool WriteLast(const grpc::ByteBuffer& message);
  // Half-closes (no more messages from this side).
  bool WritesDone();
  // Receives the next message; false at the end of the server's messages or when the call
  // ended.
  bool Read(grpc::ByteBuffer* message);
  // The call's status (once; later calls return the same status).
  grpc::Status Finish();

 private:
  // Waits for the operation in flight; returns its ok.
  bool Wait();

  grpc::ClientContext* const ctx_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool finished_ = false;
  grpc::Status status_;
};

}  // namespace dfa::client
