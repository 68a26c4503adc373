// Asynchronous file I/O behind one interface: an io_uring backend (liburing),
// a plain thread-pool backend doing open/pread/pwrite/fsync, and a
// fault-injecting double that wraps either one (delays, stalls, corrupts,
// short reads, EAGAIN, ENOSPC, errors). IoService runs a backend on its own
// thread and adds what every caller needs: deadlines with cancellation,
// resubmission of short reads/writes and of EAGAIN/EINTR, and callbacks.
#ifndef TUTTI_COMMON_URING_FILE_H_
#define TUTTI_COMMON_URING_FILE_H_

#include <sys/stat.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/root_dir.h"

namespace tutti {

// One operation. Pointers (path, buf, stx) must stay valid until it completes.
struct IoOp {
  enum class Kind : uint8_t { kOpen, kRead, kWrite, kFsync, kClose, kStat, kFallocate };
  Kind kind = Kind::kRead;
  int fd = -1;                 // kRead/kWrite/kFsync/kClose/kFallocate
  const char* path = nullptr;  // kOpen/kStat (absolute or relative to cwd, or to root)
  // kOpen: path is relative to this directory and resolved beneath it
  // (RootDir::Open: openat2 RESOLVE_BENEATH or the checked walk); a name
  // that leads outside fails with -EXDEV. Must outlive the operation.
  const RootDir* root = nullptr;
  int flags = 0;         // kOpen
  unsigned mode = 0644;  // kOpen
  char* buf = nullptr;   // kRead/kWrite
  size_t len = 0;        // kRead/kWrite; kFallocate: bytes to allocate
  uint64_t offset = 0;
  int buf_index = -1;           // registered buffer holding buf, or -1
  struct statx* stx = nullptr;  // kStat result
  // The file the operation works on, for IoService's per-file bound
  // (IoServiceOptions::per_file_limit): operations with the same non-zero
  // value share it, across opens of the file (FileKey). 0: none.
  uint64_t file = 0;
  // The file may stall (a network or FUSE file system): io_uring hands the
  // operation straight to its worker threads (IOSQE_ASYNC) instead of
  // trying it on the submitting thread first, which a stalled file (or a
  // FUSE mount whose background requests are all stuck) would block.
  bool may_stall = false;
};

// IoOp::file for a file known by name (a shard, say): the same name, the
// same key. Never 0.
uint64_t FileKey(absl::string_view name);

struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes, fd or 0; -errno on failure
};

// A queue of operations owned by one thread (not thread-safe).
class IoBackend {
 public:
  virtual ~IoBackend() = default;
  // Registers buffers for fixed reads/writes (io_uring); others ignore it.
  virtual absl::Status RegisterBuffers(const std::vector<iovec>& buffers) {
    return absl::OkStatus();
  }
  // Queues op; completions come back through Reap with the same tag. At most
  // capacity() operations may be outstanding.
  virtual absl::Status Submit(const IoOp& op, uint64_t tag) = 0;
  // Sends queued operations and waits up to `timeout` for at least one
  // completion, appending all that are available to *out.
  virtual absl::Status Reap(absl::Duration timeout, std::vector<IoCompletion>* out) = 0;
  // Best effort: asks for an outstanding operation to end early. Its
  // completion still arrives (usually with -ECANCELED or -EINTR).
  virtual void Cancel(uint64_t tag) = 0;
  // Thread-safe: makes a Reap that is waiting return early.
  virtual void Wake() = 0;
  virtual unsigned capacity() const = 0;
  virtual const char* name() const = 0;
};

// io_uring with `depth` entries; `max_workers` bounds the kernel's worker
// threads for blocking files (network file systems, FUSE); 0 keeps the
// kernel default. Give it room for the operations IoService no longer
// counts against `depth` once they are stuck (IoServiceOptions): twice the
// depth.
absl::StatusOr<std::unique_ptr<IoBackend>> MakeUringBackend(unsigned depth,
                                                            unsigned max_workers = 0);
