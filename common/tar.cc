#include "common/tar.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace tutti {
namespace {

constexpr size_t kBlock = 512;

uint64_t RoundUp(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

// Parses an octal (or GNU base-256) numeric header field. A negative
// base-256 value (leading 0xFF) or one that does not fit 64 bits is refused.
bool ParseNumber(const char* field, size_t len, uint64_t* out) {
  if (len > 0 && (static_cast<unsigned char>(field[0]) & 0x80)) {
    if (static_cast<unsigned char>(field[0]) != 0x80) return false;  // negative, or reserved
    uint64_t v = 0;
    for (size_t i = 1; i < len; ++i) {
      if (v > (UINT64_MAX >> 8)) return false;
      v = (v << 8) | static_cast<unsigned char>(field[i]);
    }
    *out = v;
    return true;
  }
  uint64_t v = 0;
  size_t i = 0;
  while (i < len && (field[i] == ' ' || field[i] == '\0')) ++i;
  bool any = false;
  for (; i < len && field[i] >= '0' && field[i] <= '7'; ++i) {
    v = v * 8 + static_cast<uint64_t>(field[i] - '0');
    any = true;
  }
  for (; i < len; ++i) {
    if (field[i] != ' ' && field[i] != '\0') return false;
  }
  *out = any ? v : 0;
  return true;
}

std::string CString(const char* p, size_t max) { return std::string(p, strnlen(p, max)); }

absl::Status CheckName(const RandomAccessFile& file, const std::string& name, uint64_t offset) {
  if (!name.empty() && name.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        file.name(), ": member '", name, "' at offset ", offset,
        " has an absolute path; rebuild the shard with relative member names"));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          file.name(), ": member '", name, "' at offset ", offset,
          " has a '..' component that would escape the shard; rebuild the shard"));
    }
  }
  return absl::OkStatus();
}

// Extracts "path=" from a pax extended header body.
std::string PaxPath(absl::string_view body) {
  std::string path;
  while (!body.empty()) {
    size_t sp = body.find(' ');
    if (sp == absl::string_view::npos) break;
    uint64_t len = 0;
    if (!absl::SimpleAtoi(body.substr(0, sp), &len) || len == 0 || len > body.size()) break;
    absl::string_view rec = body.substr(sp + 1, len - sp - 1);
    if (!rec.empty() && rec.back() == '\n') rec.remove_suffix(1);
    if (rec.substr(0, 5) == "path=") path = std::string(rec.substr(5));
    body.remove_prefix(len);
  }
  return path;
}

}  // namespace

