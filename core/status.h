// One error type for the whole project: absl::Status / absl::StatusOr. Conversion to
// grpc::Status happens only at RPC boundaries (see worker/ and coordinator/ service code).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DFA_CONCAT_INNER_(a, b) a##b
#define DFA_CONCAT_(a, b) DFA_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status dfa_status_ = (expr);       \
    if (!dfa_status_.ok()) return dfa_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())`: unwraps a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(DFA_CONCAT_(dfa_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                           \
  if (!tmp.ok()) return tmp.status();          \
  lhs = std::move(tmp).value()