// open/pread/pwrite/fsync on `threads` threads. An operation cancelled while
// it runs (its deadline passed) is interrupted with a signal, as io_uring
// does with its own workers, and its thread replaced while the call stays
// stuck (common/pread_backend.h).
std::unique_ptr<IoBackend> MakePreadBackend(unsigned threads);

// Which backend a daemon uses: io_uring, the thread pool, or io_uring when
// the kernel lets this process set up a ring (a container's seccomp profile
// may refuse it: containerd 2 and Docker 25 do by default), else the pool.
enum class IoBackendChoice { kAuto, kUring, kPread };
// "auto" | "uring" | "pread"; INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<IoBackendChoice> ParseIoBackendChoice(absl::string_view name);
// True for io_uring. kAuto probes once (a ring of one entry) and, when
// io_uring is refused, logs one line saying so and that pread is used. kUring
// when refused: FAILED_PRECONDITION with the kernel's reason and the fix.
absl::StatusOr<bool> ResolveIoBackend(IoBackendChoice choice);

// Faults for tests, matched by a substring of the path an fd was opened with.
struct IoFault {
  std::string path_contains;  // empty: every path
  IoOp::Kind kind = IoOp::Kind::kRead;
  int error = 0;                 // fail with -error
  absl::Duration delay;          // complete this much later
  bool stall = false;            // never complete until cancelled (-ECANCELED)
  bool corrupt = false;          // flip a byte of the data read
  size_t short_len = 0;          // return at most this many bytes per call
  int eagain_times = 0;          // fail with -EAGAIN this many times first
  uint64_t min_offset = 0;       // only for reads/writes at or after this offset
  std::function<void()> before;  // runs (once) before the matching op is passed on
  // With delay: Cancel does not stop it, it completes all the same (as an
  // open already running in the kernel does). With stall: Cancel does not
  // end it either, it never completes (a hard NFS mount, or a FUSE read the
  // kernel sent in the background).
  bool uncancellable = false;
};

// Wraps `inner` and applies the first matching fault to each operation.
// write_limit_bytes > 0: writes past this many bytes in total fail with ENOSPC.
class FaultInjectingBackend final : public IoBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<IoBackend> inner, std::vector<IoFault> faults,
                        uint64_t write_limit_bytes = 0);
  absl::Status RegisterBuffers(const std::vector<iovec>& buffers) override;
  absl::Status Submit(const IoOp& op, uint64_t tag) override;
  absl::Status Reap(absl::Duration timeout, std::vector<IoCompletion>* out) override;
  void Cancel(uint64_t tag) override;
  void Wake() override { inner_->Wake(); }
  unsigned capacity() const override { return inner_->capacity(); }
  const char* name() const override { return "fault-injecting"; }

 private:
  struct Held {
    IoOp op;
    absl::Time due;  // InfiniteFuture for a stall
    int64_t result;
    bool pass_on;                // submit to inner at `due` instead of completing
    bool uncancellable = false;  // Cancel leaves it held
  };
  IoFault* Match(const IoOp& op);

  std::unique_ptr<IoBackend> inner_;
  std::vector<IoFault> faults_;
  std::vector<bool> before_done_;
  uint64_t write_limit_;
  uint64_t written_ = 0;
  std::unordered_map<int, std::string> fd_paths_;
  std::unordered_map<uint64_t, IoOp> inner_ops_;  // tag -> op passed to inner
  std::map<uint64_t, Held> held_;
  std::vector<IoCompletion> ready_;
};

// IoService's answer to a kOpen whose path names no regular file (a FIFO,
// socket or device): -ENXIO, which the kernel also gives for a FIFO opened
// for writing without a reader and for a socket file.
inline constexpr int64_t kNotRegularFile = -ENXIO;

