// Host memory a `dfa` command is about to allocate, checked before it allocates: a size the
// host cannot hold is refused with a message naming the flags and the bytes, never a
// std::bad_alloc abort.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "dfa/v1/attention.pb.h"

namespace dfa::cli {

// Bytes of one full tensor of the spec: `q_heads` (true) or kv heads, in `elem_bytes` per
// element (double: sizes from the flags may overflow int64).
double TensorBytes(const v1::AttentionSpec& spec, bool q_heads, double elem_bytes);
// Bytes of the per-row statistics (LSE, D): batch x q heads x seq_len fp32.
double RowStatBytes(const v1::AttentionSpec& spec);

// What a training run (dfa submit, dfa demo) holds: Q, K, V (and dO) in the spec's dtype, O, LSE
// (and dQ, dK, dV) downloaded, and with `verify` the fp32 single-device reference.
double TrainingRunBytes(const v1::AttentionSpec& spec, bool backward, bool verify);

// Memory this process may still allocate: MemAvailable of /proc/meminfo, lowered to what the
// cgroup (v2 memory.max - memory.current, or v1 limit - usage) leaves; -1 when unknown.
int64_t AvailableHostBytes();

// "1.50 GiB".
std::string FormatBytes(double bytes);

// INVALID_ARGUMENT when `bytes` exceed AvailableHostBytes() (OK when it is unknown): "<what>
// would hold <bytes> of host memory (<detail>), more than the <available> this host has
// available; <advice>".
absl::Status CheckHostMemory(const std::string& what, double bytes, const std::string& detail,
                             const std::string& advice);

// CheckHostMemory for a training run of `spec`, naming its flags.
absl::Status CheckTrainingRunMemory(const v1::AttentionSpec& spec, bool backward, bool verify);

}  // namespace dfa::cli
