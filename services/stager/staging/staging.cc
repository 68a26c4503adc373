#include "services/stager/staging/staging.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/status.h"
#include "services/stager/staging/path_refusal.h"

namespace tutti::stager {

const char* ShardStateName(ShardState s) {
  switch (s) {
    case ShardState::kUnknown: return "unknown";
    case ShardState::kPending: return "pending";
    case ShardState::kStaging: return "staging";
    case ShardState::kStaged: return "staged";
    case ShardState::kFailed: return "failed";
  }
  return "?";
}

namespace {
const Logger kLog("stager.staging");
constexpr size_t kAlign = 4096;
// Cache files: the daemon's user writes them, the job's group reads them, no
// one else (a shard may come from a source other users cannot read).
constexpr unsigned kCacheFileMode = 0640;
size_t RoundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

struct StagingEngine::File {
  v1::ShardRef ref;
  uint64_t priority = 0;
  std::string src_path, dst_path, tmp_path;  // for messages
  std::string tmp_rel;                       // the partial copy's name beneath the cache
  int src_fd = -1, dst_fd = -1;
  bool src_direct = false, dst_direct = false;
  uint64_t size = 0;
  struct statx stx;
  int64_t mtime_sec = 0;
  uint32_t mtime_nsec = 0;
  uint64_t next_offset = 0, written = 0;
  int in_flight = 0;   // reads and writes
  unsigned reads = 0;  // reads in flight (at most file_queue_depth)
  uint64_t key = 0;    // IoOp::file of the source file
  std::map<uint64_t, std::pair<uint32_t, uint64_t>> crcs;  // offset -> (crc, length)
  bool failed = false, finishing = false, reserved = false;
  absl::Status error;
  absl::Time start;
};

StagingEngine::StagingEngine(StagingOptions options, ShardCache* cache, StagerMetrics* metrics,
                             std::unique_ptr<IoBackend> backend)
    : opts_(std::move(options)), cache_(cache), metrics_(metrics), injected_(std::move(backend)) {}

StagingEngine::~StagingEngine() { Stop(); }

const char* StagingEngine::backend_name() const { return io_ ? io_->backend_name() : "stopped"; }

absl::Status StagingEngine::Start() {
  if (opts_.block_size == 0 || opts_.block_size % kAlign != 0) {
    return absl::InvalidArgumentError(absl::StrCat("block size ", opts_.block_size,
                                                   " is not a positive multiple of 4096"));
  }
  if (opts_.queue_depth == 0) return absl::InvalidArgumentError("queue depth must be at least 1");
  if (opts_.file_queue_depth == 0) {
    return absl::InvalidArgumentError("reads of one shard in flight must be at least 1");
  }
  absl::StatusOr<std::unique_ptr<RootDir>> source = RootDir::Open(opts_.source_dir, opts_.resolve);
  if (absl::IsNotFound(source.status())) {
    return absl::NotFoundError(absl::StrCat("source directory '", opts_.source_dir,
                                            "' does not exist or is not a directory; mount it or "
                                            "fix --source"));
  }
  if (!source.ok()) return Annotate(source.status(), "--source");
  source_ = std::move(*source);
  kLog.Info("shard files are opened beneath --source and the cache only",
            {{"source", opts_.source_dir},
             {"resolve", source_->uses_openat2() ? "openat2 RESOLVE_BENEATH" : "checked walk"}});
  std::unique_ptr<IoBackend> backend = std::move(injected_);
  if (!backend) {
    if (opts_.use_io_uring) {
      // Twice the queue depth in workers: as many again for reads stuck on
      // a stalled source file, which no longer count against the depth.
      auto b = MakeUringBackend(opts_.queue_depth + opts_.max_files * 2, 2 * opts_.queue_depth);
      if (!b.ok())
        return Annotate(
            b.status(),
            "cannot set up io_uring for staging (--io_backend=pread copies with threads)");
      backend = std::move(*b);
    } else {
      backend = MakePreadBackend(std::max(4u, opts_.max_files));
    }
  }
  std::vector<iovec> iov;
  {
    absl::MutexLock l(&mu_);
    for (unsigned i = 0; i < opts_.queue_depth; ++i) {
      void* p = nullptr;
      if (::posix_memalign(&p, kAlign, opts_.block_size) != 0) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", opts_.queue_depth, " x ", opts_.block_size, " staging buffers"));
      }
      buffers_.push_back(static_cast<char*>(p));
      iov.push_back(iovec{p, opts_.block_size});
      free_buffers_.push_back(static_cast<int>(i));
    }
  }
  IoServiceOptions io_options;
  io_options.per_file_limit = opts_.file_queue_depth;
  io_ = std::make_unique<IoService>(std::move(backend), io_options);
  absl::Status registered = io_->RegisterBuffers(iov);
  registered_ = registered.ok();
  if (!registered_) {
    // Registered (pinned) buffers count against the locked-memory limit for
    // a process without CAP_IPC_LOCK (8 MiB by default); unregistered ones
    // work the same, the kernel just maps each buffer per operation.
    struct rlimit lim;
    std::string limit = "unknown";
    if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
      limit = lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                            : absl::StrCat(lim.rlim_cur >> 10, " KiB");
    }
    kLog.Info(absl::StrCat(
        "staging continues with unregistered io_uring buffers (a little more CPU per block): ",
        registered.message(), "; ", opts_.queue_depth, " x ", opts_.block_size,
        "-byte buffers = ", uint64_t{opts_.queue_depth} * opts_.block_size >> 10,
        " KiB to lock, locked-memory limit (ulimit -l) ", limit,
        ". For registered buffers raise the limit (ulimit -l, systemd LimitMEMLOCK=, docker "
        "--ulimit memlock=) or lower --queue_depth / --block_size"));
  }
  return absl::OkStatus();
}

