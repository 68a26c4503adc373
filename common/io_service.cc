// IoService: a backend on its own thread, with deadlines, resubmission and
// a bound per file (common/uring_file.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/synchronization/notification.h"
#include "common/uring_file.h"

#if defined(__SANITIZE_ADDRESS__)
#define TUTTI_LEAK_CHECKER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define TUTTI_LEAK_CHECKER 1
#endif
#endif
#ifdef TUTTI_LEAK_CHECKER
#include <sanitizer/lsan_interface.h>
#endif

namespace tutti {
namespace {

// Memory left behind on purpose (under an operation stuck in the kernel): a
// leak checker treats it, and what it points to, as reachable.
template <typename T>
void KeptOnPurpose(T* p) {
#ifdef TUTTI_LEAK_CHECKER
  __lsan_ignore_object(p);
#else
  (void)p;
#endif
}

}  // namespace

IoService::IoService(std::unique_ptr<IoBackend> backend, IoServiceOptions options)
    : backend_(std::move(backend)), opts_(options), name_(backend_->name()) {
  thread_ = std::thread([this] { Loop(); });
}

IoService::~IoService() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  if (backend_) backend_->Wake();
  thread_.join();
}

absl::Status IoService::RegisterBuffers(const std::vector<iovec>& buffers) {
  // Called before any operation is submitted, so the backend is idle.
  return backend_->RegisterBuffers(buffers);
}

void IoService::Submit(const IoOp& op, absl::Time deadline, Done done,
                       std::shared_ptr<void> keepalive) {
  Req r;
  r.op = op;
  if (op.kind == IoOp::Kind::kOpen && (op.flags & (O_DIRECTORY | O_PATH)) == 0) {
    r.regular_only = true;
    r.op.flags |= O_NONBLOCK;
  }
  r.deadline = deadline;
  r.accepted = absl::Now();
  r.done = std::move(done);
  r.keepalive = std::move(keepalive);
  outstanding_.fetch_add(1);
  bool stopped = false;
  {
    absl::MutexLock l(&mu_);
    stopped = stop_;
    if (!stopped) incoming_.emplace_back(0, std::move(r));
  }
  if (stopped) {  // answered outside the lock: the callback may submit again
    outstanding_.fetch_sub(1);
    r.done(-ECANCELED);
    return;
  }
  backend_->Wake();
}

int64_t IoService::Run(const IoOp& op, absl::Time deadline, std::shared_ptr<void> keepalive) {
  absl::Notification finished;
  int64_t result = 0;
  Submit(
      op, deadline,
      [&](int64_t r) {
        result = r;
        finished.Notify();
      },
      std::move(keepalive));
  finished.WaitForNotification();
  return result;
}

size_t IoService::outstanding() const { return outstanding_.load(); }

IoServiceStats IoService::stats() const {
  IoServiceStats s;
  s.timeouts = timeouts_.load();
  s.queued_timeouts = queued_timeouts_.load();
  s.stalled_refusals = stalled_refusals_.load();
  s.stuck = stuck_now_.load();
  s.in_backend = in_backend_now_.load();
  s.waiting = waiting_now_.load();
  return s;
}

void IoService::PublishStats() {
  stuck_now_.store(stuck_);
  in_backend_now_.store(in_backend_);
  waiting_now_.store(waiting_.size());
}

bool IoService::Issue(uint64_t id, Req& r) {
  if (!backend_->Submit(r.op, id).ok()) return false;
  if (r.sent == absl::InfiniteFuture()) r.sent = absl::Now();
  r.in_backend = true;
  ++in_backend_;
  if (r.op.file != 0) ++files_[r.op.file].in_backend;
  return true;
}

void IoService::TimeOutQueued(Req& r, absl::Time now) {
  r.timed_out = true;
  last_timeout_ =
      Timeout{r.deadline - r.accepted, absl::ZeroDuration(), now - r.deadline, in_backend_};
  queued_timeouts_.fetch_add(1);
  r.done(kTimedOutQueued);
}

