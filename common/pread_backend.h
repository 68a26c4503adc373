// The thread-pool IoBackend (open/pread/pwrite/fsync on worker threads),
// for MakePreadBackend and for io_uring's checked-walk opens. Internal to
// common/uring_file*.cc and common/pread_backend.cc.
//
// A worker whose operation is cancelled while it runs (IoService: its
// deadline passed) is interrupted with a signal, as io_uring interrupts its
// own workers: a FUSE file system, or an NFS mount with `intr`, then ends
// the call with EINTR. A call that ignores the signal (a hard NFS mount)
// keeps its thread; a new worker takes that thread's place, so a stalled
// file never holds the pool (at most as many replacements as the pool has
// threads). The stuck thread leaves once its call returns.
#ifndef TUTTI_COMMON_PREAD_BACKEND_H_
#define TUTTI_COMMON_PREAD_BACKEND_H_

#include <pthread.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/uring_file.h"

namespace tutti::io_internal {

// Performs one operation with plain system calls: the result, or -errno.
int64_t RunSync(const IoOp& op);

class PreadBackend final : public IoBackend {
 public:
  // on_done (optional) runs on a worker after each completion is queued.
  explicit PreadBackend(unsigned threads, std::function<void()> on_done = nullptr);
  // Joins the workers: none may be stuck in a call (IoService keeps a
  // backend with a stuck operation rather than destroy it).
  ~PreadBackend() override;

  absl::Status Submit(const IoOp& op, uint64_t tag) override;
  absl::Status Reap(absl::Duration timeout, std::vector<IoCompletion>* out) override;
  // Queued: dropped, answered -ECANCELED. Running: interrupted (see above)
  // and replaced; its completion comes when its call returns.
  void Cancel(uint64_t tag) override;
  void Wake() override;
  // One operation per thread: what waits, waits in IoService, where its
  // deadline and its file's bound apply.
  unsigned capacity() const override { return threads_; }
  const char* name() const override { return "pread"; }

  // Workers started to take the place of stuck ones (for tests).
  unsigned replacements() const;

 private:
  struct Worker {
    std::thread thread;
    uint64_t tag = 0;  // the operation it runs
    IoOp::Kind kind = IoOp::Kind::kRead;
    bool running = false;
    bool abandoned = false;  // its operation was cancelled while it ran
    bool finished = false;   // returned; joined by the next StartWorker or the destructor
  };
  bool Reapable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !done_.empty() || woken_; }
  bool Runnable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }
  void StartWorker() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Work(Worker* self);
  unsigned Live() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const unsigned threads_;
  const std::function<void()> on_done_;
  mutable absl::Mutex mu_;
  std::deque<std::pair<uint64_t, IoOp>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<IoCompletion> done_ ABSL_GUARDED_BY(mu_);
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Worker> workers_ ABSL_GUARDED_BY(mu_);
  unsigned abandoned_ ABSL_GUARDED_BY(mu_) = 0;  // live workers stuck in a cancelled call
  unsigned replacements_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::io_internal

#endif  // TUTTI_COMMON_PREAD_BACKEND_H_