void StagingEngine::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  const bool had_io = io_ != nullptr;
  io_.reset();  // cancels what is in flight
  bool all_returned = true;
  {
    absl::MutexLock l(&mu_);
    for (auto& [name, f] : active_) {
      if (f->src_fd >= 0) ::close(f->src_fd);
      if (f->dst_fd >= 0) ::close(f->dst_fd);
      if (!f->tmp_rel.empty()) cache_->root().Unlink(f->tmp_rel);
      if (f->reserved) cache_->Abort(name);
    }
    active_.clear();
    size_t live = 0;
    for (char* b : buffers_) live += b != nullptr;
    all_returned = free_buffers_.size() == live;
  }
  cv_.SignalAll();
  // A buffer an operation still holds (it could not be cancelled) stays
  // allocated; the others are freed.
  absl::MutexLock l(&mu_);
  if (!had_io || all_returned) {
    for (char* b : buffers_) std::free(b);
  } else {
    for (int b : free_buffers_) std::free(buffers_[b]);
  }
  buffers_.clear();
  free_buffers_.clear();
}

IoServiceStats StagingEngine::io_stats() const { return io_ ? io_->stats() : IoServiceStats{}; }

absl::Duration StagingEngine::RetryAfter(uint32_t failures) const {
  absl::Duration wait = opts_.retry_after;
  for (uint32_t i = 1; i < failures && wait < opts_.max_retry_after; ++i) wait *= 2;
  return std::min(wait, std::max(opts_.retry_after, opts_.max_retry_after));
}

IoOp StagingEngine::SourceOp(const File& f, IoOp::Kind kind) {
  IoOp op;
  op.kind = kind;
  op.file = f.key;
  op.may_stall = true;
  return op;
}

