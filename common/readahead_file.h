// Reading a file through an IoService (io_uring, or the pread pool) as a
// RandomAccessFile, for readers that otherwise pay a round trip per small
// read on a network file system:
//
// - ReadAheadFile reads the file front to back in large chunks with several
//   reads in flight and serves reads from that window. Its reader moves
//   forward (each read starts at or after the previous read's start, as a
//   tar walk does), and every byte of the file passes, once and in order,
//   through a `consume` callback (a checksum of the whole file) before its
//   chunk is dropped.
// - IoServiceFile passes each read to the IoService as one operation: one
//   read in flight, a round trip each (the reader ReadAheadFile replaces).
//
// Both own the descriptor; it is closed once the IoService no longer uses it
// (an operation past its deadline may still be running in the kernel).
// Reads block the calling thread; ReadAt may be called from one thread at a
// time per file.
#ifndef TUTTI_COMMON_READAHEAD_FILE_H_
#define TUTTI_COMMON_READAHEAD_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/file_io.h"
#include "common/root_dir.h"
#include "common/uring_file.h"

namespace tutti {

// Read buffers shared by the ReadAheadFiles of one reader, so that a file
// does not fault in fresh memory for each of its reads. Thread-safe.
class ReadAheadBufferPool {
 public:
  // Buffers of `buffer_bytes`; at most `keep` are kept when given back.
  ReadAheadBufferPool(size_t buffer_bytes, size_t keep) : bytes_(buffer_bytes), keep_(keep) {}
  size_t buffer_bytes() const { return bytes_; }
  std::unique_ptr<char[]> Take();
  void Give(std::unique_ptr<char[]> buffer);

 private:
  const size_t bytes_;
  const size_t keep_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<char[]>> free_ ABSL_GUARDED_BY(mu_);
};

struct ReadAheadOptions {
  // Bytes per read (a multiple of 4096). Default 1 MiB: an NFS rsize, a
  // FUSE request.
  size_t chunk_bytes = size_t{1} << 20;
  // Reads in flight ahead of the reader, at most: a file starts with 2
  // and doubles them while its reads keep the reader waiting (1 ms or more),
  // so a file the page cache serves holds few buffers. Default 8.
  unsigned depth = 8;
  // A read not done by then fails the file. Default 5 minutes.
  absl::Duration read_timeout = absl::Minutes(5);
  // Where the read buffers come from and go back to (used when its
  // buffers are of chunk_bytes). Default none: the file's own.
  std::shared_ptr<ReadAheadBufferPool> pool;
};

// A file opened beneath a root through an IoService, with what fstat(2)
// says of it.
struct OpenedFile {
  int fd = -1;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};
// Opens `relative` under `root` read-only as a regular file (the stager's
// rules: beneath the root, no FIFO or device). Errors name `path` (the
// name shown to users).
absl::StatusOr<OpenedFile> OpenThroughIoService(IoService* io, const RootDir& root,
                                                const std::string& relative,
                                                const std::string& path, absl::Duration timeout);

class ReadAheadFile final : public RandomAccessFile {
 public:
  // Called with consecutive ranges of the file, in order, on the thread
  // that reads (ReadAt / Drain), before their bytes are dropped.
  using Consume = std::function<void(uint64_t offset, absl::string_view bytes)>;

  ReadAheadFile(IoService* io, int fd, uint64_t size, std::string name,
                const ReadAheadOptions& options, Consume consume);
  ~ReadAheadFile() override;

  // Reads [offset, offset + n). FAILED_PRECONDITION when offset lies before
  // an earlier read's start (the window has moved on); a failed read fails
  // this and every later call alike.
  absl::Status ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const override;
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

  // Reads and consumes the rest of the file.
  absl::Status Drain();
  // Reads issued so far.
  uint64_t reads() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  const uint64_t size_;
  const std::string name_;
};

class IoServiceFile final : public RandomAccessFile {
 public:
  IoServiceFile(IoService* io, int fd, uint64_t size, std::string name, absl::Duration timeout);
  ~IoServiceFile() override;

  absl::Status ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const override;
  uint64_t size() const override { return size_; }
  const std::string& name() const override { return name_; }

 private:
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t bytes = 0;
    std::shared_ptr<int> fd;  // kept open while a read holds the buffer
  };
  IoService* io_;
  std::shared_ptr<int> fd_;                 // closed when the last operation holding it ends
  mutable std::shared_ptr<Buffer> buffer_;  // the last read's, reused
  const uint64_t size_;
  const std::string name_;
  const absl::Duration timeout_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_READAHEAD_FILE_H_
