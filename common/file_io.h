// File access behind one small interface, so readers (tar, index) work the
// same on a local file, an in-memory buffer or a fault-injecting double.
#ifndef TUTTI_COMMON_FILE_IO_H_
#define TUTTI_COMMON_FILE_IO_H_

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tutti {

class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to n bytes at offset into out; *got is the count read (short only
  // at end of file). Thread-safe.
  virtual absl::Status ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const = 0;
  virtual uint64_t size() const = 0;
  virtual const std::string& name() const = 0;

  // Reads exactly n bytes or fails with DATA_LOSS naming the file.
  absl::Status ReadExactly(uint64_t offset, size_t n, char* out) const;
  absl::StatusOr<std::string> ReadString(uint64_t offset, size_t n) const;
};

// Opens `path` read-only (O_CLOEXEC) if it is a regular file and sets *size;
// a FIFO, socket, directory or device is refused (INVALID_ARGUMENT naming
// the path and what it is) at once, without blocking in open(2) or read(2).
// The caller closes the descriptor.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size);

// pread(2) on a regular file (opened with OpenRegularFile).
absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenLocalFile(const std::string& path);

// A file held in memory (tests, generated data).
std::unique_ptr<RandomAccessFile> MakeMemoryFile(std::string name, std::string data);

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Writes to "<path>.tmp.<pid>", fsyncs, renames over path and fsyncs the
// directory: readers see the old file or the whole new one, never a part.
// mode: the new file's permissions (less the umask).
absl::Status WriteFileAtomically(const std::string& path, absl::string_view data,
                                 unsigned mode = 0644);

// Joins root and a relative path, refusing absolute paths and ".." components
// that would escape root (INVALID_ARGUMENT naming the path).
absl::StatusOr<std::string> JoinUnder(absl::string_view root, absl::string_view relative);

}  // namespace tutti

#endif  // TUTTI_COMMON_FILE_IO_H_