absl::Status StagingEngine::Stalled(const File& f, const std::string& what, int64_t r) const {
  // A later Request (the next plan that names the shard) tries it again,
  // after RetryAfter.
  constexpr char kLater[] = ": the shard is given up for now, a later request tries it again";
  const std::string shard = absl::StrCat("shard ", f.ref.name(), ": ");
  if (r == kFileStalled) {
    return absl::DeadlineExceededError(
        absl::StrCat(shard, "its last ", opts_.file_queue_depth, " operations on ", f.src_path,
                     " got no answer in time (the source stalls on this file), so ", what,
                     " was not sent", kLater));
  }
  if (r == kTimedOutQueued) {
    const IoService::Timeout& t = io_->last_timeout();
    return absl::DeadlineExceededError(absl::StrCat(
        shard, what, " of ", f.src_path, " waited ", absl::FormatDuration(t.queued),
        " in the stager's queue and was never sent to the file system (its I/O thread ran ",
        absl::FormatDuration(t.lag), " late, ", t.ahead,
        " operations in flight): the stager is short of CPU, not the source stalling", kLater));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(shard, "the source did not answer ", what, " of ", f.src_path, " within ",
                   absl::FormatDuration(opts_.op_timeout),
                   " (it stalls; the operation is left to the kernel)", kLater));
}

void StagingEngine::SetListener(std::function<void(const std::string&, ShardState)> fn) {
  absl::MutexLock l(&mu_);
  listener_ = std::move(fn);
}

void StagingEngine::Request(const v1::ShardRef& shard, uint64_t priority) {
  std::vector<std::pair<std::string, ShardState>> notify;
  std::function<void(const std::string&, ShardState)> fn;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    const std::string& name = shard.name();
    auto st = status_.find(name);
    if (st != status_.end()) {
      if (st->second.state == ShardState::kStaging) return;
      if (st->second.state == ShardState::kPending) {
        auto q = queued_.find(name);
        if (q != queued_.end() && priority < q->second.first) {
          queue_.erase({q->second.first, name});
          q->second.first = priority;
          queue_.insert({priority, name});
        }
        return;
      }
      if (st->second.state == ShardState::kFailed &&
          absl::Now() - failed_at_[name] < RetryAfter(st->second.failures)) {
        return;
      }
    }
    if (cache_->Has(name, shard.size())) {
      const bool was_staged = st != status_.end() && st->second.state == ShardState::kStaged;
      if (metrics_ && !was_staged) metrics_->cache_hits.Increment();
      ShardStatusInfo& info = status_[name];
      info.name = name;
      info.state = ShardState::kStaged;
      info.bytes = shard.size();
      if (!was_staged) notify.emplace_back(name, ShardState::kStaged);
    } else {
      if (metrics_) metrics_->cache_misses.Increment();
      ShardStatusInfo& info = status_[name];
      info.name = name;
      info.state = ShardState::kPending;
      info.bytes = 0;
      info.error = absl::OkStatus();
      queued_[name] = {priority, shard};
      queue_.insert({priority, name});
      Pump();
    }
    fn = listener_;
  }
  cv_.SignalAll();
  if (fn) {
    for (const auto& [n, s] : notify) fn(n, s);
  }
}

ShardStatusInfo StagingEngine::Status(const std::string& name) const {
  absl::MutexLock l(&mu_);
  auto it = status_.find(name);
  if (it == status_.end()) return ShardStatusInfo{name, ShardState::kUnknown, 0, absl::OkStatus()};
  return it->second;
}

std::vector<ShardStatusInfo> StagingEngine::Snapshot() const {
  absl::MutexLock l(&mu_);
  std::vector<ShardStatusInfo> out;
  for (const auto& [n, s] : status_) out.push_back(s);
  return out;
}

absl::Status StagingEngine::Wait(const std::vector<std::string>& names, absl::Time deadline) const {
  absl::MutexLock l(&mu_);
  size_t next = 0;  // names before it were staged when last looked at
  while (true) {
    std::string pending;
    for (; next < names.size(); ++next) {
      auto it = status_.find(names[next]);
      if (it == status_.end()) {
        pending = names[next];
        break;
      }
      if (it->second.state == ShardState::kFailed) return it->second.error;
      if (it->second.state != ShardState::kStaged) {
        pending = names[next];
        break;
      }
    }
    if (pending.empty()) return absl::OkStatus();
    if (stopping_) return absl::CancelledError("staging stopped");
    if (cv_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shard ", pending, " is not staged yet"));
    }
  }
}

