#include "worker/transport/peer_address.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/wire/crc32c.h"

namespace dfa {
namespace {

constexpr char kMagic[4] = {'D', 'F', 'A', 'T'};
constexpr uint8_t kVersion = 1;

void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

uint32_t EnvelopeCrc(const char* header, std::string_view payload) {
  return Crc32cExtend(Crc32c(header, 12), payload.data(), payload.size());
}

}  // namespace

const char* PeerAddressKindName(PeerAddressKind kind) {
  switch (kind) {
    case PeerAddressKind::kUcx:
      return "ucx";
    case PeerAddressKind::kNccl:
      return "nccl";
  }
  return "unknown";
}

std::string SealPeerAddress(PeerAddressKind kind, std::string_view payload) {
  std::string out(kPeerAddressHeaderBytes + payload.size(), '\0');
  std::memcpy(out.data(), kMagic, sizeof(kMagic));
  out[4] = static_cast<char>(kVersion);
  out[5] = static_cast<char>(kind);
  PutU32(out.data() + 8, static_cast<uint32_t>(payload.size()));
  PutU32(out.data() + 12, EnvelopeCrc(out.data(), payload));
  std::memcpy(out.data() + kPeerAddressHeaderBytes, payload.data(), payload.size());
  return out;
}

absl::StatusOr<std::string> OpenPeerAddress(PeerAddressKind kind, std::string_view envelope) {
  const std::string want = PeerAddressKindName(kind);
  if (envelope.empty()) return absl::InvalidArgumentError("is empty");
  if (envelope.size() < kPeerAddressHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("is ", envelope.size(),
                                                   " bytes, shorter than the ",
                                                   kPeerAddressHeaderBytes,
                                                   "-byte header of a transport address"));
  }
  if (std::memcmp(envelope.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        "does not start with the magic \"DFAT\" (not a transport address made by a dfa-worker)");
  }
  const uint8_t version = static_cast<uint8_t>(envelope[4]);
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("has envelope version ", version, ", want ",
                                                   kVersion));
  }
  const uint8_t got_kind = static_cast<uint8_t>(envelope[5]);
  if (got_kind != static_cast<uint8_t>(kind)) {
    const char* got = got_kind == static_cast<uint8_t>(PeerAddressKind::kUcx)    ? "ucx"
                      : got_kind == static_cast<uint8_t>(PeerAddressKind::kNccl) ? "nccl"
                                                                                 : nullptr;
    return absl::InvalidArgumentError(
        got ? absl::StrCat("is a ", got, " address, want ", want)
            : absl::StrCat("has unknown kind ", got_kind, ", want ", want));
  }
  if (envelope[6] != 0 || envelope[7] != 0) {
    return absl::InvalidArgumentError("has non-zero reserved header bytes");
  }
  const uint32_t n = GetU32(envelope.data() + 8);
  if (n == 0 || n > kMaxPeerAddressPayload) {
    return absl::InvalidArgumentError(absl::StrCat("declares a payload of ", n,
                                                   " bytes, want 1 to ", kMaxPeerAddressPayload));
  }
  if (envelope.size() != kPeerAddressHeaderBytes + n) {
    return absl::InvalidArgumentError(absl::StrCat("is ", envelope.size(), " bytes; its header ",
                                                   "declares ", kPeerAddressHeaderBytes + n));
  }
  const std::string_view payload = envelope.substr(kPeerAddressHeaderBytes);
  const uint32_t crc = EnvelopeCrc(envelope.data(), payload);
  const uint32_t stored = GetU32(envelope.data() + 12);
  if (crc != stored) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checksum ", stored, " does not match its bytes (", crc, "): damaged in transit"));
  }
  return std::string(payload);
}

}  // namespace dfa