void IoService::IssueWaiting() {
  const unsigned limit = opts_.per_file_limit;
  for (auto w = waiting_.begin(); w != waiting_.end() && Busy() < backend_->capacity();) {
    const uint64_t id = *w;
    auto it = reqs_.find(id);
    if (it == reqs_.end()) {
      w = waiting_.erase(w);
      continue;
    }
    Req& r = it->second;
    if (const absl::Time now = absl::Now(); r.deadline <= now) {
      // Too late to send (the thread ran late, or it waited here): not the
      // file system's doing, and not worth a worker now.
      w = waiting_.erase(w);
      TimeOutQueued(r, now);
      reqs_.erase(it);
      outstanding_.fetch_sub(1);
      continue;
    }
    if (limit > 0 && r.op.file != 0) {
      auto f = files_.find(r.op.file);
      const bool full = f != files_.end() && f->second.in_backend >= limit;
      if (full && f->second.stuck < limit) {
        ++w;  // waits for one of its file's operations to end
        continue;
      }
      if (full || (f != files_.end() && absl::Now() < f->second.refuse_until)) {
        // Every slot of its file is held by an operation that never
        // returned, or its last operations all went unanswered: answered
        // now rather than left to wait for its deadline.
        w = waiting_.erase(w);
        stalled_refusals_.fetch_add(1);
        r.done(kFileStalled);
        reqs_.erase(it);
        outstanding_.fetch_sub(1);
        continue;
      }
    }
    if (!Issue(id, r)) break;  // the backend's queue is full: try again later
    w = waiting_.erase(w);
  }
}

int64_t IoService::KeepIfRegular(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return kNotRegularFile;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

void IoService::Complete(uint64_t id, int64_t result) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  Req& r = it->second;
  if (r.in_backend) {
    r.in_backend = false;
    --in_backend_;
    if (r.op.file != 0) {
      auto f = files_.find(r.op.file);
      if (f != files_.end()) {
        FileState& fs = f->second;
        --fs.in_backend;
        if (r.stuck) --fs.stuck;
        // Answered in time (whatever the answer): the file is alive.
        if (!r.timed_out && result != -ECANCELED) {
          fs.timeouts = 0;
          fs.refuse_until = absl::InfinitePast();
        }
        if (fs.in_backend == 0 && fs.timeouts == 0) files_.erase(f);
      }
    }
    if (r.stuck) {
      r.stuck = false;
      --stuck_;
    }
  }
  auto finish = [&](int64_t value) {
    if (!r.timed_out) r.done(value);
    reqs_.erase(it);
    outstanding_.fetch_sub(1);
  };
  if (r.timed_out) {
    // Answered already (deadline or stop): a file it opened after all is
    // nobody's, so it is closed here rather than left open.
    if (r.op.kind == IoOp::Kind::kOpen && result >= 0) ::close(static_cast<int>(result));
    return finish(result);
  }
  if ((result == -EAGAIN || result == -EINTR) && ++r.eagain < 1000) {
    waiting_.push_back(id);
    return;
  }
  if (r.regular_only && result >= 0) result = KeepIfRegular(static_cast<int>(result));
  const bool rw = r.op.kind == IoOp::Kind::kRead || r.op.kind == IoOp::Kind::kWrite;
  if (!rw || result < 0) return finish(result);
  if (result == 0) {
    if (r.op.kind == IoOp::Kind::kWrite && r.op.len > 0) return finish(-EIO);
    return finish(static_cast<int64_t>(r.done_bytes));  // end of file
  }
  r.done_bytes += static_cast<size_t>(result);
  if (static_cast<size_t>(result) >= r.op.len) return finish(static_cast<int64_t>(r.done_bytes));
  // Short transfer: continue with the rest.
  r.op.buf += result;
  r.op.offset += static_cast<uint64_t>(result);
  r.op.len -= static_cast<size_t>(result);
  waiting_.push_back(id);
}