void StagingEngine::Pump() {
  while (!stopping_ && active_.size() < opts_.max_files && !queue_.empty()) {
    auto [prio, name] = *queue_.begin();
    queue_.erase(queue_.begin());
    auto q = queued_.find(name);
    auto f = std::make_shared<File>();
    f->ref = q->second.second;
    f->priority = prio;
    queued_.erase(q);
    StartFile(std::move(f));
  }
  for (auto& [name, f] : active_) {
    if (free_buffers_.empty()) break;
    if (f->dst_fd >= 0 && !f->failed && !f->finishing) IssueReads(f);
  }
}

void StagingEngine::StartFile(std::shared_ptr<File> f) {
  const std::string name = f->ref.name();
  f->start = absl::Now();
  status_[name].state = ShardState::kStaging;
  status_[name].progress_at = f->start;
  active_[name] = f;
  auto src = JoinUnder(opts_.source_dir, name);
  if (!src.ok()) {
    return Fail(f, RefusePath(metrics_, "source", *source_, absl::StrCat("shard ", name), name, 0,
                              src.status().message()));
  }
  f->src_path = *src;
  f->dst_path = cache_->PathOf(name);
  f->tmp_path = cache_->PartialPathOf(name);
  f->tmp_rel = absl::StrCat(name, ShardCache::kPartialSuffix);
  f->src_direct = opts_.o_direct_source;
  f->key = FileKey(name);
  IoOp op = SourceOp(*f, IoOp::Kind::kOpen);
  op.root = source_.get();
  op.path = f->ref.name().c_str();
  op.flags = O_RDONLY | (f->src_direct ? O_DIRECT : 0);
  io_->Submit(op, OpDeadline(), [this, f](int64_t r) { OnOpened(f, true, r); });
}

void StagingEngine::OnOpened(const std::shared_ptr<File>& f, bool source, int64_t r) {
  absl::MutexLock l(&mu_);
  if (stopping_) {
    if (r >= 0) ::close(static_cast<int>(r));
    return;
  }
  const std::string& path = source ? f->src_path : f->tmp_path;
  const bool direct = source ? f->src_direct : f->dst_direct;
  if (r == -EINVAL && direct) {  // the file system refuses O_DIRECT: use the page cache
    (source ? f->src_direct : f->dst_direct) = false;
    IoOp op = source ? SourceOp(*f, IoOp::Kind::kOpen) : IoOp{};
    op.kind = IoOp::Kind::kOpen;
    op.root = source ? source_.get() : &cache_->root();
    op.path = source ? f->ref.name().c_str() : f->tmp_rel.c_str();
    op.flags = source ? O_RDONLY : (O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW);
    op.mode = kCacheFileMode;
    io_->Submit(op, OpDeadline(), [this, f, source](int64_t r2) { OnOpened(f, source, r2); });
    return;
  }
  if (IsPathRefusal(r)) {
    return Fail(f, source ? RefusePath(metrics_, "source", *source_,
                                       absl::StrCat("shard ", f->ref.name()), f->ref.name(), r)
                          : RefusePath(metrics_, "cache", cache_->root(),
                                       absl::StrCat("partial copy of shard ", f->ref.name()),
                                       f->tmp_rel, r));
  }
  if (r < 0) {
    absl::Status s =
        IsTimeout(r) || r == kFileStalled
            ? (source ? Stalled(*f, "the open", r)
                      : absl::DeadlineExceededError(absl::StrCat(
                            "shard ", f->ref.name(), ": opening its partial copy ", path,
                            " did not finish within ", absl::FormatDuration(opts_.op_timeout),
                            " (the cache's file system stalls)")))
            : ErrnoStatus(static_cast<int>(-r), absl::StrCat("open ", path));
    if (r == kNotRegularFile) {
      s = NotRegularFileError(source ? absl::StrCat("shard ", f->ref.name())
                                     : absl::StrCat("partial copy of shard ", f->ref.name()),
                              path);
    }
    if (source && r == -ENOENT) {
      s = absl::NotFoundError(absl::StrCat("shard ", f->ref.name(), " is missing from the source ",
                                           opts_.source_dir, " (", path, "); the index and the "
                                           "source disagree: fix --source or re-index"));
    }
    return Fail(f, s);
  }
  if (source) {
    f->src_fd = static_cast<int>(r);
    IoOp op = SourceOp(*f, IoOp::Kind::kStat);
    op.fd = f->src_fd;
    op.stx = &f->stx;
    io_->Submit(op, OpDeadline(), [this, f](int64_t r2) { OnSourceStat(f, r2); });
    return;
  }
  f->dst_fd = static_cast<int>(r);
  if (f->size == 0) return Finish(f);
  // Allocate the whole file first: the writes then land in allocated blocks
  // (no per-write allocation, no extending writes that serialise on the
  // inode), and a full cache disk shows before any data is copied.
  IoOp op;
  op.kind = IoOp::Kind::kFallocate;
  op.fd = f->dst_fd;
  op.offset = 0;
  op.len = f->dst_direct ? RoundUp(f->size) : f->size;
  io_->Submit(op, OpDeadline(), [this, f](int64_t r2) { OnAllocated(f, r2); });
}

