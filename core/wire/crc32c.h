// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78): the checksum of every
// TensorChunk on the client data plane (dfa.v1.TensorChunk.crc32c). Shared by the worker and
// the client library (target dfa_crc32c).
//
// Crc32c("123456789") == 0xE3069283. Uses the SSE4.2 crc32 instruction when the CPU has it
// (runtime dispatch; the build stays portable x86-64), otherwise slicing-by-8 tables.
// Thread-safe; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dfa {

// Extends `crc` (the value returned for the preceding bytes; 0 to start) over data[0, n).
// Crc32cExtend(Crc32cExtend(0, a, na), b, nb) == Crc32c(a ++ b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// CRC32C of data[0, n).
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// The portable table-driven path alone (tests compare it with the dispatched one).
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace dfa
