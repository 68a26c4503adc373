#include "services/stager/staging/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/status.h"
#include "services/stager/decode/skip.h"
#include "services/stager/staging/path_refusal.h"

namespace tutti::stager {

MemberReader::MemberReader(const RootDir* source, ShardCache* cache, StagingEngine* staging,
                           IoService* cache_io, IoService* source_io, StagerMetrics* metrics)
    : source_(source),
      cache_(cache),
      staging_(staging),
      cache_io_(cache_io),
      source_io_(source_io),
      metrics_(metrics) {}

absl::Status MemberReader::MemberDeadline(const Handle& h, const std::string& member,
                                          const std::string& cause) {
  return absl::DeadlineExceededError(
      absl::StrCat("shard ", h.shard, " member ", member, ": waiting for I/O: ", cause));
}

std::string MemberReader::IoWaitCause(const Handle& h, const std::string& what, int64_t result,
                                      absl::Time start) const {
  const IoService& io = *IoOf(h);
  if (result == kFileStalled) {
    return absl::StrCat("skipped at once: the shard stalls at the source (its last ",
                        io.per_file_limit(), " reads of ", *h.path,
                        " got no answer in time); its reads are sent again after ",
                        absl::FormatDuration(io.stalled_file_retry()));
  }
  const IoService::Timeout& t = io.last_timeout();
  const absl::Duration waited = absl::Now() - start;
  // Far above the service thread's own latency, the thread was not run in
  // time: the host is short of CPU (the decode pool, or other processes).
  const bool late = t.lag > absl::Milliseconds(50);
  const std::string lag =
      absl::StrCat("the stager's I/O thread ran ", absl::FormatDuration(t.lag), " late");
  if (result == kTimedOutQueued) {
    std::string why;
    if (late) {
      why = absl::StrCat(lag, ": the host is short of CPU");
    } else if (t.ahead >= io.capacity()) {
      why = absl::StrCat(t.ahead, " reads were in flight, the queue's depth",
                         h.from_cache ? "" : " (--read_queue_depth)");
    } else {
      why = absl::StrCat("it waited behind the shard's other reads (at most ", io.per_file_limit(),
                         " at once)");
    }
    return absl::StrCat(what, " of ", *h.path, " waited ", absl::FormatDuration(t.queued),
                        " in the stager's queue and was never sent to the file system: ", why,
                        "; not the file system stalling");
  }
  return absl::StrCat("the file system did not answer ", what, " of ", *h.path, " within ",
                      absl::FormatDuration(t.in_backend), " (sent after ",
                      absl::FormatDuration(t.queued), " in the stager's queue, ",
                      absl::FormatDuration(waited), " in all): it stalls or is overloaded",
                      late ? absl::StrCat("; ", lag) : "");
}

MemberReader::~MemberReader() { CloseExcept({}); }

void MemberReader::Read(const v1::ShardRef& shard, const std::string& member, uint64_t offset,
                        uint64_t length, absl::Time deadline, Done done, bool source_only) {
  if (shard.size() != 0 && offset + length > shard.size()) {
    done(TruncatedError(absl::StrCat("member ", member, " of shard ", shard.name(),
                                          " lies past the shard's end (offset ", offset, " + ",
                                          length, " > ", shard.size(),
                                          " bytes): truncated shard; re-index it")),
         false);
    return;
  }
  const bool staged = !source_only && staging_ != nullptr &&
                      staging_->Status(shard.name()).state == ShardState::kStaged &&
                      cache_->Has(shard.name(), shard.size());
  Pending p{member, offset, length, deadline, std::move(done), absl::Now()};
  std::shared_ptr<Handle> h;
  bool open = false, queued = false;
  absl::Status refused;
  {
    absl::MutexLock l(&mu_);
    auto& slot = handles_[{shard.name(), staged}];
    if (!slot) {
      slot = std::make_shared<Handle>();
      slot->shard = shard.name();
      slot->from_cache = staged;
      slot->size = shard.size();
      slot->name = shard.name();
      if (!staged) slot->key = FileKey(shard.name());
      if (staged) {
        slot->path = std::make_shared<std::string>(cache_->PathOf(shard.name()));
        slot->root = &cache_->root();
        cache_->Hold(shard.name());
      } else {
        auto path = JoinUnder(source_->path(), shard.name());
        if (path.ok()) {
          slot->path = std::make_shared<std::string>(*path);
          slot->root = source_;
        } else {
          refused = RefusePath(metrics_, "source", *source_, absl::StrCat("shard ", shard.name()),
                               shard.name(), 0, path.status().message());
          refused = Annotate(refused, absl::StrCat("member ", member));
          handles_.erase({shard.name(), staged});
        }
      }
    }
    if (refused.ok()) h = handles_[{shard.name(), staged}];
    if (h && h->fd < 0) {
      queued = true;
      h->waiting.push_back(std::move(p));
      if (!h->opening) {
        h->opening = true;
        open = true;
      }
    }
  }
  if (!refused.ok()) {
    p.done(refused, false);
    return;
  }
  if (open) {
    IoOp op;
    op.kind = IoOp::Kind::kOpen;
    op.root = h->root;
    op.path = h->name.c_str();
    op.flags = O_RDONLY;
    op.file = h->key;
    op.may_stall = !h->from_cache;
    const absl::Time start = absl::Now();
    IoOf(*h)->Submit(
        op, deadline,
        [this, h, start](int64_t r) {
          // Read on the service's thread, for the message.
          std::string cause;
          if (IsTimeout(r) || r == kFileStalled) cause = IoWaitCause(*h, "the open", r, start);
          OnOpen(h, r, cause);
        },
        h->path);
    return;
  }
  if (queued) return;  // issued when the open completes
  Issue(h, std::move(p));
}

void MemberReader::OnOpen(const std::shared_ptr<Handle>& h, int64_t r, const std::string& cause) {
  std::vector<Pending> waiting;
  {
    absl::MutexLock l(&mu_);
    h->opening = false;
    waiting.swap(h->waiting);
    if (r >= 0) {
      h->fd = static_cast<int>(r);
    } else {
      auto it = handles_.find({h->shard, h->from_cache});
      if (it != handles_.end() && it->second == h) handles_.erase(it);
      if (h->from_cache) cache_->Unhold(h->shard);
    }
  }
  if (r < 0) {
    absl::Status s;
    if (IsPathRefusal(r)) {
      s = RefusePath(metrics_, h->from_cache ? "cache" : "source", *h->root,
                     absl::StrCat("shard ", h->shard), h->name, r);
    } else if (!cause.empty()) {
      for (auto& p : waiting) p.done(MemberDeadline(*h, p.member, cause), h->from_cache);
      return;
    } else if (r == -ENOENT) {
      s = absl::NotFoundError(absl::StrCat("shard ", h->shard, " is missing (", *h->path,
                                           "); fix --source or re-index"));
    } else if (r == kNotRegularFile) {
      s = NotRegularFileError(absl::StrCat("shard ", h->shard), *h->path);
    } else {
      s = ErrnoStatus(static_cast<int>(-r), absl::StrCat("open ", *h->path));
    }
    for (auto& p : waiting) p.done(Annotate(s, absl::StrCat("member ", p.member)), h->from_cache);
    return;
  }
  for (auto& p : waiting) Issue(h, std::move(p));
}

void MemberReader::Issue(const std::shared_ptr<Handle>& h, Pending p) {
  {
    absl::MutexLock l(&mu_);
    ++h->in_flight;
  }
  auto buf = std::make_shared<std::string>(p.length, '\0');
  IoOp op;
  op.kind = IoOp::Kind::kRead;
  op.fd = h->fd;
  op.buf = buf->data();
  op.len = p.length;
  op.offset = p.offset;
  op.file = h->key;
  op.may_stall = !h->from_cache;
  auto pending = std::make_shared<Pending>(std::move(p));
  IoOf(*h)->Submit(
      op, pending->deadline,
      [this, h, buf, pending](int64_t r) {
        ReadDone(h);
        const double secs = absl::ToDoubleSeconds(absl::Now() - pending->start);
        if (metrics_) {
          (h->from_cache ? metrics_->read_cache_seconds : metrics_->read_source_seconds).Observe(secs);
        }
        if (IsTimeout(r) || r == kFileStalled) {
          pending->done(
              MemberDeadline(*h, pending->member,
                             IoWaitCause(*h,
                                         absl::StrCat("the read (", pending->length,
                                                      " bytes at offset ", pending->offset, ")"),
                                         r, pending->start)),
              h->from_cache);
        } else if (r < 0) {
          pending->done(Annotate(ErrnoStatus(static_cast<int>(-r), absl::StrCat("read ", *h->path)),
                                 absl::StrCat("member ", pending->member)),
                        h->from_cache);
        } else if (static_cast<uint64_t>(r) < pending->length) {
          pending->done(TruncatedError(absl::StrCat(
                            "member ", pending->member, " of ", *h->path, " needs ", pending->length,
                            " bytes at offset ", pending->offset, " but only ", r,
                            " could be read: truncated shard; re-copy or re-index it")),
                        h->from_cache);
        } else {
          if (metrics_ && !h->from_cache) {
            metrics_->source_bytes.Increment(static_cast<double>(pending->length));
          }
          pending->done(buf, h->from_cache);
        }
      },
      buf);
}

void MemberReader::ReadDone(const std::shared_ptr<Handle>& h) {
  absl::MutexLock l(&mu_);
  if (--h->in_flight == 0 && h->closing) CloseLocked(*h);
}

void MemberReader::CloseLocked(Handle& h) {
  if (h.fd >= 0) ::close(h.fd);
  h.fd = -1;
  if (h.from_cache) cache_->Unhold(h.shard);
}

void MemberReader::CloseExcept(const std::set<std::string>& keep) {
  absl::MutexLock l(&mu_);
  for (auto it = handles_.begin(); it != handles_.end();) {
    Handle& h = *it->second;
    if (keep.count(h.shard) || h.opening) {
      ++it;
      continue;
    }
    // A read still in flight keeps the fd; it is closed when the read returns.
    if (h.in_flight == 0) {
      CloseLocked(h);
    } else {
      h.closing = true;
    }
    it = handles_.erase(it);
  }
}

}  // namespace tutti::stager