void StagingEngine::OnAllocated(const std::shared_ptr<File>& f, int64_t r) {
  absl::MutexLock l(&mu_);
  if (stopping_) return;
  if (r == -ENOSPC || r == -EDQUOT) {
    absl::Status full = absl::ResourceExhaustedError(absl::StrCat(
        "cache disk full: cannot allocate ", f->size, " bytes for ", f->tmp_path,
        "; free space under ", cache_->dir(), " or lower --cache_capacity"));
    // Others still being copied hold space: wait for them, one at a time.
    if (active_.size() > 1) return Defer(f, full);
    return Fail(f, full);
  }
  // Other errors (a file system without fallocate) only lose the head start.
  IssueReads(f);
}

void StagingEngine::OnSourceStat(const std::shared_ptr<File>& f, int64_t r) {
  absl::MutexLock l(&mu_);
  if (stopping_) return;
  if (IsTimeout(r) || r == kFileStalled) return Fail(f, Stalled(*f, "a stat", r));
  if (r < 0) return Fail(f, ErrnoStatus(static_cast<int>(-r), absl::StrCat("stat ", f->src_path)));
  if (!S_ISREG(f->stx.stx_mode)) {
    return Fail(f, absl::InvalidArgumentError(absl::StrCat(f->src_path, " is not a regular file")));
  }
  f->size = f->stx.stx_size;
  f->mtime_sec = f->stx.stx_mtime.tv_sec;
  f->mtime_nsec = f->stx.stx_mtime.tv_nsec;
  if (f->ref.size() != 0 && f->ref.size() != f->size) {
    return Fail(f, absl::DataLossError(absl::StrCat(
                          "shard ", f->src_path, " is ", f->size, " bytes but the index says ",
                          f->ref.size(), ": it changed since it was indexed; re-index the dataset")));
  }
  std::vector<std::string> evicted;
  absl::Status s = cache_->Reserve(f->ref.name(), f->size, &evicted);
  Evicted(evicted);
  if (!s.ok()) {
    // Room may come when a shard being copied finishes or fails: wait for it
    // instead of failing every shard that does not fit at once.
    if (active_.size() > 1 && absl::IsResourceExhausted(s)) return Defer(f, s);
    return Fail(f, s);
  }
  f->reserved = true;
  if (const size_t slash = f->tmp_rel.find_last_of('/'); slash != std::string::npos) {
    const int made = cache_->root().MakeDirs(f->tmp_rel.substr(0, slash));
    if (IsPathRefusal(made)) {
      return Fail(f, RefusePath(metrics_, "cache", cache_->root(),
                                absl::StrCat("directory of shard ", f->ref.name()),
                                f->tmp_rel.substr(0, slash), made));
    }
  }
  f->dst_direct = opts_.o_direct;
  IoOp op;
  op.kind = IoOp::Kind::kOpen;
  op.root = &cache_->root();
  op.path = f->tmp_rel.c_str();
  // Never through a symlink: the partial copy is this daemon's own file.
  op.flags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | (f->dst_direct ? O_DIRECT : 0);
  op.mode = kCacheFileMode;
  io_->Submit(op, OpDeadline(), [this, f](int64_t r2) { OnOpened(f, false, r2); });
}

