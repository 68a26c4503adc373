// Reads sample members (byte ranges of tar shards) for the decode pool: from
// the node-local cache when the shard is staged, otherwise straight from the
// source, each read with a deadline. Shard files are opened once and kept
// open while plans inside the window name them.
//
// Cache and source reads go through I/O services of their own, so a source
// that stalls never holds up a read from the cache. Source reads of one
// shard are bounded (the source service's per-file limit): a shard whose
// source stops answering holds that many of its workers at most, and once
// they are all stuck its members are skipped at once instead of each
// waiting for the deadline.
//
// Thread-safe; callbacks run on the IoService thread and must not block.
#ifndef TUTTI_SERVICES_STAGER_STAGING_READER_H_
#define TUTTI_SERVICES_STAGER_STAGING_READER_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/uring_file.h"
#include "services/stager/metrics.h"
#include "services/stager/staging/cache.h"
#include "services/stager/staging/staging.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::stager {

class MemberReader {
 public:
  using Bytes = std::shared_ptr<std::string>;
  using Done = std::function<void(absl::StatusOr<Bytes> bytes, bool from_cache)>;

  // source: the source directory (shard files are opened beneath it, and
  // beneath cache->root(), never through a symlink out of either); it and
  // cache outlive the reader and the services' operations. cache_io reads
  // staged shards, source_io the others (its per_file_limit bounds the reads
  // of one shard).
  MemberReader(const RootDir* source, ShardCache* cache, StagingEngine* staging,
               IoService* cache_io, IoService* source_io, StagerMetrics* metrics);
  ~MemberReader();

  // Reads member `member` (length bytes at offset) of `shard`, from the
  // cache when it is staged (and `source_only` is false), else from the
  // source. Errors name the member and shard: DEADLINE_EXCEEDED ("shard S
  // member M: waiting for I/O: " and what ran out: the file system's answer,
  // the stager's own queue, or a shard that stalls), NOT_FOUND,
  // DATA_LOSS (a member past the end of the shard), PERMISSION_DENIED marked
  // "outside_root" (the shard's name leads outside its directory), or the
  // system error.
  void Read(const v1::ShardRef& shard, const std::string& member, uint64_t offset, uint64_t length,
            absl::Time deadline, Done done, bool source_only = false);
  // Closes shard files not named in `keep`.
  void CloseExcept(const std::set<std::string>& keep);

 private:
  struct Pending {
    std::string member;
    uint64_t offset, length;
    absl::Time deadline;
    Done done;
    absl::Time start;
  };
  // One open shard file. The fields after `path` change under mu_.
  struct Handle {
    std::string shard;
    bool from_cache = false;
    std::shared_ptr<std::string> path;  // for messages
    std::string name;                   // opened beneath root
    const RootDir* root = nullptr;
    uint64_t key = 0;  // IoOp::file of a source file
    int fd = -1;
    bool opening = false;
    bool closing = false;  // dropped from handles_: close when idle
    int in_flight = 0;
    uint64_t size = 0;
    std::vector<Pending> waiting;
  };
  void Issue(const std::shared_ptr<Handle>& h, Pending p);
  IoService* IoOf(const Handle& h) const { return h.from_cache ? cache_io_ : source_io_; }
  // What ran out for an open or read (`what`) answered with a timeout or
  // kFileStalled; called on the service's thread, in its callback.
  std::string IoWaitCause(const Handle& h, const std::string& what, int64_t result,
                          absl::Time start) const;
  // DEADLINE_EXCEEDED "shard S member M: waiting for I/O: <cause>".
  static absl::Status MemberDeadline(const Handle& h, const std::string& member,
                                     const std::string& cause);
  // cause: why the open ran out of time (IoWaitCause), when it did.
  void OnOpen(const std::shared_ptr<Handle>& h, int64_t r, const std::string& cause);
  void ReadDone(const std::shared_ptr<Handle>& h);
  void CloseLocked(Handle& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RootDir* const source_;
  ShardCache* cache_;
  StagingEngine* staging_;
  IoService* cache_io_;
  IoService* source_io_;
  StagerMetrics* metrics_;
  absl::Mutex mu_;
  // (shard, from the cache) -> its open file
  std::map<std::pair<std::string, bool>, std::shared_ptr<Handle>> handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGING_READER_H_
