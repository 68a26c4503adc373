#include "common/readahead_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"

namespace tutti {
namespace {

absl::Status ReadError(const std::string& name, uint64_t offset, int64_t r,
                       absl::Duration timeout) {
  if (r == -ETIMEDOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat("read of ", name, " at offset ", offset, " did not finish within ",
                     absl::FormatDuration(timeout), " (the file system stalls)"));
  }
  return ErrnoStatus(static_cast<int>(-r), absl::StrCat("read ", name, " at offset ", offset));
}

absl::Status Shrank(const std::string& name, uint64_t at, uint64_t size) {
  return absl::DataLossError(absl::StrCat(name, " ends at ", at, " bytes, not ", size,
                                          ": it changed while being read; index it again"));
}

}  // namespace

absl::StatusOr<OpenedFile> OpenThroughIoService(IoService* io, const RootDir& root,
                                                const std::string& relative,
                                                const std::string& path, absl::Duration timeout) {
  IoOp op;
  op.kind = IoOp::Kind::kOpen;
  op.root = &root;
  op.path = relative.c_str();
  op.flags = O_RDONLY;
  const int64_t r = io->Run(op, absl::Now() + timeout);
  if (r == -EXDEV || r == -ELOOP) return root.OutsideError("shard", relative);
  if (r == kNotRegularFile) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a regular file (a FIFO, socket or device); refused"));
  }
  if (r == -ETIMEDOUT) {
    return absl::DeadlineExceededError(absl::StrCat("open ", path, " did not finish within ",
                                                    absl::FormatDuration(timeout),
                                                    " (the file system stalls)"));
  }
  if (r < 0) return ErrnoStatus(static_cast<int>(-r), absl::StrCat("open ", path));
  OpenedFile f;
  f.fd = static_cast<int>(r);
  struct stat st;
  if (::fstat(f.fd, &st) != 0) {
    const int err = errno;
    ::close(f.fd);
    return ErrnoStatus(err, absl::StrCat("stat ", path));
  }
  f.size = static_cast<uint64_t>(st.st_size);
  f.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return f;
}

// ---------------------------------------------------------------------------
// ReadAheadBufferPool

