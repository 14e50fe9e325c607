#include "core/random_id.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dfa {
namespace {

[[noreturn]] void Die(const char* what, int err) {
  std::fprintf(stderr, "fatal: cannot read the kernel's random number generator (%s: %s)\n", what,
               std::strerror(err));
  std::abort();
}

// /dev/urandom, for kernels without getrandom(2).
void ReadUrandom(uint8_t* p, size_t n) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open /dev/urandom", errno);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) Die("read /dev/urandom", got < 0 ? errno : EIO);
    p += got;
    n -= static_cast<size_t>(got);
  }
  ::close(fd);
}

}  // namespace

void FillRandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    // Blocks only until the pool is initialised at boot; never returns short for <= 256 bytes.
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSYS) {
        ReadUrandom(p, n);
        return;
      }
      Die("getrandom", errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

std::string RandomId(absl::string_view prefix) {
  static constexpr char kHex[] = "0123456789abcdef";
  uint8_t bytes[kRandomIdBits / 8];
  FillRandomBytes(bytes, sizeof(bytes));
  std::string id(prefix);
  id.reserve(prefix.size() + 2 * sizeof(bytes));
  for (uint8_t b : bytes) {
    id.push_back(kHex[b >> 4]);
    id.push_back(kHex[b & 0xf]);
  }
  return id;
}

std::string NewCapability() {
  static constexpr char kBase64Url[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  uint8_t bytes[kCapabilityBits / 8];
  FillRandomBytes(bytes, sizeof(bytes));
  std::string out;
  out.reserve((sizeof(bytes) * 8 + 5) / 6);
  uint32_t acc = 0;
  int bits = 0;
  for (uint8_t b : bytes) {
    acc = (acc << 8) | b;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kBase64Url[(acc >> bits) & 0x3f]);
    }
  }
  if (bits > 0) out.push_back(kBase64Url[(acc << (6 - bits)) & 0x3f]);
  std::memset(bytes, 0, sizeof(bytes));
  return out;
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace dfa