void StagingEngine::IssueReads(const std::shared_ptr<File>& f) {
  while (!f->failed && f->next_offset < f->size && !free_buffers_.empty() && !stopping_ &&
         f->reads < FileDepth()) {
    const int b = free_buffers_.back();
    free_buffers_.pop_back();
    const uint64_t offset = f->next_offset;
    const size_t len = static_cast<size_t>(std::min<uint64_t>(opts_.block_size, f->size - offset));
    f->next_offset += len;
    ++f->in_flight;
    ++f->reads;
    // The lease returns the buffer to the pool once the kernel is done with it.
    std::shared_ptr<void> lease(buffers_[b], [this, b](void*) { ReturnBuffer(b); });
    IoOp op = SourceOp(*f, IoOp::Kind::kRead);
    op.fd = f->src_fd;
    op.buf = buffers_[b];
    op.len = f->src_direct ? RoundUp(len) : len;
    op.offset = offset;
    op.buf_index = BufIndex(b);
    io_->Submit(op, OpDeadline(),
                [this, f, b, offset, len, lease](int64_t r) { OnRead(f, b, offset, len, r, lease); },
                lease);
  }
}

void StagingEngine::OnRead(const std::shared_ptr<File>& f, int b, uint64_t offset, size_t len,
                           int64_t r, const std::shared_ptr<void>& lease) {
  absl::MutexLock l(&mu_);
  --f->in_flight;
  --f->reads;
  if (stopping_) return;
  if (IsTimeout(r)) ReplaceBuffer(b);
  if (f->failed) return Fail(f, f->error);
  if (r < 0) {
    if (IsTimeout(r) || r == kFileStalled) {
      return Fail(f, Stalled(*f, absl::StrCat("a read at offset ", offset), r));
    }
    return Fail(f, ErrnoStatus(static_cast<int>(-r),
                                  absl::StrCat("read ", f->src_path, " at offset ", offset)));
  }
  if (static_cast<size_t>(r) < len) {
    return Fail(f, absl::DataLossError(absl::StrCat(
                          "shard ", f->src_path, " shrank while it was staged: the read at offset ",
                          offset, " ended after ", r, " of ", len, " bytes (it had ", f->size,
                          " bytes); the shard is being rewritten at the source; retry later")));
  }
  if (metrics_) metrics_->source_bytes.Increment(static_cast<double>(r));
  if (f->ref.crc32c() != 0) f->crcs[offset] = {Crc32cExtend(0, buffers_[b], len), len};
  size_t wlen = len;
  if (f->dst_direct && len % kAlign != 0) {
    wlen = RoundUp(len);
    std::memset(buffers_[b] + len, 0, wlen - len);
  }
  ++f->in_flight;
  IoOp op;
  op.kind = IoOp::Kind::kWrite;
  op.fd = f->dst_fd;
  op.buf = buffers_[b];
  op.len = wlen;
  op.offset = offset;
  op.buf_index = BufIndex(b);
  // The write holds the read's lease: the buffer returns to the pool after it.
  io_->Submit(op, OpDeadline(), [this, f, b, len](int64_t r2) { OnWritten(f, b, len, r2); }, lease);
}

void StagingEngine::OnWritten(const std::shared_ptr<File>& f, int b, size_t len, int64_t r) {
  absl::MutexLock l(&mu_);
  --f->in_flight;
  if (stopping_) return;
  if (IsTimeout(r)) ReplaceBuffer(b);
  if (f->failed) return Fail(f, f->error);
  if (r < 0) {
    absl::Status s = ErrnoStatus(static_cast<int>(-r), absl::StrCat("write ", f->tmp_path));
    if (r == -ENOSPC || r == -EDQUOT) {
      s = absl::ResourceExhaustedError(absl::StrCat(
          "cache disk full while writing ", f->tmp_path, " (", f->written, " of ", f->size,
          " bytes written): free space under ", cache_->dir(), " or lower --cache_capacity"));
    }
    return Fail(f, s);
  }
  f->written += len;
  ShardStatusInfo& info = status_[f->ref.name()];
  info.bytes = f->written;
  info.progress_at = absl::Now();
  if (metrics_) metrics_->staged_bytes.Increment(static_cast<double>(len));
  if (f->written == f->size && f->in_flight == 0) return Finish(f);
  IssueReads(f);
}

