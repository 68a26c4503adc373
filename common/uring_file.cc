#include "common/uring_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <unordered_set>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/pread_backend.h"
#include "common/status.h"

namespace tutti {

namespace {

constexpr uint64_t kWakeTag = ~uint64_t{0};
constexpr uint64_t kCancelTag = ~uint64_t{0} - 1;
constexpr unsigned kStatxMask = STATX_SIZE | STATX_MTIME | STATX_TYPE | STATX_INO;

// ---------------------------------------------------------------- io_uring
class UringBackend final : public IoBackend {
 public:
  explicit UringBackend(unsigned depth) : depth_(depth) {}
  ~UringBackend() override {
    walker_.reset();  // its completions wake the ring through efd_
    if (ring_ok_) io_uring_queue_exit(&ring_);
    if (efd_ >= 0) ::close(efd_);
  }

  absl::Status Init(unsigned max_workers) {
    io_uring_params p;
    std::memset(&p, 0, sizeof(p));
    // Room for cancels and the wake-up poll besides `depth` operations.
    int r = io_uring_queue_init_params(depth_ + 16, &ring_, &p);
    if (r < 0) return ErrnoStatus(-r, absl::StrCat("io_uring_queue_init(", depth_, ")"));
    ring_ok_ = true;
    efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) return ErrnoStatus(errno, "eventfd");
    if (max_workers > 0) {
      unsigned vals[2] = {max_workers, max_workers};
      io_uring_register_iowq_max_workers(&ring_, vals);  // best effort
    }
    if (io_uring_probe* probe = io_uring_get_probe_ring(&ring_)) {
      openat2_op_ = io_uring_opcode_supported(probe, IORING_OP_OPENAT2) != 0;
      io_uring_free_probe(probe);
    }
    return absl::OkStatus();
  }

  absl::Status RegisterBuffers(const std::vector<iovec>& buffers) override {
    if (buffers.empty()) return absl::OkStatus();
    int r =
        io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
    if (r < 0)
      return ErrnoStatus(-r, absl::StrCat("io_uring_register_buffers(", buffers.size(), ")"));
    registered_ = true;
    return absl::OkStatus();
  }

  absl::Status Submit(const IoOp& op, uint64_t tag) override {
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) return absl::ResourceExhaustedError("io_uring submission queue full");
    const bool fixed = registered_ && op.buf_index >= 0;
    switch (op.kind) {
      case IoOp::Kind::kOpen:
        if (op.root != nullptr) {
          if (!op.root->uses_openat2() || !openat2_op_) {
            // The checked walk is a series of system calls: run it on the
            // walker threads rather than stall this ring's thread.
            return Walk(sqe, op, tag);
          }
          Beneath& b = beneath_[tag];
          b.op = op;
          b.how = open_how{};
          b.how.flags = static_cast<uint64_t>(op.flags | O_CLOEXEC);
          b.how.mode = (op.flags & (O_CREAT | O_TMPFILE)) != 0 ? op.mode : 0;
          b.how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
          io_uring_prep_openat2(sqe, op.root->fd(), op.path, &b.how);
        } else {
          io_uring_prep_openat(sqe, AT_FDCWD, op.path, op.flags | O_CLOEXEC, op.mode);
        }
        break;
      case IoOp::Kind::kRead:
        if (fixed) {
          io_uring_prep_read_fixed(sqe, op.fd, op.buf, static_cast<unsigned>(op.len), op.offset,
                                   op.buf_index);
        } else {
          io_uring_prep_read(sqe, op.fd, op.buf, static_cast<unsigned>(op.len), op.offset);
        }
        break;
      case IoOp::Kind::kWrite:
        if (fixed) {
          io_uring_prep_write_fixed(sqe, op.fd, op.buf, static_cast<unsigned>(op.len), op.offset,
                                    op.buf_index);
        } else {
          io_uring_prep_write(sqe, op.fd, op.buf, static_cast<unsigned>(op.len), op.offset);
        }
        break;
      case IoOp::Kind::kFsync:
        io_uring_prep_fsync(sqe, op.fd, 0);
        break;
      case IoOp::Kind::kClose:
        io_uring_prep_close(sqe, op.fd);
        break;
      case IoOp::Kind::kFallocate:
        io_uring_prep_fallocate(sqe, op.fd, 0, op.offset, op.len);
        break;
      case IoOp::Kind::kStat:
        if (op.path) {
          io_uring_prep_statx(sqe, AT_FDCWD, op.path, 0, kStatxMask, op.stx);
        } else {
          io_uring_prep_statx(sqe, op.fd, "", AT_EMPTY_PATH, kStatxMask, op.stx);
        }
        break;
    }
    io_uring_sqe_set_data64(sqe, tag);
    if (op.may_stall) sqe->flags |= IOSQE_ASYNC;
    return absl::OkStatus();
  }

