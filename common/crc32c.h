// CRC-32C (Castagnoli), hardware-accelerated with SSE4.2 where available.
#ifndef TUTTI_COMMON_CRC32C_H_
#define TUTTI_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

namespace tutti {

// Extends crc (start with 0) over n bytes.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
// The CRC of A+B from crc(A), crc(B) and B's length, so blocks checked out of
// order (as parallel reads complete) combine into the whole file's CRC.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);
inline uint32_t Crc32c(absl::string_view s) { return Crc32cExtend(0, s.data(), s.size()); }

}  // namespace tutti

#endif  // TUTTI_COMMON_CRC32C_H_
