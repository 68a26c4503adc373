#include "common/pread_backend.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tutti {
namespace io_internal {
namespace {

constexpr unsigned kStatxMask = STATX_SIZE | STATX_MTIME | STATX_TYPE | STATX_INO;

void Interrupted(int) {}

// The signal that interrupts a worker's cancelled call: a real-time signal
// with a handler that does nothing, installed without SA_RESTART so that the
// call ends with EINTR. 0 when the process already uses that signal for
// something else (then cancelled workers are only replaced, not interrupted).
int InterruptSignal() {
  static const int sig = [] {
    const int s = SIGRTMAX - 4;
    struct sigaction old;
    if (::sigaction(s, nullptr, &old) != 0) return 0;
    if (old.sa_handler != SIG_DFL && old.sa_handler != Interrupted) return 0;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = Interrupted;
    sigemptyset(&sa.sa_mask);
    return ::sigaction(s, &sa, nullptr) == 0 ? s : 0;
  }();
  return sig;
}

}  // namespace

int64_t RunSync(const IoOp& op) {
  long r = 0;
  switch (op.kind) {
    case IoOp::Kind::kOpen:
      if (op.root != nullptr) return op.root->Open(op.path, op.flags, op.mode);
      r = ::open(op.path, op.flags | O_CLOEXEC, op.mode);
      break;
    case IoOp::Kind::kRead:
      r = ::pread(op.fd, op.buf, op.len, static_cast<off_t>(op.offset));
      break;
    case IoOp::Kind::kWrite:
      r = ::pwrite(op.fd, op.buf, op.len, static_cast<off_t>(op.offset));
      break;
    case IoOp::Kind::kFsync:
      r = ::fsync(op.fd);
      break;
    case IoOp::Kind::kClose:
      r = ::close(op.fd);
      break;
    case IoOp::Kind::kStat:
      r = op.path ? ::statx(AT_FDCWD, op.path, 0, kStatxMask, op.stx)
                  : ::statx(op.fd, "", AT_EMPTY_PATH, kStatxMask, op.stx);
      break;
    case IoOp::Kind::kFallocate:
      r = ::fallocate(op.fd, 0, static_cast<off_t>(op.offset), static_cast<off_t>(op.len));
      break;
  }
  return r < 0 ? -errno : r;
}

PreadBackend::PreadBackend(unsigned threads, std::function<void()> on_done)
    : threads_(std::max(1u, threads)), on_done_(std::move(on_done)) {
  InterruptSignal();
  absl::MutexLock l(&mu_);
  for (unsigned i = 0; i < threads_; ++i) StartWorker();
}

PreadBackend::~PreadBackend() {
  std::list<Worker> workers;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    workers.swap(workers_);
  }
  for (Worker& w : workers) w.thread.join();
}

unsigned PreadBackend::Live() const {
  unsigned n = 0;
  for (const Worker& w : workers_) n += !w.finished;
  return n;
}

void PreadBackend::StartWorker() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (!it->finished) {
      ++it;
      continue;
    }
    it->thread.join();  // it has left the lock for good
    it = workers_.erase(it);
  }
  Worker& w = workers_.emplace_back();
  w.thread = std::thread([this, &w] { Work(&w); });
}

unsigned PreadBackend::replacements() const {
  absl::MutexLock l(&mu_);
  return replacements_;
}

absl::Status PreadBackend::Submit(const IoOp& op, uint64_t tag) {
  absl::MutexLock l(&mu_);
  queue_.emplace_back(tag, op);
  return absl::OkStatus();
}

absl::Status PreadBackend::Reap(absl::Duration timeout, std::vector<IoCompletion>* out) {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &PreadBackend::Reapable), timeout);
  woken_ = false;
  out->insert(out->end(), done_.begin(), done_.end());
  done_.clear();
  return absl::OkStatus();
}

void PreadBackend::Cancel(uint64_t tag) {
  absl::MutexLock l(&mu_);
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    if (it->first == tag) {
      queue_.erase(it);
      done_.push_back(IoCompletion{tag, -ECANCELED});
      return;
    }
  }
  for (Worker& w : workers_) {
    if (!w.running || w.tag != tag || w.abandoned) continue;
    w.abandoned = true;
    ++abandoned_;
    // Under the lock the worker is still in this call (it takes the lock
    // to leave it), so the signal cannot land in another operation. A
    // close is never interrupted: its descriptor is gone either way.
    if (const int sig = InterruptSignal(); sig != 0 && w.kind != IoOp::Kind::kClose) {
      ::pthread_kill(w.thread.native_handle(), sig);
    }
    // Keep `threads_` workers for the other operations, with at most as
    // many again stuck.
    if (!stop_ && Live() - abandoned_ < threads_ && Live() < 2 * threads_) {
      ++replacements_;
      StartWorker();
    }
    return;
  }
}

void PreadBackend::Wake() {
  absl::MutexLock l(&mu_);
  woken_ = true;
}

void PreadBackend::Work(Worker* self) {
  if (const int sig = InterruptSignal(); sig != 0) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  }
  while (true) {
    std::pair<uint64_t, IoOp> next;
    {
      absl::MutexLock l(&mu_, absl::Condition(this, &PreadBackend::Runnable));
      if (stop_) return;
      next = queue_.front();
      queue_.pop_front();
      self->tag = next.first;
      self->kind = next.second.kind;
      self->running = true;
    }
    const int64_t r = RunSync(next.second);
    bool leave = false;
    {
      absl::MutexLock l(&mu_);
      self->running = false;
      done_.push_back(IoCompletion{next.first, r});
      if (self->abandoned) {
        self->abandoned = false;
        --abandoned_;
        // Another worker took this one's place meanwhile: one too many now.
        leave = Live() > threads_ + abandoned_;
        if (leave) self->finished = true;
      }
    }
    if (on_done_) on_done_();
    if (leave) return;
  }
}

}  // namespace io_internal

std::unique_ptr<IoBackend> MakePreadBackend(unsigned threads) {
  return std::make_unique<io_internal::PreadBackend>(threads);
}

}  // namespace tutti
