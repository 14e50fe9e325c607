#include "tensors.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "binding_util.h"
#include "client/shard_io.h"

namespace dfa::python {
namespace {

std::string DTypeName(nb::dlpack::dtype d) {
  const char* code = "?";
  switch (static_cast<nb::dlpack::dtype_code>(d.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Bool: code = "bool"; break;
    default: break;
  }
  return absl::StrCat(code, d.bits);
}

bool DTypeMatches(nb::dlpack::dtype d, DType want) {
  if (d.lanes != 1) return false;
  const auto code = static_cast<nb::dlpack::dtype_code>(d.code);
  switch (want) {
    case DType::kF32: return code == nb::dlpack::dtype_code::Float && d.bits == 32;
    case DType::kF16: return code == nb::dlpack::dtype_code::Float && d.bits == 16;
    case DType::kBF16:
      return d.bits == 16 && (code == nb::dlpack::dtype_code::Bfloat ||
                              code == nb::dlpack::dtype_code::UInt ||
                              code == nb::dlpack::dtype_code::Int);
  }
  return false;
}

const char* WantName(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16 (or uint16/int16 bf16 bit patterns)";
  }
  return "?";
}

// The shape `kind` has under `spec`, as MakeTensor gives it, without allocating the bytes.
client::HostTensor ShapeOf(const v1::AttentionSpec& spec, v1::TensorKind kind) {
  client::HostTensor t;
  t.batch = spec.batch();
  t.rows = spec.seq_len();
  t.head_dim = spec.head_dim();
  t.dtype = Value(client::FromProtoDType(spec.dtype()));
  t.heads = client::IsKvKind(kind) ? spec.kv_heads() : spec.q_heads();
  if (kind == v1::TENSOR_LSE) {
    t.head_dim = 1;
    t.dtype = DType::kF32;
    t.row_stats = true;
  }
  return t;
}

}  // namespace

client::HostTensor InputView(const InputArray& a, const v1::AttentionSpec& spec,
                             v1::TensorKind kind, const char* name) {
  client::HostTensor t = ShapeOf(spec, kind);
  if (a.device_type() != nb::device::cpu::value) {
    ThrowInvalid(absl::StrCat(name, ": must be in CPU memory (device type ", a.device_type(),
                              "); move it with .cpu() or use the CUDA path"));
  }
  std::vector<int64_t> want;
  if (t.row_stats) {
    want = {t.batch, t.heads, t.rows};
  } else {
    want = {t.batch, t.rows, t.heads, t.head_dim};
  }
  std::vector<int64_t> got;
  for (size_t i = 0; i < a.ndim(); ++i) got.push_back(static_cast<int64_t>(a.shape(i)));
  if (got != want) {
    ThrowInvalid(absl::StrCat(name, ": shape [", absl::StrJoin(got, ", "),
                              "] does not match the session's [", absl::StrJoin(want, ", "), "] ",
                              t.row_stats ? "[batch, q_heads, seq_len]"
                                          : "[batch, seq_len, heads, head_dim]"));
  }
  if (!DTypeMatches(a.dtype(), t.dtype)) {
    ThrowInvalid(absl::StrCat(name, ": dtype ", DTypeName(a.dtype()), " does not match the spec's ",
                              WantName(t.dtype)));
  }
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) {
      ThrowInvalid(absl::StrCat(name, ": must be C-contiguous (dense row major); make it so with "
                                      ".contiguous() / np.ascontiguousarray"));
    }
    expect *= static_cast<int64_t>(a.shape(i));
  }
  t.external = const_cast<uint8_t*>(static_cast<const uint8_t*>(a.data()));
  return t;
}

nb::object OutputArray(client::HostTensor&& t) {
  auto* owned = new client::HostTensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<client::HostTensor*>(p); });
  std::vector<size_t> shape;
  if (owned->row_stats) {
    shape = {static_cast<size_t>(owned->batch), static_cast<size_t>(owned->heads),
             static_cast<size_t>(owned->rows)};
  } else {
    shape = {static_cast<size_t>(owned->batch), static_cast<size_t>(owned->rows),
             static_cast<size_t>(owned->heads), static_cast<size_t>(owned->head_dim)};
  }
  nb::dlpack::dtype dtype;
  switch (owned->dtype) {
    case DType::kF32: dtype = nb::dtype<float>(); break;
    case DType::kF16: dtype = nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1}; break;
    case DType::kBF16: dtype = nb::dtype<uint16_t>(); break;
  }
  nb::ndarray<nb::numpy> arr(owned->data(), shape.size(), shape.data(), owner, nullptr, dtype);
  return nb::cast(arr, nb::rv_policy::reference);
}

}  // namespace dfa::python