absl::Status ForEachTarMember(const RandomAccessFile& file,
                              const std::function<absl::Status(const TarMember&)>& fn,
                              const std::function<void(const TarMember&, absl::string_view)>& skipped) {
  const uint64_t end = file.size();
  uint64_t off = 0;
  std::string pending_name;
  char h[kBlock];
  while (off + kBlock <= end) {
    RETURN_IF_ERROR(file.ReadExactly(off, kBlock, h));
    bool zero = true;
    for (size_t i = 0; i < kBlock && zero; ++i) zero = h[i] == 0;
    if (zero) return absl::OkStatus();  // end-of-archive marker

    uint64_t stored_sum = 0;
    if (!ParseNumber(h + 148, 8, &stored_sum)) {
      return absl::DataLossError(absl::StrCat(file.name(), ": bad tar header at offset ", off,
                                              " (not a tar file, or corrupt)"));
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < kBlock; ++i) {
      sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
    }
    if (sum != stored_sum) {
      return absl::DataLossError(absl::StrCat(file.name(), ": tar header checksum mismatch at offset ",
                                              off, " (corrupt shard; re-copy or rebuild it)"));
    }
    uint64_t size = 0;
    if (!ParseNumber(h + 124, 12, &size)) {
      return absl::DataLossError(absl::StrCat(file.name(), ": bad size field at offset ", off));
    }
    const char type = h[156];
    const uint64_t data = off + kBlock;  // <= end: the loop condition
    // Compared without adding, so a size near 2^64 cannot wrap around.
    if (size > end - data) {
      return absl::DataLossError(absl::StrCat(
          file.name(), ": truncated tar: member at offset ", off, " declares ", size,
          " bytes but the file ends at ", end, "; re-copy the shard from its source"));
    }
    std::string name;
    if (type == 'L' || type == 'x') {
      if (size > (1u << 20)) {
        return absl::DataLossError(absl::StrCat(file.name(), ": oversized long-name record at ", off));
      }
      ASSIGN_OR_RETURN(std::string body, file.ReadString(data, size));
      pending_name = type == 'L' ? CString(body.data(), body.size()) : PaxPath(body);
      off = data + RoundUp(size);
      continue;
    }
    if (!pending_name.empty()) {
      name = std::move(pending_name);
      pending_name.clear();
    } else {
      name = CString(h, 100);
      if (std::memcmp(h + 257, "ustar", 5) == 0 && h[345] != '\0') {
        name = absl::StrCat(CString(h + 345, 155), "/", name);
      }
    }
    if (type == '0' || type == '\0' || type == '7') {
      RETURN_IF_ERROR(CheckName(file, name, off));
      RETURN_IF_ERROR(fn(TarMember{name, data, size}));
    } else if (skipped && type != '5' && type != 'g' && type != 'K') {
      // Links and special files: not followed, but reported.
      std::string why;
      if (type == '1' || type == '2') {
        why = absl::StrCat(type == '1' ? "a hard link" : "a symbolic link", " to '",
                           CString(h + 157, 100), "' (links are not followed; store the file itself)");
      } else {
        why = absl::StrCat("an entry of type '", absl::CEscape(std::string(1, type)),
                           "', not a regular file");
      }
      skipped(TarMember{name, data, size}, why);
    }
    off = data + RoundUp(size);  // no wrap: size <= end - data
  }
  if (off > end) {
    return absl::DataLossError(absl::StrCat(
        file.name(), ": truncated tar: the last member's block runs past the end of the file at ",
        end, "; re-copy the shard from its source"));
  }
  if (off != end) {
    return absl::DataLossError(absl::StrCat(file.name(), ": truncated tar: ", end - off,
                                            " stray bytes after the last member at offset ", off));
  }
  return absl::OkStatus();  // archive without end marker: accept what is there
}

absl::StatusOr<std::vector<TarMember>> ListTarMembers(const RandomAccessFile& file) {
  std::vector<TarMember> out;
  RETURN_IF_ERROR(ForEachTarMember(file, [&](const TarMember& m) {
    out.push_back(m);
    return absl::OkStatus();
  }));
  return out;
}

bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

absl::Status CheckRelativeName(absl::string_view name, absl::string_view what) {
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " name '", absl::CHexEscape(name),
        "' is not valid UTF-8; rename it (names travel in protobuf strings, which must be UTF-8)"));
  }
  if (name.empty() || name.front() == '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " name '", name, "' is not a relative path"));
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "." || part == "..") {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " name '", name, "' has an empty, '.' or '..' component; it must name a file "
          "inside its directory"));
    }
  }
  return absl::OkStatus();
}

std::pair<absl::string_view, absl::string_view> SplitWebDatasetName(absl::string_view name) {
  size_t slash = name.rfind('/');
  size_t base = slash == absl::string_view::npos ? 0 : slash + 1;
  size_t dot = name.find('.', base);
  if (dot == absl::string_view::npos) return {name, absl::string_view()};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

void TarWriter::AppendHeader(absl::string_view name, uint64_t size, char type) {
  char h[kBlock];
  std::memset(h, 0, sizeof(h));
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 99));
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = type;
  if (type == 'L') {
    std::memcpy(h + 257, "ustar  ", 8);  // GNU magic and version
  } else {
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
  }
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);
  out_.append(h, kBlock);
}

void TarWriter::AppendData(absl::string_view data) {
  out_.append(data.data(), data.size());
  out_.append(RoundUp(data.size()) - data.size(), '\0');
}

void TarWriter::Add(absl::string_view name, absl::string_view data) {
  if (name.size() > 99) {
    // GNU long name record: the full name (NUL-terminated) as its data.
    std::string body(name);
    body.push_back('\0');
    AppendHeader("././@LongLink", body.size(), 'L');
    AppendData(body);
  }
  AppendHeader(name, data.size(), '0');
  AppendData(data);
}

std::string TarWriter::Finish() {
  out_.append(2 * kBlock, '\0');
  return std::move(out_);
}

}  // namespace tutti
