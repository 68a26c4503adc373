#include "common/byte_size.h"

#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace tutti {

bool ParseByteSize(absl::string_view text, uint64_t* out) {
  if (text.empty()) return false;
  int shift = 0;
  switch (text.back()) {
    case 'K':
    case 'k':
      shift = 10;
      break;
    case 'M':
    case 'm':
      shift = 20;
      break;
    case 'G':
    case 'g':
      shift = 30;
      break;
    case 'T':
    case 't':
      shift = 40;
      break;
    default:
      break;
  }
  if (shift) text.remove_suffix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;  // SimpleAtoi alone takes spaces and signs
  }
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) return false;
  if (v > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
  *out = v << shift;
  return true;
}

std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  return u == 0 ? absl::StrFormat("%d B", bytes) : absl::StrFormat("%.1f %s", v, kUnits[u]);
}

}  // namespace tutti
