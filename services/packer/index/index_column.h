// One column of an index being written: append-only bytes with their
// running CRC-32C, held in memory or, past a few MiB, in an unlinked
// temporary file, so that writing 100 M samples does not hold gigabytes.
#ifndef TUTTI_SERVICES_PACKER_INDEX_INDEX_COLUMN_H_
#define TUTTI_SERVICES_PACKER_INDEX_INDEX_COLUMN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace tutti::packer {

class IndexColumn {
 public:
  // Bytes held in memory before they go to the file (when spilling).
  static constexpr size_t kSpillBytes = size_t{2} << 20;

  IndexColumn() = default;
  ~IndexColumn();
  IndexColumn(const IndexColumn&) = delete;
  IndexColumn& operator=(const IndexColumn&) = delete;

  // From now on keeps bytes past kSpillBytes in an unlinked file under dir.
  absl::Status SpillTo(const std::string& dir);
  void Reserve(size_t bytes) {
    if (fd_ < 0) buf_.reserve(bytes);
  }
  void Append(const void* data, size_t n);
  template <typename T>
  void Push(const T& v) {
    Append(&v, sizeof(T));
  }

  uint64_t size() const { return size_; }
  uint32_t crc32c() const { return crc_; }
  // The first error writing the temporary file.
  const absl::Status& status() const { return status_; }

  // Appends the column's bytes to *out.
  absl::Status AppendTo(std::string* out) const;
  // Writes the column's bytes to `fd` from `offset` on.
  absl::Status WriteTo(int fd, uint64_t offset) const;

 private:
  void Flush();

  std::string buf_;  // the bytes after the first `spilled_`
  int fd_ = -1;
  uint64_t spilled_ = 0;  // bytes in the file
  uint64_t size_ = 0;
  uint32_t crc_ = 0;
  absl::Status status_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_INDEX_INDEX_COLUMN_H_
