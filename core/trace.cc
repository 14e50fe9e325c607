#include "core/trace.h"

#include <cstdlib>
#include <cstring>

namespace dfa {

bool TraceOpsEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("DFA_TRACE_OPS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

}  // namespace dfa
