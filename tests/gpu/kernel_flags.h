// The flags with which the GPU benchmarks and tools override the kernel table of
// kernels/cuda/kernel_dispatch.h (a cuda::KernelChoice; without them the table runs):
//   --fwd-kernel table|tma|cpasync|mma     forward kernel (tma, cpasync: Hopper only)
//   --bwd-kernel table|pipe|cpasync|mma    backward kernel (pipe, cpasync: Hopper only)
//   --bwd-tile-chunk N                     causal pipe backward tile order: -1 the table,
//                                          0 grid order, N > 0 longest first in chunks of N
//   --cudnn-fwd table|own|cudnn            cudnn backend: forward units on our kernels / cuDNN
//   --cudnn-bwd table|own|cudnn            cudnn backend: backward units likewise
// Each takes its value as the next argument or after '='.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "kernels/cuda/kernel_dispatch.h"

namespace dfa::testing {

// If argv[*i] is one of the flags above, reads its value (advancing *i past it) into *choice
// and returns true; *error is set (non-empty) when the value is missing or not one of the names.
inline bool ParseKernelFlag(int argc, char** argv, int* i, cuda::KernelChoice* choice,
                            std::string* error) {
  std::string_view arg = argv[*i];
  std::string_view value;
  bool has_value = false;
  if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
    value = arg.substr(eq + 1);
    arg = arg.substr(0, eq);
    has_value = true;
  }
  const bool known = arg == "--fwd-kernel" || arg == "--bwd-kernel" ||
                     arg == "--bwd-tile-chunk" || arg == "--cudnn-fwd" || arg == "--cudnn-bwd";
  if (!known) return false;
  if (!has_value) {
    if (*i + 1 >= argc) {
      *error = std::string(arg) + " needs a value";
      return true;
    }
    value = argv[++*i];
  }
  bool ok = false;
  if (arg == "--fwd-kernel") ok = cuda::ParseKernel(value, &choice->forward);
  if (arg == "--bwd-kernel") ok = cuda::ParseKernel(value, &choice->backward);
  if (arg == "--cudnn-fwd") ok = cuda::ParseKernel(value, &choice->cudnn_forward);
  if (arg == "--cudnn-bwd") ok = cuda::ParseKernel(value, &choice->cudnn_backward);
  if (arg == "--bwd-tile-chunk") {
    const std::string v(value);
    char* end = nullptr;
    const long n = std::strtol(v.c_str(), &end, 10);
    ok = !v.empty() && *end == '\0' && n >= -1 && n <= 999;
    if (ok) choice->bwd_tile_chunk = static_cast<int>(n);
  }
  if (!ok) {
    *error = std::string(arg) + ": bad value '" + std::string(value) +
             (arg == "--bwd-tile-chunk" ? "' (expected -1..999)"
              : arg == "--fwd-kernel"   ? "' (expected table, tma, cpasync or mma)"
              : arg == "--bwd-kernel"   ? "' (expected table, pipe, cpasync or mma)"
                                        : "' (expected table, own or cudnn)");
  }
  return true;
}

// Suffix naming the overrides in a result row ("" when the table runs), e.g. "-fwd=cpasync".
inline std::string KernelTag(const cuda::KernelChoice& c) {
  std::string tag;
  if (c.forward != cuda::FwdKernel::kTable) tag += "-fwd=" + std::string(cuda::Name(c.forward));
  if (c.backward != cuda::BwdKernel::kTable) tag += "-bwd=" + std::string(cuda::Name(c.backward));
  if (c.bwd_tile_chunk >= 0) tag += "-chunk=" + std::to_string(c.bwd_tile_chunk);
  if (c.cudnn_forward != cuda::UnitEngine::kTable) {
    tag += "-cudnnfwd=" + std::string(cuda::Name(c.cudnn_forward));
  }
  if (c.cudnn_backward != cuda::UnitEngine::kTable) {
    tag += "-cudnnbwd=" + std::string(cuda::Name(c.cudnn_backward));
  }
  return tag;
}

}  // namespace dfa::testing
