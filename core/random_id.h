// Unpredictable identifiers and secrets from the kernel's CSPRNG (getrandom(2), /dev/urandom if
// the system call is missing): session and job ids, session capabilities.
//
// An id names a thing and may appear in logs and messages; it is unguessable (128 random bits)
// so that knowing one id tells nothing about another. A capability is a secret (256 random
// bits): whoever presents it may use the session it was issued for (docs/security.md).
// Capabilities are compared with ConstantTimeEquals, never with ==.
//
// Thread safety: every function may be called from any thread. Failure to read the CSPRNG
// (no getrandom and no /dev/urandom) aborts the process with a message: ids and secrets are
// never made from a weaker source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace dfa {

// Bits of randomness in an id and in a capability.
inline constexpr int kRandomIdBits = 128;
inline constexpr int kCapabilityBits = 256;

// Fills `out[0, n)` with bytes from the kernel's CSPRNG.
void FillRandomBytes(void* out, size_t n);

// `prefix` followed by kRandomIdBits random bits in lower-case hex (32 characters):
// RandomId("s-") == "s-9f86d081884c7d659a2feaa0c55ad015".
std::string RandomId(absl::string_view prefix);

// A new session capability: kCapabilityBits random bits in unpadded base64url (43 characters of
// [A-Za-z0-9_-]), usable as gRPC metadata as it is.
std::string NewCapability();

// True when `a` and `b` are equal, in time that depends only on their lengths (no early exit at
// the first differing byte).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dfa
