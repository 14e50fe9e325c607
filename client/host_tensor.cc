#include "client/host_tensor.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dfa::client {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

TensorView HostTensor::View() const {
  TensorView v;
  v.data = const_cast<uint8_t*>(data());
  v.dtype = dtype;
  v.batch = batch;
  v.rows = rows;
  v.heads = heads;
  v.head_dim = head_dim;
  return v;
}

RowStatView HostTensor::StatView() const {
  RowStatView v;
  v.data = reinterpret_cast<float*>(const_cast<uint8_t*>(data()));
  v.batch = batch;
  v.heads = heads;
  v.rows = rows;
  return v;
}

absl::Status ValidateSpec(const v1::AttentionSpec& spec) {
  return ::dfa::ValidateSpec(spec, kNoSpecLimits);
}

absl::StatusOr<DType> FromProtoDType(v1::DType t) {
  switch (t) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_BF16: return DType::kBF16;
    case v1::DTYPE_F16: return DType::kF16;
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("dtype: unsupported value ", static_cast<int>(t)));
}

v1::DType ToProtoDType(DType t) {
  switch (t) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kBF16: return v1::DTYPE_BF16;
    case DType::kF16: return v1::DTYPE_F16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<v1::DType> ParseDType(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "bf16" || n == "bfloat16") return v1::DTYPE_BF16;
  if (n == "f16" || n == "fp16" || n == "half") return v1::DTYPE_F16;
  if (n == "f32" || n == "fp32" || n == "float") return v1::DTYPE_F32;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype: unknown type '", name, "' (expected bf16, f16 or f32)"));
}

std::string TensorKindName(v1::TensorKind kind) {
  switch (kind) {
    case v1::TENSOR_Q: return "Q";
    case v1::TENSOR_K: return "K";
    case v1::TENSOR_V: return "V";
    case v1::TENSOR_O: return "O";
    case v1::TENSOR_LSE: return "LSE";
    case v1::TENSOR_DO: return "dO";
    case v1::TENSOR_DQ: return "dQ";
    case v1::TENSOR_DK: return "dK";
    case v1::TENSOR_DV: return "dV";
    default: break;
  }
  return absl::StrCat("kind#", static_cast<int>(kind));
}

absl::StatusOr<HostTensor> MakeTensor(const v1::AttentionSpec& spec, v1::TensorKind kind) {
  RETURN_IF_ERROR(ValidateSpec(spec));
  HostTensor t;
  t.batch = spec.batch();
  t.rows = spec.seq_len();
  t.head_dim = spec.head_dim();
  ASSIGN_OR_RETURN(t.dtype, FromProtoDType(spec.dtype()));
  switch (kind) {
    case v1::TENSOR_Q:
    case v1::TENSOR_O:
    case v1::TENSOR_DO:
    case v1::TENSOR_DQ: t.heads = spec.q_heads(); break;
    case v1::TENSOR_K:
    case v1::TENSOR_V:
    case v1::TENSOR_DK:
    case v1::TENSOR_DV: t.heads = spec.kv_heads(); break;
    case v1::TENSOR_LSE:
      t.heads = spec.q_heads();
      t.head_dim = 1;
      t.dtype = DType::kF32;
      t.row_stats = true;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kind: unsupported tensor kind ", static_cast<int>(kind)));
  }
  t.bytes.assign(static_cast<size_t>(t.size_bytes()), 0);
  return t;
}

void FillRandom(uint64_t seed, HostTensor* t) {
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  const int64_t n = t->elements();
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(SplitMix64(&state) >> 11) * 0x1.0p-53;  // [0, 1)
    StoreFromFloat(t->data(), t->dtype, i, static_cast<float>(2.0 * u - 1.0));
  }
}

HostTensor ToF32(const HostTensor& t) {
  HostTensor f = t;
  f.external = nullptr;  // the copy owns its bytes, also when `t` is a view
  f.dtype = DType::kF32;
  f.bytes.assign(static_cast<size_t>(f.size_bytes()), 0);
  float* out = reinterpret_cast<float*>(f.data());
  for (int64_t i = 0; i < t.elements(); ++i) out[i] = LoadAsFloat(t.data(), t.dtype, i);
  return f;
}

double ForwardFlops(const v1::AttentionSpec& spec) {
  return SpecForwardFlops(spec);  // visible pairs under causal, documents and window
}

}  // namespace dfa::client