// IoService's answer when an operation's deadline passed before it was sent
// to the backend (or while the service thread was still handing it over):
// it waited behind the backend's capacity or its file's bound, or the
// service thread was not run in time (short of CPU). Not the file system's
// doing, unlike -ETIMEDOUT (sent in time, and not answered).
inline constexpr int64_t kTimedOutQueued = -ETIME;
// IoService's answer, at once, to an operation on a file that stalls: its
// bound (IoServiceOptions::per_file_limit) is held entirely by operations
// that timed out and have not returned, or that many of its operations in a
// row got no answer in time and stalled_file_retry has not passed since.
inline constexpr int64_t kFileStalled = -EBUSY;
inline bool IsTimeout(int64_t result) { return result == -ETIMEDOUT || result == kTimedOutQueued; }

struct IoServiceOptions {
  // Operations of one file (IoOp::file) in the backend at once, those that
  // timed out and have not returned included: a stalled file holds at most
  // this many of the backend's workers (io_uring's, the pread threads) and
  // of a FUSE mount's background requests (12 by default for the whole
  // mount). Further operations of the file wait for one to end; once all
  // of them are stuck, they are answered kFileStalled at once. 0: no bound.
  unsigned per_file_limit = 0;
  // Once per_file_limit operations of a file in a row got no answer in time
  // (stuck, or ended only by their cancel), its operations are answered
  // kFileStalled at once for this long, then sent again; the next one that
  // gets no answer in time starts another such wait, one answered in time
  // ends them.
  absl::Duration stalled_file_retry = absl::Seconds(10);
  // How long stopping waits for cancelled operations to end before it
  // keeps their memory and the backend alive instead (never for ones that
  // were stuck already).
  absl::Duration stop_wait = absl::Milliseconds(500);
};

// What an IoService has seen (thread-safe reads).
struct IoServiceStats {
  uint64_t timeouts = 0;          // answered -ETIMEDOUT: the backend did not answer in time
  uint64_t queued_timeouts = 0;   // answered kTimedOutQueued
  uint64_t stalled_refusals = 0;  // answered kFileStalled
  size_t stuck = 0;               // timed out, still in the backend (each holds a worker)
  size_t in_backend = 0;          // in the backend now, stuck ones included
  size_t waiting = 0;             // accepted, not yet in the backend
};

// Runs a backend on its own thread. Thread-safe; callbacks run on the
// service thread and must not block.
class IoService {
 public:
  // result: bytes (reads/writes: the whole length unless end of file), fd,
  // or 0; -errno on failure; -ETIMEDOUT when the deadline passed in the
  // backend (the operation may still be running: keepalive is held until it
  // really ends), kTimedOutQueued when it passed before the operation was
  // sent, kFileStalled (see IoServiceOptions).
  using Done = std::function<void(int64_t result)>;

  // Operations that timed out in the backend and have not returned (at most
  // the backend's capacity of them) no longer count against its capacity:
  // the backends keep workers for the others (MakeUringBackend,
  // MakePreadBackend).
  explicit IoService(std::unique_ptr<IoBackend> backend, IoServiceOptions options = {});
  ~IoService();  // stops; pending callbacks get -ECANCELED

  absl::Status RegisterBuffers(const std::vector<iovec>& buffers);
  // Submits op. Reads and writes are resubmitted until `len` bytes are done
  // (reads stop early at end of file). keepalive is held until the backend
  // has finished with op's memory. A kOpen of a file (not O_DIRECTORY or
  // O_PATH) opens only a regular file: the open does not block on a FIFO
  // or a device (O_NONBLOCK, cleared once the file is known to be
  // regular), and anything else is closed and answered kNotRegularFile.
  void Submit(const IoOp& op, absl::Time deadline, Done done,
              std::shared_ptr<void> keepalive = nullptr);
  // Blocking convenience for threads that may wait.
  int64_t Run(const IoOp& op, absl::Time deadline, std::shared_ptr<void> keepalive = nullptr);

