// Tensors across the Python boundary, without copies.
//
// In: any object with the DLPack or buffer protocol (numpy arrays, torch CPU tensors) becomes a
// HostTensor view of its memory (HostTensor::external), after checks that name the argument:
// CPU memory, the rank and shape the spec gives `kind` (BSHD [batch, seq_len, heads, head_dim];
// LSE [batch, q_heads, seq_len]), C-contiguous, and the spec's dtype (bf16 also as 16-bit
// integer bit patterns, numpy having no bfloat16). The caller keeps the array alive while the
// view is used (InputArray holds it).
// Out: a HostTensor gathered by a download moves into a heap object owned by the returned numpy
// array (its bytes are never copied); bf16 comes back as uint16 bit patterns.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "client/host_tensor.h"

namespace dfa::python {

namespace nb = nanobind;

using InputArray = nb::ndarray<nb::ro>;

// The view of `a` as the whole tensor of `kind` under `spec`; INVALID_ARGUMENT naming `name`.
client::HostTensor InputView(const InputArray& a, const v1::AttentionSpec& spec,
                             v1::TensorKind kind, const char* name);

// A numpy array that owns `t`'s bytes (moved, not copied).
nb::object OutputArray(client::HostTensor&& t);

}  // namespace dfa::python