  absl::Status Reap(absl::Duration timeout, std::vector<IoCompletion>* out) override {
    if (!poll_armed_) {
      io_uring_sqe* sqe = GetSqe();
      if (sqe != nullptr) {
        io_uring_prep_poll_add(sqe, efd_, POLLIN);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        poll_armed_ = true;
      }
    }
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec ts;
    const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout));
    ts.tv_sec = ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    int r = io_uring_submit_and_wait_timeout(&ring_, &cqe, 1, &ts, nullptr);
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      return ErrnoStatus(-r, "io_uring_submit_and_wait_timeout");
    }
    unsigned head, n = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++n;
      const uint64_t tag = io_uring_cqe_get_data64(cqe);
      if (tag == kWakeTag) {
        uint64_t v;
        while (::read(efd_, &v, sizeof(v)) > 0) {
        }
        poll_armed_ = false;
      } else if (tag != kCancelTag) {
        auto b = beneath_.find(tag);
        if (b != beneath_.end()) {
          const IoOp op = b->second.op;
          beneath_.erase(b);
          // -EXDEV: leaving the root, or an absolute symlink that the walk
          // follows when it names a path under the root.
          if (cqe->res == -EXDEV) {
            SubmitWalk(op, tag);
            continue;
          }
        }
        out->push_back(IoCompletion{tag, cqe->res});
      }
    }
    io_uring_cq_advance(&ring_, n);
    if (walker_) {
      const size_t before = out->size();
      RETURN_IF_ERROR(walker_->Reap(absl::ZeroDuration(), out));
      for (size_t i = before; i < out->size(); ++i) walking_.erase((*out)[i].tag);
    }
    return absl::OkStatus();
  }

  void Cancel(uint64_t tag) override {
    if (walking_.count(tag)) {
      walker_->Cancel(tag);
      return;
    }
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) return;
    io_uring_prep_cancel64(sqe, tag, 0);
    io_uring_sqe_set_data64(sqe, kCancelTag);
  }

  void Wake() override {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = ::write(efd_, &one, sizeof(one));
  }
  unsigned capacity() const override { return depth_; }
  const char* name() const override { return "io_uring"; }

 private:
  struct Beneath {
    IoOp op;
    open_how how;  // read by the kernel when the entry is submitted
  };

  // A beneath-the-root open for the walker threads; `sqe` (taken already)
  // becomes a no-op so the ring's accounting is unchanged.
  absl::Status Walk(io_uring_sqe* sqe, const IoOp& op, uint64_t tag) {
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kCancelTag);
    SubmitWalk(op, tag);
    return absl::OkStatus();
  }
  void SubmitWalk(const IoOp& op, uint64_t tag) {
    if (!walker_) walker_ = std::make_unique<io_internal::PreadBackend>(4, [this] { Wake(); });
    walking_.insert(tag);
    [[maybe_unused]] absl::Status s = walker_->Submit(op, tag);  // never refuses
  }

  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  unsigned depth_;
  io_uring ring_;
  bool ring_ok_ = false;
  bool registered_ = false;
  int efd_ = -1;
  bool poll_armed_ = false;
  bool openat2_op_ = false;                            // the ring has IORING_OP_OPENAT2 (Linux 5.6)
  std::unordered_map<uint64_t, Beneath> beneath_;      // tag -> openat2 in flight
  std::unique_ptr<io_internal::PreadBackend> walker_;  // checked walks, started when first needed
  std::unordered_set<uint64_t> walking_;               // tags the walker holds
};

}  // namespace

uint64_t FileKey(absl::string_view name) {
  const uint64_t h = absl::HashOf(name);
  return h == 0 ? 1 : h;
}

absl::StatusOr<std::unique_ptr<IoBackend>> MakeUringBackend(unsigned depth, unsigned max_workers) {
  auto b = std::make_unique<UringBackend>(std::max(1u, depth));
  RETURN_IF_ERROR(b->Init(max_workers));
  return std::unique_ptr<IoBackend>(std::move(b));
}

absl::StatusOr<IoBackendChoice> ParseIoBackendChoice(absl::string_view name) {
  if (name == "auto") return IoBackendChoice::kAuto;
  if (name == "uring") return IoBackendChoice::kUring;
  if (name == "pread") return IoBackendChoice::kPread;
  return absl::InvalidArgumentError(
      absl::StrCat("--io_backend '", name,
                   "' is unknown: use auto (io_uring, or pread where io_uring is "
                   "refused), uring or pread"));
}

absl::StatusOr<bool> ResolveIoBackend(IoBackendChoice choice) {
  if (choice == IoBackendChoice::kPread) return false;
  absl::StatusOr<std::unique_ptr<IoBackend>> probe = MakeUringBackend(1);
  if (probe.ok()) return true;
  if (choice == IoBackendChoice::kUring) {
    return absl::FailedPreconditionError(absl::StrCat(
        "io_uring is refused here (", probe.status().message(),
        "), and --io_backend=uring requires it: allow io_uring_setup, io_uring_enter and "
        "io_uring_register in the seccomp profile, or use --io_backend=auto"));
  }
  static const Logger kLog("io");
  kLog.Warning("io_uring is refused here; staging and member reads use pread on a thread pool",
               {{"reason", probe.status().message()}, {"io_backend", "auto"}});
  return false;
}