std::unique_ptr<char[]> ReadAheadBufferPool::Take() {
  {
    absl::MutexLock l(&mu_);
    if (!free_.empty()) {
      std::unique_ptr<char[]> b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  return std::unique_ptr<char[]>(new char[bytes_]);
}

void ReadAheadBufferPool::Give(std::unique_ptr<char[]> buffer) {
  if (buffer == nullptr) return;
  absl::MutexLock l(&mu_);
  if (free_.size() < keep_) free_.push_back(std::move(buffer));
}

// ---------------------------------------------------------------------------
// ReadAheadFile

// Shared with the IoService's callbacks and held by every operation, so the
// descriptor and the buffers outlive whatever the kernel still does.
struct ReadAheadFile::State {
  struct Chunk {
    uint64_t offset = 0;
    size_t len = 0;
    std::unique_ptr<char[]> buf;
    bool done = false;
    int64_t result = 0;
  };

  State(IoService* io, int fd, uint64_t size, std::string name, const ReadAheadOptions& o,
        Consume consume)
      : io(io),
        fd(fd),
        size(size),
        name(std::move(name)),
        options(o),
        consume(std::move(consume)) {}
  ~State() {
    ::close(fd);
    // Every operation has ended (each held this state): the buffers are free.
    if (options.pool == nullptr) return;
    for (auto& b : free_buffers) options.pool->Give(std::move(b));
    for (auto& c : chunks) options.pool->Give(std::move(c->buf));
  }

  // Issues reads while the window allows, up to covering `want_end`.
  void TopUp(uint64_t want_end) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Waits for a chunk's read; a wait of a millisecond or more (a file
  // system that answers slower than the reader reads) doubles the window.
  void Wait(Chunk* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (c->done) return;
    const absl::Time t0 = absl::Now();
    mu.Await(absl::Condition(&c->done));
    if (absl::Now() - t0 >= absl::Milliseconds(1)) window = std::min(options.depth, window * 2);
  }
  // Waits for the front chunk; the error it ended with, if any.
  absl::Status WaitFront() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Consumes and drops the chunks that end at or before `offset`.
  absl::Status Release(uint64_t offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  absl::Status ChunkStatus(const Chunk& c) const;

  IoService* const io;
  const int fd;
  const uint64_t size;
  const std::string name;
  const ReadAheadOptions options;
  const Consume consume;
  std::weak_ptr<State> self;

  absl::Mutex mu;
  std::deque<std::unique_ptr<Chunk>> chunks ABSL_GUARDED_BY(mu);  // from `released` on
  std::vector<std::unique_ptr<char[]>> free_buffers ABSL_GUARDED_BY(mu);
  uint64_t issued_end ABSL_GUARDED_BY(mu) = 0;
  uint64_t released ABSL_GUARDED_BY(mu) = 0;
  uint64_t last_start ABSL_GUARDED_BY(mu) = 0;
  unsigned pending ABSL_GUARDED_BY(mu) = 0;
  // Reads kept in flight: from 2 up to options.depth as reads keep the
  // reader waiting, so a file the page cache serves holds few buffers.
  unsigned window ABSL_GUARDED_BY(mu) = 2;
  uint64_t reads ABSL_GUARDED_BY(mu) = 0;
  absl::Status failed ABSL_GUARDED_BY(mu);
};

absl::Status ReadAheadFile::State::ChunkStatus(const Chunk& c) const {
  if (c.result < 0) return ReadError(name, c.offset, c.result, options.read_timeout);
  if (static_cast<size_t>(c.result) < c.len) return Shrank(name, c.offset + c.result, size);
  return absl::OkStatus();
}

void ReadAheadFile::State::TopUp(uint64_t want_end) {
  const uint64_t chunk = options.chunk_bytes;
  const uint64_t limit = (want_end + chunk - 1) / chunk * chunk + uint64_t{window} * chunk;
  while (failed.ok() && issued_end < size && issued_end < limit &&
         (issued_end < want_end || pending < window)) {
    auto c = std::make_unique<Chunk>();
    c->offset = issued_end;
    c->len = static_cast<size_t>(std::min<uint64_t>(chunk, size - issued_end));
    if (!free_buffers.empty()) {
      c->buf = std::move(free_buffers.back());
      free_buffers.pop_back();
    } else if (options.pool != nullptr) {
      c->buf = options.pool->Take();
    } else {
      c->buf.reset(new char[chunk]);
    }
    issued_end += c->len;
    ++pending;
    ++reads;
    IoOp op;
    op.kind = IoOp::Kind::kRead;
    op.fd = fd;
    op.buf = c->buf.get();
    op.len = c->len;
    op.offset = c->offset;
    Chunk* raw = c.get();
    chunks.push_back(std::move(c));
    std::shared_ptr<State> keep = self.lock();
    io->Submit(
        op, absl::Now() + options.read_timeout,
        [keep, raw](int64_t r) {
          absl::MutexLock l(&keep->mu);
          raw->result = r;
          raw->done = true;
          --keep->pending;
        },
        keep);
  }
}

absl::Status ReadAheadFile::State::WaitFront() {
  Chunk* c = chunks.front().get();
  Wait(c);
  return ChunkStatus(*c);
}

absl::Status ReadAheadFile::State::Release(uint64_t offset) {
  while (failed.ok() && released < size && released < offset) {
    if (chunks.empty()) TopUp(offset);
    if (chunks.front()->offset + chunks.front()->len > offset) break;
    failed = WaitFront();
    if (!failed.ok()) break;
    std::unique_ptr<Chunk> c = std::move(chunks.front());
    chunks.pop_front();
    released = c->offset + c->len;
    TopUp(released);  // keep reads in flight while the chunk is consumed
    mu.Unlock();
    consume(c->offset, absl::string_view(c->buf.get(), c->len));
    mu.Lock();
    free_buffers.push_back(std::move(c->buf));
  }
  return failed;
}

ReadAheadFile::ReadAheadFile(IoService* io, int fd, uint64_t size, std::string name,
                             const ReadAheadOptions& options, Consume consume)
    : size_(size), name_(name) {
  ReadAheadOptions o = options;
  o.chunk_bytes = std::max<size_t>(4096, o.chunk_bytes / 4096 * 4096);
  o.depth = std::max(1u, o.depth);
  if (o.pool != nullptr && o.pool->buffer_bytes() != o.chunk_bytes) o.pool = nullptr;
  state_ = std::make_shared<State>(
      io, fd, size, std::move(name), o,
      consume ? std::move(consume) : [](uint64_t, absl::string_view) {});
  state_->self = state_;
  absl::MutexLock l(&state_->mu);
  state_->window = std::min(2u, o.depth);
  state_->TopUp(0);
}

ReadAheadFile::~ReadAheadFile() = default;

absl::Status ReadAheadFile::ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const {
  State& s = *state_;
  absl::MutexLock l(&s.mu);
  *got = 0;
  if (offset < s.last_start) {
    return absl::FailedPreconditionError(absl::StrCat("read of ", name_, " at offset ", offset,
                                                      " after a read at ", s.last_start,
                                                      ": the read-ahead window has moved on"));
  }
  s.last_start = offset;
  RETURN_IF_ERROR(s.Release(offset));
  if (offset >= size_ || n == 0) return absl::OkStatus();
  const uint64_t end = std::min<uint64_t>(size_, offset + n);
  s.TopUp(end);
  for (const auto& cp : s.chunks) {
    State::Chunk& c = *cp;
    if (c.offset >= end) break;
    if (c.offset + c.len <= offset) continue;
    s.Wait(&c);
    s.failed = s.ChunkStatus(c);
    RETURN_IF_ERROR(s.failed);
    const uint64_t from = std::max(offset, c.offset), to = std::min(end, c.offset + c.len);
    std::memcpy(out + (from - offset), c.buf.get() + (from - c.offset), to - from);
    *got += to - from;
  }
  return absl::OkStatus();
}

absl::Status ReadAheadFile::Drain() {
  State& s = *state_;
  absl::MutexLock l(&s.mu);
  s.last_start = std::max(s.last_start, size_);
  return s.Release(size_);
}

uint64_t ReadAheadFile::reads() const {
  absl::MutexLock l(&state_->mu);
  return state_->reads;
}

// ---------------------------------------------------------------------------
// IoServiceFile

IoServiceFile::IoServiceFile(IoService* io, int fd, uint64_t size, std::string name,
                             absl::Duration timeout)
    : io_(io),
      fd_(new int(fd),
          [](int* p) {
            ::close(*p);
            delete p;
          }),
      size_(size),
      name_(std::move(name)),
      timeout_(timeout) {}

IoServiceFile::~IoServiceFile() = default;

absl::Status IoServiceFile::ReadAt(uint64_t offset, size_t n, char* out, size_t* got) const {
  *got = 0;
  if (offset >= size_ || n == 0) return absl::OkStatus();
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
  // Into a buffer of the operation's own: a read past its deadline may
  // still be running in the kernel after this returns. The IoService keeps
  // the buffer and the descriptor until it ends; the next read reuses the
  // buffer only when nothing else holds it.
  if (buffer_ == nullptr || buffer_.use_count() > 1 || buffer_->bytes < n) {
    buffer_ = std::make_shared<Buffer>();
    buffer_->data.reset(new char[std::max<size_t>(n, 4096)]);
    buffer_->bytes = std::max<size_t>(n, 4096);
    buffer_->fd = fd_;
  }
  std::shared_ptr<Buffer> keep = buffer_;
  IoOp op;
  op.kind = IoOp::Kind::kRead;
  op.fd = *fd_;
  op.buf = keep->data.get();
  op.len = n;
  op.offset = offset;
  const int64_t r = io_->Run(op, absl::Now() + timeout_, keep);
  if (r < 0) return ReadError(name_, offset, r, timeout_);
  *got = static_cast<size_t>(r);
  std::memcpy(out, keep->data.get(), *got);
  if (*got < n) return Shrank(name_, offset + *got, size_);
  return absl::OkStatus();
}

}  // namespace tutti
