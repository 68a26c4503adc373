// Byte sizes as users write them on command lines: "123", "64K", "1M",
// "500G", "2T" (binary multiples, either case).
#ifndef TUTTI_COMMON_BYTE_SIZE_H_
#define TUTTI_COMMON_BYTE_SIZE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tutti {

// false when `text` is malformed or does not fit in 64 bits.
bool ParseByteSize(absl::string_view text, uint64_t* out);

// "1.5 GiB", "640 KiB", "12 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace tutti

#endif  // TUTTI_COMMON_BYTE_SIZE_H_
