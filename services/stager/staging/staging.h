// Copies shards from the source directory (an NFS mount, say) into the
// node-local cache: many files and blocks in flight through one IoService
// (io_uring by default), registered aligned buffers (unregistered when the
// locked-memory limit is too small), optional O_DIRECT,
// CRC-32C verified when the index knows it, written to a partial name,
// fsync'd and renamed into place. Shards are copied in priority order (the
// step that first needs them), so the shards needed first arrive first.
//
// Thread-safe. Request/State/Wait may be called from any thread; the copy
// state machine runs on the IoService thread.
#ifndef TUTTI_SERVICES_STAGER_STAGING_STAGING_H_
#define TUTTI_SERVICES_STAGER_STAGING_STAGING_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/root_dir.h"
#include "common/uring_file.h"
#include "services/stager/metrics.h"
#include "services/stager/staging/cache.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::stager {

// Bounds of the staging buffers (queue_depth x block_size, allocated at
// Start): a block at most 64 MiB, all buffers together at most 4 GiB.
inline constexpr uint64_t kMaxStagingBlock = uint64_t{64} << 20;
inline constexpr uint64_t kMaxStagingBuffers = uint64_t{4} << 30;

struct StagingOptions {
  std::string source_dir;          // where shards are read from
  unsigned queue_depth = 64;       // reads and writes in flight (one buffer each)
  size_t block_size = 1 << 20;     // bytes per read/write; a multiple of 4096
  unsigned max_files = 32;         // shards copied at the same time
  // Reads of one shard in flight. It is also the most operations on one
  // source file the copy sends at once, stuck ones included
  // (IoServiceOptions::per_file_limit): a shard whose source stops answering
  // holds at most this many buffers and I/O workers while the others are
  // copied; once all of them are stuck its copy fails at once until one
  // returns. Keep it under a FUSE mount's background limit (12 by default,
  // shared with the member reads of the same mount).
  unsigned file_queue_depth = 4;
  bool o_direct = true;            // O_DIRECT writes into the cache (falls back when refused)
  bool o_direct_source = false;    // O_DIRECT reads from the source
  bool use_io_uring = true;        // false: a thread pool doing pread/pwrite
  // How shard names are opened beneath source_dir and the cache: openat2
  // RESOLVE_BENEATH where the kernel has it, else the checked walk
  // (common/root_dir.h). A name that leads outside is refused.
  ResolveMode resolve = ResolveMode::kAuto;
  absl::Duration op_timeout = absl::Seconds(30);  // one open/read/write on the source or cache
  // A failed shard is copied again when next asked for, once this has
  // passed; each further failure in a row doubles the wait, up to
  // max_retry_after (a stalled source is tried again, not hammered).
  absl::Duration retry_after = absl::Seconds(10);
  absl::Duration max_retry_after = absl::Minutes(5);
};

enum class ShardState { kUnknown, kPending, kStaging, kStaged, kFailed };
const char* ShardStateName(ShardState s);

struct ShardStatusInfo {
  std::string name;
  ShardState state = ShardState::kUnknown;
  uint64_t bytes = 0;  // staged: its size; staging: copied so far
  absl::Status error;
  uint32_t failures = 0;   // failed copies in a row
  absl::Time progress_at;  // staging: when the copy started or last wrote a block
};

class StagingEngine {
 public:
  // backend: null = built from options (io_uring or threads); tests inject a
  // FaultInjectingBackend. metrics may be null.
  StagingEngine(StagingOptions options, ShardCache* cache, StagerMetrics* metrics,
                std::unique_ptr<IoBackend> backend = nullptr);
  ~StagingEngine();

  absl::Status Start();
  void Stop();

  // Asks for `shard` to be in the cache; lower priority values go first.
  // A shard already cached is a hit; re-asking lowers its priority value.
  void Request(const v1::ShardRef& shard, uint64_t priority);
  // A shard the cache evicted is not staged any more: kUnknown, as if never
  // asked for, and left out of the Snapshot.
  ShardStatusInfo Status(const std::string& name) const;
  std::vector<ShardStatusInfo> Snapshot() const;
  // Blocks until every shard in `names` is staged or failed, or until
  // `deadline`; returns the first failure (or DEADLINE_EXCEEDED). A shard
  // seen staged counts even if evicted later; one evicted before it was
  // seen is waited for until asked for again and staged.
  absl::Status Wait(const std::vector<std::string>& names, absl::Time deadline) const;
  // Called (on the staging thread) whenever a shard is staged or fails.
  void SetListener(std::function<void(const std::string&, ShardState)> fn);

