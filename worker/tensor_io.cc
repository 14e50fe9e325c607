#include "worker/tensor_io.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/host_limits.h"
#include "worker/synthetic_inputs.h"

namespace dfa {
namespace {

using CopyKind = AttentionBackend::CopyKind;

constexpr int64_t kSyntheticBlockBytes = int64_t{64} << 20;

using session_tensors::CoverageOf;
using session_tensors::IsKnownKind;
using session_tensors::KindName;
using session_tensors::ViewOf;

std::string OwnedStr(const WorkerSession& s) {
  std::string out;
  for (const RowRange& r : s.storage->owned()) {
    absl::StrAppend(&out, out.empty() ? "" : " ", "[", r.begin, ", ", r.end, ")");
  }
  return out;
}

DType ClientDType(const WorkerSession& s) { return static_cast<DType>(s.spec.dtype()); }

using session_tensors::IsUploadKind;


uint8_t* RowPtr(const TensorView& v, int b, int64_t local_row) {
  return static_cast<uint8_t*>(v.data) +
         (b * v.BatchStride() + local_row * v.RowStride()) * DTypeSize(v.dtype);
}

// Inputs changed: results computed from the old ones are no longer valid.
void Invalidate(WorkerSession* s, v1::TensorKind kind) {
  if (kind != v1::TENSOR_DO) s->forward_done = false;
  s->backward_done = false;
}

// Queues on the session's io stream the copies of n rows of batch b between the storage and a
// transit buffer (toward the storage when `upload`), converting fp32 storage to the client's
// dtype where they differ (those wait for their copy).
absl::Status EnqueueRows(WorkerSession* s, v1::TensorKind kind, int b, int64_t local_row,
                         int64_t n, uint8_t* transit, bool upload) {
  AttentionBackend* be = s->backend.get();
  void* io = s->io_stream.get();
  if (kind == v1::TENSOR_LSE) {
    const RowStatView lse = s->storage->lse();
    for (int h = 0; h < lse.heads; ++h) {
      float* p = lse.data + b * lse.BatchStride() + h * lse.HeadStride() + local_row;
      uint8_t* t = transit + int64_t{h} * n * 4;
      RETURN_IF_ERROR(upload ? be->Copy(p, t, n * 4, CopyKind::kHostToDevice, io)
                             : be->Copy(t, p, n * 4, CopyKind::kDeviceToHost, io));
    }
    return absl::OkStatus();
  }
  const TensorView v = ViewOf(*s, kind);
  const DType client = ClientDType(*s);
  const int64_t elems = n * v.heads * v.head_dim;
  uint8_t* p = RowPtr(v, b, local_row);
  if (v.dtype == client) {
    const size_t bytes = static_cast<size_t>(elems * DTypeSize(client));
    return upload ? be->Copy(p, transit, bytes, CopyKind::kHostToDevice, io)
                  : be->Copy(transit, p, bytes, CopyKind::kDeviceToHost, io);
  }
  // fp32 gradients -> client dtype (download only; uploads are never fp32-held kinds).
  // Host storage (cpu) converts in one pass; device storage is staged through the host.
  const float* src = reinterpret_cast<const float*>(p);
  std::vector<float> tmp;
  if (be->Name() != "cpu") {
    tmp.resize(static_cast<size_t>(elems));
    RETURN_IF_ERROR(be->Copy(tmp.data(), p, tmp.size() * 4, CopyKind::kDeviceToHost, io));
    RETURN_IF_ERROR(be->Synchronize(io));
    src = tmp.data();
  }
  for (int64_t i = 0; i < elems; ++i) StoreFromFloat(transit, client, i, src[i]);
  return absl::OkStatus();
}

// EnqueueRows, then waits for the io stream: the rows are in place (upload) or in `transit`.
absl::Status MoveRows(WorkerSession* s, v1::TensorKind kind, int b, int64_t local_row, int64_t n,
                      uint8_t* transit, bool upload) {
  RETURN_IF_ERROR(EnqueueRows(s, kind, b, local_row, n, transit, upload));
  return s->backend->Synchronize(s->io_stream.get());
}

// Local row of `r` when it lies inside one owned range; OUT_OF_RANGE naming `field` otherwise.
absl::StatusOr<int64_t> LocalRowOf(const WorkerSession& s, const RowRange& r, const char* field) {
  if (r.begin < 0 || r.end <= r.begin) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = [", r.begin, ", ", r.end,
                                                   ") is empty or negative"));
  }
  for (const RowRange& o : s.storage->owned()) {
    if (o.Contains(r)) return s.storage->LocalRow(r);
  }
  return absl::OutOfRangeError(absl::StrCat(field, " = [", r.begin, ", ", r.end,
                                            ") is not inside this worker's shard ", OwnedStr(s)));
}

}  // namespace

HeadRange TransitHeads(const WorkerSession& s, v1::TensorKind kind) {
  const bool kv = kind == v1::TENSOR_K || kind == v1::TENSOR_V || kind == v1::TENSOR_DK ||
                  kind == v1::TENSOR_DV;
  return kv ? s.kv_heads : s.q_heads;
}