void StagingEngine::Finish(const std::shared_ptr<File>& f) {
  f->finishing = true;
  IoOp op = SourceOp(*f, IoOp::Kind::kStat);
  op.fd = f->src_fd;
  op.stx = &f->stx;
  io_->Submit(op, OpDeadline(), [this, f](int64_t r) { OnFinalStat(f, r); });
}

void StagingEngine::OnFinalStat(const std::shared_ptr<File>& f, int64_t r) {
  absl::MutexLock l(&mu_);
  if (stopping_) return;
  if (IsTimeout(r) || r == kFileStalled) return Fail(f, Stalled(*f, "the final stat", r));
  if (r < 0) return Fail(f, ErrnoStatus(static_cast<int>(-r), absl::StrCat("stat ", f->src_path)));
  if (f->stx.stx_size != f->size || f->stx.stx_mtime.tv_sec != f->mtime_sec ||
      f->stx.stx_mtime.tv_nsec != f->mtime_nsec) {
    return Fail(f, absl::DataLossError(absl::StrCat(
                          "shard ", f->src_path, " changed while it was staged (size ", f->size,
                          " -> ", f->stx.stx_size,
                          "); the copy was discarded; retry once the source is stable")));
  }
  if (f->dst_direct && f->size % kAlign != 0 && ::ftruncate(f->dst_fd, static_cast<off_t>(f->size)) != 0) {
    return Fail(f, ErrnoStatus(errno, absl::StrCat("truncate ", f->tmp_path)));
  }
  if (f->ref.crc32c() != 0) {
    uint32_t crc = 0;
    for (const auto& [off, c] : f->crcs) crc = Crc32cCombine(crc, c.first, c.second);
    if (crc != f->ref.crc32c()) {
      return Fail(f, absl::DataLossError(absl::StrCat(
                            "shard ", f->src_path, " has CRC-32C ", absl::Hex(crc),
                            " but the index says ", absl::Hex(f->ref.crc32c()),
                            ": the source copy is corrupt or changed; re-copy it or re-index")));
    }
  }
  IoOp op;
  op.kind = IoOp::Kind::kFsync;
  op.fd = f->dst_fd;
  io_->Submit(op, OpDeadline(), [this, f](int64_t r2) { OnFsynced(f, r2); });
}

void StagingEngine::OnFsynced(const std::shared_ptr<File>& f, int64_t r) {
  absl::MutexLock l(&mu_);
  if (stopping_) return;
  if (r < 0) return Fail(f, ErrnoStatus(static_cast<int>(-r), absl::StrCat("fsync ", f->tmp_path)));
  ::close(f->dst_fd);
  f->dst_fd = -1;
  ::close(f->src_fd);
  f->src_fd = -1;
  if (const int r2 = cache_->root().Rename(f->tmp_rel, f->ref.name()); r2 != 0) {
    if (IsPathRefusal(r2)) {
      return Fail(f, RefusePath(metrics_, "cache", cache_->root(),
                                absl::StrCat("shard ", f->ref.name()), f->ref.name(), r2));
    }
    return Fail(f, ErrnoStatus(-r2, absl::StrCat("rename ", f->tmp_path, " to ", f->dst_path)));
  }
  cache_->Commit(f->ref.name(), f->size);
  f->reserved = false;
  if (metrics_) {
    metrics_->staged_files.Increment();
    metrics_->cache_bytes.Set(static_cast<double>(cache_->cached_bytes()));
  }
  status_[f->ref.name()].bytes = f->size;
  status_[f->ref.name()].failures = 0;
  Done(f, ShardState::kStaged);
}