void IoService::TimeOut(absl::Time now) {
  for (auto it = reqs_.begin(); it != reqs_.end();) {
    Req& r = it->second;
    if (r.timed_out || r.deadline > now) {
      ++it;
      continue;
    }
    if (r.in_backend) {
      // It stays in the backend (and counts against its file's bound)
      // until it really ends.
      r.timed_out = true;
      r.stuck = true;
      ++stuck_;
      FileState* file = r.op.file != 0 ? &files_[r.op.file] : nullptr;
      if (file != nullptr) ++file->stuck;
      PublishStats();  // before the callback, which may look
      if (r.sent < r.deadline) {
        // Sent in time and not answered: the file system's doing.
        if (file != nullptr && opts_.per_file_limit > 0 &&
            ++file->timeouts >= opts_.per_file_limit) {
          file->refuse_until = now + opts_.stalled_file_retry;
        }
        last_timeout_ =
            Timeout{r.sent - r.accepted, r.deadline - r.sent, now - r.deadline, in_backend_};
        timeouts_.fetch_add(1);
        r.done(-ETIMEDOUT);
      } else {
        // The service thread handed it over only after its deadline (it
        // was not run in time): the file system never had a chance.
        TimeOutQueued(r, now);
      }
      backend_->Cancel(it->first);
      ++it;
    } else {
      TimeOutQueued(r, now);
      for (auto w = waiting_.begin(); w != waiting_.end(); ++w) {
        if (*w == it->first) {
          waiting_.erase(w);
          break;
        }
      }
      it = reqs_.erase(it);
      outstanding_.fetch_sub(1);
    }
  }
}

void IoService::Loop() {
  std::vector<IoCompletion> got;
  while (true) {
    bool stopping;
    {
      absl::MutexLock l(&mu_);
      for (auto& [unused, r] : incoming_) {
        const uint64_t id = next_id_++;
        reqs_.emplace(id, std::move(r));
        waiting_.push_back(id);
      }
      incoming_.clear();
      stopping = stop_;
    }
    if (stopping) break;
    IssueWaiting();
    absl::Time now = absl::Now();
    absl::Time next = now + absl::Milliseconds(200);
    for (auto& [id, r] : reqs_) {
      if (!r.timed_out) next = std::min(next, r.deadline);
    }
    got.clear();
    absl::Status s = backend_->Reap(std::max(absl::ZeroDuration(), next - now), &got);
    for (const IoCompletion& c : got) Complete(c.tag, c.result);
    TimeOut(absl::Now());
    PublishStats();
  }
  Shutdown();
}

void IoService::Shutdown() {
  // Cancel everything; give the operations just cancelled a moment to end.
  // Those stuck since their deadline are not waited for: they have had
  // their chance.
  for (auto& [id, r] : reqs_) {
    if (!r.timed_out) {
      r.timed_out = true;
      r.done(-ECANCELED);
      if (r.in_backend) backend_->Cancel(id);
    }
  }
  std::vector<IoCompletion> got;
  const absl::Time give_up = absl::Now() + opts_.stop_wait;
  while (in_backend_ > stuck_ && absl::Now() < give_up) {
    got.clear();
    if (!backend_->Reap(absl::Milliseconds(20), &got).ok()) break;
    for (const IoCompletion& c : got) Complete(c.tag, c.result);
  }
  PublishStats();
  if (in_backend_ > 0) {
    // An operation is stuck in the kernel (a hung remote file system): keep
    // its memory and the backend alive rather than free them under it. Kept
    // on purpose, so a leak checker is told not to report them.
    for (auto& [id, r] : reqs_) {
      KeptOnPurpose(new std::shared_ptr<void>(std::move(r.keepalive)));
    }
    KeptOnPurpose(backend_.release());
    stopped_stuck_.store(true);
  }
}

}  // namespace tutti
