// Picks the widest kernel build the running CPU supports (runtime dispatch; the library itself
// is compiled for the portable x86-64 baseline). DFA_CPU_ISA=default|avx2|avx512 caps the choice
// (the one environment setting of the kernels: a user-facing override, read here only).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/kernel_params.h"

namespace dfa::cpu {

const KernelTable& SelectKernels() {
#if defined(__x86_64__)
  const char* cap = std::getenv("DFA_CPU_ISA");
  if (cap != nullptr && cap[0] == '\0') cap = nullptr;  // set but empty: no cap
  if (cap != nullptr && std::strcmp(cap, "default") != 0 && std::strcmp(cap, "avx2") != 0 &&
      std::strcmp(cap, "avx512") != 0) {
    std::fprintf(stderr,
                 "dfa: DFA_CPU_ISA=%s is not one of default, avx2, avx512; using the widest "
                 "kernels this CPU supports\n",
                 cap);
    cap = nullptr;
  }
  const bool allow512 = cap == nullptr || std::strcmp(cap, "avx512") == 0;
  const bool allow2 = allow512 || std::strcmp(cap, "avx2") == 0;
  __builtin_cpu_init();
  if (allow512 && __builtin_cpu_supports("avx512f")) return kKernelsAvx512;
  if (allow2 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return kKernelsAvx2;
  }
#endif
  return kKernelsDefault;
}

}  // namespace dfa::cpu