  size_t outstanding() const;
  IoServiceStats stats() const;
  // Where a timed-out operation's time went. Read it inside the Done
  // callback that answers -ETIMEDOUT or kTimedOutQueued (on the service
  // thread): it describes that operation.
  struct Timeout {
    absl::Duration queued;      // accepted until sent to the backend (or until the deadline)
    absl::Duration in_backend;  // sent until the deadline; 0 when never sent
    // How late the service thread noticed the deadline. Far above a few
    // milliseconds, the thread was not run in time: the host is short of
    // CPU (or callbacks keep the thread busy).
    absl::Duration lag;
    size_t ahead = 0;  // operations in the backend then, stuck ones included
  };
  const Timeout& last_timeout() const { return last_timeout_; }
  unsigned per_file_limit() const { return opts_.per_file_limit; }
  absl::Duration stalled_file_retry() const { return opts_.stalled_file_retry; }
  unsigned capacity() const { return backend_->capacity(); }
  // True after stopping left an operation stuck in the kernel (its memory
  // was deliberately kept).
  bool stuck() const { return stopped_stuck_.load(); }
  const char* backend_name() const { return name_; }

 private:
  struct Req {
    IoOp op;
    absl::Time deadline;
    absl::Time accepted;
    absl::Time sent = absl::InfiniteFuture();  // first in the backend (its Submit returned)
    Done done;
    std::shared_ptr<void> keepalive;
    size_t done_bytes = 0;
    bool in_backend = false;
    bool timed_out = false;     // done already called with -ETIMEDOUT
    bool stuck = false;         // timed out while in the backend, not returned yet
    bool regular_only = false;  // a kOpen of a file: refuse what is not a regular file
    int eagain = 0;
  };
  struct FileState {
    unsigned in_backend = 0;  // stuck ones included
    unsigned stuck = 0;
    unsigned timeouts = 0;  // operations in a row that got no answer in time
    absl::Time refuse_until = absl::InfinitePast();
  };
  void Loop();
  // Sends what waits while the backend has room, each file within its bound.
  void IssueWaiting();
  // False when the backend refused it for now (its queue is full).
  bool Issue(uint64_t id, Req& r);
  void Complete(uint64_t id, int64_t result);
  void TimeOut(absl::Time now);
  // Answers a request whose deadline passed before it was sent.
  void TimeOutQueued(Req& r, absl::Time now);
  void Shutdown();
  // Operations counted against the backend's capacity.
  size_t Busy() const { return in_backend_ - std::min<size_t>(stuck_, backend_->capacity()); }
  void PublishStats();
  // A file just opened: the fd once O_NONBLOCK is cleared, or, closed,
  // kNotRegularFile when it is not a regular file.
  static int64_t KeepIfRegular(int fd);

  std::unique_ptr<IoBackend> backend_;
  const IoServiceOptions opts_;
  absl::Mutex mu_;
  std::deque<std::pair<uint64_t, Req>> incoming_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Owned by the service thread:
  std::unordered_map<uint64_t, Req> reqs_;
  std::deque<uint64_t> waiting_;                   // accepted, not yet in the backend (queue full)
  std::unordered_map<uint64_t, FileState> files_;  // by IoOp::file, while it has operations in
  size_t in_backend_ = 0;
  size_t stuck_ = 0;
  uint64_t next_id_ = 1;
  std::atomic<size_t> outstanding_{0};
  std::atomic<bool> stopped_stuck_{false};
  // Published by the service thread for stats() and lag().
  std::atomic<uint64_t> timeouts_{0}, queued_timeouts_{0}, stalled_refusals_{0};
  std::atomic<size_t> stuck_now_{0}, in_backend_now_{0}, waiting_now_{0};
  Timeout last_timeout_;  // written on the service thread before a timeout's callback
  const char* name_;
  std::thread thread_;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_URING_FILE_H_
