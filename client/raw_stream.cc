#include "client/raw_stream.h"

namespace dfa::client {
namespace {

// The one tag of a call's queue: operations are issued one at a time.
void* const kTag = reinterpret_cast<void*>(1);

}  // namespace

RawStream::RawStream(grpc::GenericStub* stub, grpc::ClientContext* ctx, const std::string& method,
                     bool cork_metadata)
    : ctx_(ctx) {
  if (cork_metadata) ctx_->set_initial_metadata_corked(true);
  call_ = stub->PrepareCall(ctx_, method, &cq_);
  call_->StartCall(kTag);
  // A corked start performs no operation (the metadata leaves with the first message).
  if (!cork_metadata) (void)Wait();
}

RawStream::~RawStream() {
  if (!finished_) {
    ctx_->TryCancel();
    (void)Finish();
  }
  cq_.Shutdown();
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
  }
}

bool RawStream::Wait() {
  void* tag = nullptr;
  bool ok = false;
  if (!cq_.Next(&tag, &ok)) return false;  // the queue shut down (not while a call runs)
  return ok;
}

bool RawStream::Write(const grpc::ByteBuffer& message) {
  call_->Write(message, kTag);
  return Wait();
}

bool RawStream::WriteLast(const grpc::ByteBuffer& message) {
  call_->WriteLast(message, grpc::WriteOptions(), kTag);
  return Wait();
}

bool RawStream::WritesDone() {
  call_->WritesDone(kTag);
  return Wait();
}

bool RawStream::Read(grpc::ByteBuffer* message) {
  call_->Read(message, kTag);
  return Wait();
}

grpc::Status RawStream::Finish() {
  if (finished_) return status_;
  finished_ = true;
  call_->Finish(&status_, kTag);
  (void)Wait();
  return status_;
}

}  // namespace dfa::client
