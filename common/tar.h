// Reading and writing POSIX (ustar) tar archives as WebDataset shards.
#ifndef TUTTI_COMMON_TAR_H_
#define TUTTI_COMMON_TAR_H_

#include <cstdint>
#include <functional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file_io.h"

namespace tutti {

struct TarMember {
  std::string name;         // full member name (long names and pax paths resolved)
  uint64_t data_offset = 0; // where the member's bytes start in the archive
  uint64_t size = 0;
};

// Calls fn for every regular-file member in order. Directories, long-name
// and pax records are passed over; links and special files are passed to
// `skipped` (if given) with why they are not read. Every numeric field is
// bounds-checked: fails with DATA_LOSS naming the archive and offset for a
// bad header checksum, an unparsable or negative number, or a member that
// runs past the end of the file (a truncated shard, or a size near 2^64),
// and with INVALID_ARGUMENT for a member whose name is absolute or contains
// "..".
absl::Status ForEachTarMember(
    const RandomAccessFile& file, const std::function<absl::Status(const TarMember&)>& fn,
    const std::function<void(const TarMember&, absl::string_view why)>& skipped = nullptr);

absl::StatusOr<std::vector<TarMember>> ListTarMembers(const RandomAccessFile& file);

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF). Shard, member and key names travel in protobuf
// strings, which must be UTF-8, so anything else is refused where it enters.
bool IsValidUtf8(absl::string_view s);

// `name` (a shard path under the source directory, or a member path inside a
// shard) is relative, has no empty, "." or ".." component and is UTF-8;
// INVALID_ARGUMENT naming `what` and the name (escaped) otherwise.
absl::Status CheckRelativeName(absl::string_view name, absl::string_view what);

// Splits a WebDataset member name into key and extension at the first '.' of
// its basename: "a/000042.0.jpg" -> ("a/000042", "0.jpg").
std::pair<absl::string_view, absl::string_view> SplitWebDatasetName(absl::string_view name);

// Appends ustar records to a string (used by `tutti gen-dataset` and tests).
class TarWriter {
 public:
  void Add(absl::string_view name, absl::string_view data);
  // Finishes the archive (two zero blocks) and returns it.
  std::string Finish();
  size_t size() const { return out_.size(); }

 private:
  void AppendHeader(absl::string_view name, uint64_t size, char type);
  void AppendData(absl::string_view data);

  std::string out_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_TAR_H_
