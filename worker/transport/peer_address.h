// Transport addresses as they travel between workers (through the coordinator): the bytes of
// OpenSessionResponse.transport_address, RunJobRequest.peer_transport_addresses and
// OpenSessionRequest.nccl_unique_id. The transports' own blobs (a UCX worker address, an NCCL
// unique id) are parsed by UCX and NCCL without any length or sanity check — a damaged UCX
// address aborts the process inside ucp_address_unpack — so they never leave or enter a worker
// bare: each is sealed in this envelope by the worker that made it and opened (checked) before
// UCX or NCCL sees a byte of it.
//
// Envelope (little-endian), 16 bytes of header and the payload:
//   [0, 4)   magic "DFAT"
//   [4]      version (1)
//   [5]      kind: 1 UCX worker address, 2 NCCL unique id
//   [6, 8)   0
//   [8, 12)  payload length n, 1 <= n <= kMaxPeerAddressPayload
//   [12, 16) CRC32C (core/wire/crc32c.h) of bytes [0, 12) followed by the payload
//   [16, 16 + n) the payload; nothing after it
//
// The checksum catches damage and bytes that are not an envelope at all (a fake or broken
// peer's junk); it is not a signature: a party that may call RunJob (insecure mode, or a holder
// of the worker credential) can seal anything. docs/security.md says what each mode promises.
// Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace dfa {

enum class PeerAddressKind : uint8_t { kUcx = 1, kNccl = 2 };

inline constexpr size_t kPeerAddressHeaderBytes = 16;
// UCX worker addresses are a few hundred bytes (one entry per device and transport); NCCL ids
// are 128.
inline constexpr size_t kMaxPeerAddressPayload = size_t{16} << 10;

// "ucx" / "nccl".
const char* PeerAddressKindName(PeerAddressKind kind);

// The envelope around `payload` (1 to kMaxPeerAddressPayload bytes; the caller's own blob).
std::string SealPeerAddress(PeerAddressKind kind, std::string_view payload);

// The payload of `envelope` after checking every header field, the length and the checksum.
// INVALID_ARGUMENT describing the first defect ("is empty", "is 7 bytes, shorter than ...",
// "does not start with the magic ...", "is a nccl address, want ucx", "checksum ... does not
// match"); callers prefix the field and the peer it came from.
absl::StatusOr<std::string> OpenPeerAddress(PeerAddressKind kind, std::string_view envelope);

}  // namespace dfa