int64_t TransitRowBytes(const WorkerSession& s, v1::TensorKind kind) {
  const int64_t heads = TransitHeads(s, kind).size();
  if (kind == v1::TENSOR_LSE) return heads * 4;
  return heads * s.spec.head_dim() * DTypeSize(ClientDType(s));
}

namespace {

// Checks an uploaded chunk's header against the shard; returns its first local row.
absl::StatusOr<int64_t> CheckUploadChunk(const WorkerSession& s, v1::TensorKind kind,
                                         int32_t batch_index, const RowRange& r,
                                         int64_t data_size) {
  if (!IsUploadKind(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk.kind = ", KindName(kind), ": only TENSOR_Q, TENSOR_K, TENSOR_V and "
        "TENSOR_DO can be uploaded"));
  }
  if (batch_index < 0 || batch_index >= s.spec.batch()) {
    return absl::OutOfRangeError(absl::StrCat("chunk.batch_index = ", batch_index,
                                              " is outside [0, ", s.spec.batch(), ")"));
  }
  ASSIGN_OR_RETURN(const int64_t local, LocalRowOf(s, r, "chunk.rows"));
  const int64_t want = r.size() * TransitRowBytes(s, kind);
  if (data_size != want) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.data has ", data_size,
                                                   " bytes; rows [", r.begin, ", ", r.end, ") of ",
                                                   KindName(kind), " need ", want));
  }
  return local;
}

void MarkUploaded(WorkerSession* s, v1::TensorKind kind, int32_t b, int64_t local, int64_t n) {
  CoverageOf(s, kind)->Mark(b * s->storage->rows() + local, n);
  Invalidate(s, kind);
  s->rows_arrived.notify_all();  // a streaming job may wait for these rows
}

}  // namespace

absl::Status WriteChunk(WorkerSession* s, const v1::TensorChunk& chunk) {
  const RowRange r{chunk.rows().begin(), chunk.rows().end()};
  ASSIGN_OR_RETURN(const int64_t local,
                   CheckUploadChunk(*s, chunk.kind(), chunk.batch_index(), r,
                                    static_cast<int64_t>(chunk.data().size())));
  RETURN_IF_ERROR(MoveRows(s, chunk.kind(), chunk.batch_index(), local, r.size(),
                           reinterpret_cast<uint8_t*>(const_cast<char*>(chunk.data().data())),
                           /*upload=*/true));
  MarkUploaded(s, chunk.kind(), chunk.batch_index(), local, r.size());
  return absl::OkStatus();
}

absl::Status WriteWireChunk(WorkerSession* s, const WireChunk& chunk) {
  const RowRange r{chunk.row_begin, chunk.row_end};
  ASSIGN_OR_RETURN(const int64_t local,
                   CheckUploadChunk(*s, chunk.kind, chunk.batch_index, r, chunk.data_size));
  // Upload kinds are held in the client's dtype, rows dense: the chunk is one contiguous run
  // of storage, filled piece by piece.
  const TensorView v = ViewOf(*s, chunk.kind);
  uint8_t* dst = RowPtr(v, chunk.batch_index, local);
  for (const BytePiece& p : chunk.data) {
    RETURN_IF_ERROR(
        s->backend->Copy(dst, p.data, p.size, CopyKind::kHostToDevice, s->io_stream.get()));
    dst += p.size;
  }
  RETURN_IF_ERROR(s->backend->Synchronize(s->io_stream.get()));
  MarkUploaded(s, chunk.kind, chunk.batch_index, local, r.size());
  return absl::OkStatus();
}

absl::Status ReadRowsTo(WorkerSession* s, v1::TensorKind kind, int b, const RowRange& range,
                        uint8_t* out) {
  ASSIGN_OR_RETURN(const int64_t local, LocalRowOf(*s, range, "rows"));
  return MoveRows(s, kind, b, local, range.size(), out, /*upload=*/false);
}

absl::Status ReadRows(WorkerSession* s, v1::TensorKind kind, int b, const RowRange& range,
                      std::string* out) {
  ASSIGN_OR_RETURN(const int64_t local, LocalRowOf(*s, range, "rows"));
  const size_t old = out->size();
  out->resize(old + static_cast<size_t>(range.size() * TransitRowBytes(*s, kind)));
  return MoveRows(s, kind, b, local, range.size(), reinterpret_cast<uint8_t*>(out->data() + old),
                  /*upload=*/false);
}