void StagingEngine::Evicted(const std::vector<std::string>& names) {
  if (names.empty()) return;
  for (const std::string& name : names) {
    // Only a staged shard's copy is evicted (one being copied is reserved):
    // it is no longer staged, and the next Request copies it again.
    auto it = status_.find(name);
    if (it != status_.end() && it->second.state == ShardState::kStaged) status_.erase(it);
  }
  if (metrics_) metrics_->cache_bytes.Set(static_cast<double>(cache_->cached_bytes()));
  cv_.SignalAll();
}

void StagingEngine::Discard(const std::shared_ptr<File>& f) {
  if (f->src_fd >= 0) ::close(f->src_fd);
  if (f->dst_fd >= 0) ::close(f->dst_fd);
  f->src_fd = f->dst_fd = -1;
  if (!f->tmp_rel.empty()) cache_->root().Unlink(f->tmp_rel);
  if (f->reserved) cache_->Abort(f->ref.name());
  f->reserved = false;
}

void StagingEngine::Defer(const std::shared_ptr<File>& f, const absl::Status& why) {
  Discard(f);
  const std::string name = f->ref.name();
  static LogRateLimit limit(absl::Seconds(10), 5);
  if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
    kLog.Info("shard waits for room in the cache until a shard being copied finishes",
              {{"shard", name}, {"cause", why.message()}, {"copying", active_.size() - 1},
               {"suppressed", suppressed}});
  }
  active_.erase(name);
  status_[name].state = ShardState::kPending;
  deferred_[name] = {f->priority, f->ref};
  Pump();
}

void StagingEngine::Fail(const std::shared_ptr<File>& f, absl::Status status) {
  if (!f->failed) {
    f->failed = true;
    f->error = std::move(status);
  }
  if (f->in_flight > 0) return;  // cleaned up when the last operation returns
  static LogRateLimit limit(absl::Seconds(10), 5);
  if (uint64_t suppressed = 0; limit.Allow(&suppressed)) {
    kLog.Warning("staging a shard failed: its members are read from the source",
                 {{"shard", f->ref.name()}, {"cause", f->error.message()},
                  {"suppressed", suppressed}});
  }
  Discard(f);
  if (metrics_) metrics_->staging_failures.Increment();
  status_[f->ref.name()].error = f->error;
  ++status_[f->ref.name()].failures;
  failed_at_[f->ref.name()] = absl::Now();
  Done(f, ShardState::kFailed);
}

void StagingEngine::Done(const std::shared_ptr<File>& f, ShardState state) {
  const std::string name = f->ref.name();
  if (active_.erase(name) == 0) return;  // already reported
  status_[name].state = state;
  // A copy ended: room may have come for the shards waiting for it.
  for (auto& [n, entry] : deferred_) {
    queued_[n] = entry;
    queue_.insert({entry.first, n});
  }
  deferred_.clear();
  Pump();
  auto fn = listener_;
  mu_.Unlock();
  cv_.SignalAll();
  if (fn) fn(name, state);
  mu_.Lock();
}

void StagingEngine::ReturnBuffer(int buffer) {
  absl::MutexLock l(&mu_);
  if (lost_.erase(buffer) > 0) {
    // Another buffer took its place meanwhile.
    std::free(buffers_[buffer]);
    buffers_[buffer] = nullptr;
    return;
  }
  free_buffers_.push_back(buffer);
  if (!stopping_) Pump();
}

void StagingEngine::ReplaceBuffer(int buffer) {
  if (stopping_ || replaced_ >= opts_.queue_depth || !lost_.insert(buffer).second) return;
  void* p = nullptr;
  if (::posix_memalign(&p, kAlign, opts_.block_size) != 0) {
    lost_.erase(buffer);
    return;
  }
  ++replaced_;
  buffers_.push_back(static_cast<char*>(p));
  free_buffers_.push_back(static_cast<int>(buffers_.size() - 1));
}

unsigned StagingEngine::FileDepth() const {
  return std::max(1u, std::min(opts_.file_queue_depth, opts_.queue_depth - 1));
}

}  // namespace tutti::stager