  const StagingOptions& options() const { return opts_; }
  // source_dir as Start() opened it; shard files are opened beneath it only.
  const RootDir& source_root() const { return *source_; }
  const char* backend_name() const;
  // Whether the block buffers are registered with the kernel (io_uring fixed
  // buffers). Registration needs the locked-memory limit (ulimit -l) to cover
  // queue_depth x block_size unless the process has CAP_IPC_LOCK; without it
  // staging logs why and uses the same buffers unregistered.
  bool registered_buffers() const { return registered_; }
  // The I/O service's counts (timeouts, stalled operations); zeros when stopped.
  IoServiceStats io_stats() const;

 private:
  struct File;

  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartFile(std::shared_ptr<File> f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IssueReads(const std::shared_ptr<File>& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // IoService callbacks (on its thread; each takes mu_).
  void OnOpened(const std::shared_ptr<File>& f, bool source, int64_t r);
  void OnSourceStat(const std::shared_ptr<File>& f, int64_t r);
  void OnAllocated(const std::shared_ptr<File>& f, int64_t r);
  void OnRead(const std::shared_ptr<File>& f, int buffer, uint64_t offset, size_t len, int64_t r,
              const std::shared_ptr<void>& lease);
  void OnWritten(const std::shared_ptr<File>& f, int buffer, size_t len, int64_t r);
  void OnFinalStat(const std::shared_ptr<File>& f, int64_t r);
  void OnFsynced(const std::shared_ptr<File>& f, int64_t r);
  void Finish(const std::shared_ptr<File>& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const std::shared_ptr<File>& f, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cache evicted these shards to make room: they are not staged any more
  // (Status says kUnknown, Snapshot leaves them out) and are copied again
  // when next asked for.
  void Evicted(const std::vector<std::string>& names) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the shard's files, removes its partial copy and gives back its reservation.
  void Discard(const std::shared_ptr<File>& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No room in the cache while other shards are being copied: back to the
  // queue once one of them ends (logged, rate-limited), not failed.
  void Defer(const std::shared_ptr<File>& f, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the outcome and tells the listener (with mu_ released meanwhile).
  void Done(const std::shared_ptr<File>& f, ShardState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReturnBuffer(int buffer);  // a lease ended: the kernel is done with the buffer
  // The operation using `buffer` timed out and may stay stuck with it: a
  // new buffer takes its place in the pool.
  void ReplaceBuffer(int buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The registered buffer index for an operation on `buffer`, or -1.
  int BufIndex(int buffer) const {
    return buffer < static_cast<int>(opts_.queue_depth) ? buffer : -1;
  }
  // Reads of one shard in flight: file_queue_depth, one short of the
  // queue depth so a stalled shard never takes every buffer.
  unsigned FileDepth() const;
  absl::Time OpDeadline() const { return absl::Now() + opts_.op_timeout; }
  // An operation on the shard's source file (bounded per file, may stall).
  static IoOp SourceOp(const File& f, IoOp::Kind kind);
  // Why a source operation of `what` failed with a timeout or kFileStalled.
  absl::Status Stalled(const File& f, const std::string& what, int64_t r) const;
  // How long a shard that failed `failures` times in a row waits to be retried.
  absl::Duration RetryAfter(uint32_t failures) const;

  // Fixed at construction, or set by Start before any operation.
  StagingOptions opts_;
  ShardCache* cache_;
  StagerMetrics* metrics_;
  std::unique_ptr<IoBackend> injected_;
  std::unique_ptr<RootDir> source_;  // outlives io_
  std::unique_ptr<IoService> io_;
  bool registered_ = false;

  mutable absl::Mutex mu_;
  mutable absl::CondVar cv_;  // a shard was staged or failed (for Wait)
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Aligned block buffers by index; the first queue_depth are registered
  // when registered_. A buffer whose operation timed out and stays stuck in
  // the kernel is replaced by a new one (at most queue_depth of them), so a
  // stalled file never holds the copy's buffers for good; it is freed if the
  // operation ever returns (nullptr from then on).
  std::vector<char*> buffers_ ABSL_GUARDED_BY(mu_);
  std::set<int> lost_ ABSL_GUARDED_BY(mu_);  // replaced, still held by a stuck operation
  unsigned replaced_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int> free_buffers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ShardStatusInfo> status_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, absl::Time> failed_at_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<uint64_t, std::string>> queue_ ABSL_GUARDED_BY(mu_);  // (priority, name)
  std::map<std::string, std::pair<uint64_t, v1::ShardRef>> queued_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<File>> active_ ABSL_GUARDED_BY(mu_);
  // Shards waiting for a copy in progress to end (no room in the cache now).
  std::map<std::string, std::pair<uint64_t, v1::ShardRef>> deferred_ ABSL_GUARDED_BY(mu_);
  std::function<void(const std::string&, ShardState)> listener_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGING_STAGING_H_