absl::StatusOr<std::vector<RowRange>> ResolveRows(const WorkerSession& s,
                                                  const v1::RowRange& rows, const char* field) {
  const std::vector<RowRange>& owned = s.storage->owned();
  if (rows.begin() == 0 && rows.end() == 0) return owned;
  if (rows.begin() < 0 || rows.end() <= rows.begin()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = [", rows.begin(), ", ", rows.end(),
                                                   ") is empty or negative"));
  }
  std::vector<RowRange> pieces;
  int64_t covered = 0;
  for (const RowRange& o : owned) {
    const int64_t b = std::max(o.begin, rows.begin()), e = std::min(o.end, rows.end());
    if (b < e) {
      pieces.push_back({b, e});
      covered += e - b;
    }
  }
  if (covered != rows.end() - rows.begin()) {
    return absl::OutOfRangeError(absl::StrCat(field, " = [", rows.begin(), ", ", rows.end(),
                                              ") is not inside this worker's shard ", OwnedStr(s)));
  }
  return pieces;
}

int64_t BlockBytes(const WorkerSession& s, v1::TensorKind kind, const RowRange& rows) {
  return int64_t{s.spec.batch()} * rows.size() * TransitRowBytes(s, kind);
}

absl::Status WriteBlock(WorkerSession* s, v1::TensorKind kind, const RowRange& rows,
                        const uint8_t* src) {
  if (!IsUploadKind(kind)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kind = ", KindName(kind), ": only TENSOR_Q, TENSOR_K, TENSOR_V and TENSOR_DO can be "
        "uploaded"));
  }
  ASSIGN_OR_RETURN(const int64_t local, LocalRowOf(*s, rows, "rows"));
  const int64_t per_batch = rows.size() * TransitRowBytes(*s, kind);
  for (int b = 0; b < s->spec.batch(); ++b) {
    RETURN_IF_ERROR(MoveRows(s, kind, b, local, rows.size(),
                             const_cast<uint8_t*>(src) + b * per_batch, /*upload=*/true));
    CoverageOf(s, kind)->Mark(b * s->storage->rows() + local, rows.size());
  }
  Invalidate(s, kind);
  s->rows_arrived.notify_all();  // a streaming job may wait for these rows
  return absl::OkStatus();
}

absl::Status ReadBlock(WorkerSession* s, v1::TensorKind kind, const RowRange& rows,
                       uint8_t* dst) {
  ASSIGN_OR_RETURN(const int64_t local, LocalRowOf(*s, rows, "rows"));
  const int64_t per_batch = rows.size() * TransitRowBytes(*s, kind);
  for (int b = 0; b < s->spec.batch(); ++b) {
    RETURN_IF_ERROR(MoveRows(s, kind, b, local, rows.size(), dst + b * per_batch,
                             /*upload=*/false));
  }
  return absl::OkStatus();
}

namespace {

// FillSynthetic over a block, its rows split among threads when the batch is 1 (the rows are
// then contiguous): a long sequence's inputs (GiBs per worker) take seconds, not minutes.
void FillBlockParallel(uint64_t seed, int kind, int batch, const RowRange& r, int head0, int heads,
                       int head_dim, DType dt, int64_t row_bytes, uint8_t* dst) {
  const int64_t kMinRowsPerThread = 256;
  const int threads = static_cast<int>(std::min<int64_t>(
      UsableCpus(), r.size() / kMinRowsPerThread));
  if (batch != 1 || threads <= 1) {
    FillSynthetic(seed, kind, batch, r.begin, r.size(), head0, heads, head_dim, dt, dst);
    return;
  }
  std::vector<std::thread> pool;
  const int64_t per = (r.size() + threads - 1) / threads;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = r.begin + t * per, e = std::min(r.end, b + per);
    if (b >= e) break;
    pool.emplace_back([=] {
      FillSynthetic(seed, kind, 1, b, e - b, head0, heads, head_dim, dt,
                    dst + (b - r.begin) * row_bytes);
    });
  }
  for (std::thread& t : pool) t.join();
}

}  // namespace

absl::Status GenerateSynthetic(WorkerSession* s, uint64_t seed, bool with_grad_output) {
  std::vector<v1::TensorKind> kinds = {v1::TENSOR_Q, v1::TENSOR_K, v1::TENSOR_V};
  if (with_grad_output) kinds.push_back(v1::TENSOR_DO);
  const DType dt = ClientDType(*s);
  std::vector<uint8_t> block;
  for (v1::TensorKind kind : kinds) {
    const TensorView v = ViewOf(*s, kind);
    // Blocks of at most kSyntheticBlockBytes: the staging buffer is not in the session's
    // memory budget, so it must stay small next to a tensor.
    const int64_t per_row = BlockBytes(*s, kind, RowRange{0, 1});
    const int64_t step = std::max<int64_t>(1, kSyntheticBlockBytes / per_row);
    for (const RowRange& owned : s->storage->owned()) {
      for (int64_t r0 = owned.begin; r0 < owned.end; r0 += step) {
        const RowRange r{r0, std::min(owned.end, r0 + step)};
        block.resize(static_cast<size_t>(BlockBytes(*s, kind, r)));
        // Global head indices: a head-split shard generates its slice of the same tensors.
        FillBlockParallel(seed, kind, s->spec.batch(), r, TransitHeads(*s, kind).begin, v.heads,
                          v.head_dim, dt, per_row, block.data());
        RETURN_IF_ERROR(WriteBlock(s, kind, r, block.data()));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dfa