// ---------------------------------------------------------------- faults
FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<IoBackend> inner,
                                             std::vector<IoFault> faults, uint64_t write_limit)
    : inner_(std::move(inner)),
      faults_(std::move(faults)),
      before_done_(faults_.size(), false),
      write_limit_(write_limit) {}

absl::Status FaultInjectingBackend::RegisterBuffers(const std::vector<iovec>& buffers) {
  return inner_->RegisterBuffers(buffers);
}

IoFault* FaultInjectingBackend::Match(const IoOp& op) {
  std::string path;
  if (op.path) {
    path = op.path;
  } else if (auto it = fd_paths_.find(op.fd); it != fd_paths_.end()) {
    path = it->second;
  }
  for (size_t i = 0; i < faults_.size(); ++i) {
    IoFault& f = faults_[i];
    if (f.kind != op.kind) continue;
    if (!f.path_contains.empty() && path.find(f.path_contains) == std::string::npos) continue;
    if ((op.kind == IoOp::Kind::kRead || op.kind == IoOp::Kind::kWrite) &&
        op.offset < f.min_offset) {
      continue;
    }
    if (f.before && !before_done_[i]) {
      before_done_[i] = true;
      f.before();
    }
    return &f;
  }
  return nullptr;
}

absl::Status FaultInjectingBackend::Submit(const IoOp& in, uint64_t tag) {
  IoOp op = in;
  if (op.kind == IoOp::Kind::kWrite && write_limit_ > 0) {
    if (written_ + op.len > write_limit_) {
      ready_.push_back(IoCompletion{tag, -ENOSPC});
      return absl::OkStatus();
    }
    written_ += op.len;
  }
  IoFault* f = Match(op);
  if (f != nullptr) {
    if (f->eagain_times > 0) {
      --f->eagain_times;
      ready_.push_back(IoCompletion{tag, -EAGAIN});
      return absl::OkStatus();
    }
    if (f->error != 0) {
      ready_.push_back(IoCompletion{tag, -f->error});
      return absl::OkStatus();
    }
    if (f->short_len > 0 && op.len > f->short_len) op.len = f->short_len;
    if (f->stall) {
      held_[tag] = Held{op, absl::InfiniteFuture(), -ECANCELED, false, f->uncancellable};
      return absl::OkStatus();
    }
    if (f->delay > absl::ZeroDuration()) {
      held_[tag] = Held{op, absl::Now() + f->delay, 0, true, f->uncancellable};
      inner_ops_[tag] = op;
      if (f->corrupt) inner_ops_[tag].buf_index = -2;  // marker: corrupt on completion
      return absl::OkStatus();
    }
  }
  inner_ops_[tag] = op;
  if (f != nullptr && f->corrupt) inner_ops_[tag].buf_index = -2;
  if (op.buf_index == -2) op.buf_index = -1;
  return inner_->Submit(op, tag);
}

absl::Status FaultInjectingBackend::Reap(absl::Duration timeout, std::vector<IoCompletion>* out) {
  const absl::Time now = absl::Now();
  absl::Time next = absl::InfiniteFuture();
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.due <= now) {
      if (it->second.pass_on) {
        IoOp op = it->second.op;
        if (op.buf_index == -2) op.buf_index = -1;
        RETURN_IF_ERROR(inner_->Submit(op, it->first));
      } else {
        ready_.push_back(IoCompletion{it->first, it->second.result});
      }
      it = held_.erase(it);
    } else {
      next = std::min(next, it->second.due);
      ++it;
    }
  }
  if (!ready_.empty()) timeout = absl::ZeroDuration();
  if (next != absl::InfiniteFuture()) timeout = std::min(timeout, next - now);
  std::vector<IoCompletion> got;
  RETURN_IF_ERROR(inner_->Reap(timeout, &got));
  for (IoCompletion c : got) {
    auto it = inner_ops_.find(c.tag);
    if (it != inner_ops_.end()) {
      const IoOp& op = it->second;
      if (op.kind == IoOp::Kind::kOpen && c.result >= 0)
        fd_paths_[static_cast<int>(c.result)] = op.path;
      if (op.kind == IoOp::Kind::kClose) fd_paths_.erase(op.fd);
      if (op.kind == IoOp::Kind::kRead && op.buf_index == -2 && c.result > 0) {
        op.buf[c.result / 2] ^= 0x5A;
      }
      inner_ops_.erase(it);
    }
    ready_.push_back(c);
  }
  out->insert(out->end(), ready_.begin(), ready_.end());
  ready_.clear();
  return absl::OkStatus();
}

void FaultInjectingBackend::Cancel(uint64_t tag) {
  auto it = held_.find(tag);
  if (it != held_.end() && it->second.uncancellable) return;
  if (it != held_.end()) {
    ready_.push_back(IoCompletion{tag, -ECANCELED});
    held_.erase(it);
    inner_ops_.erase(tag);
    return;
  }
  inner_->Cancel(tag);
}

}  // namespace tutti
