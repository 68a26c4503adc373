// Reads sample members (byte ranges of tar shards) for the decode pool: from
// the node-local cache when the shard is staged, otherwise straight from the
// source, each read with a deadline. Shard files are opened once and kept
// open while plans inside the window name them.
//
// Thread-safe; callbacks run on the IoService thread and must not block.
#ifndef TUTTI_SERVICES_STAGER_READER_H_
#define TUTTI_SERVICES_STAGER_READER_H_

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
#include "services/stager/cache.h"
#include "services/stager/metrics.h"
#include "services/stager/staging.h"
#include "tutti/v1/plan.pb.h"

namespace tutti::stager {

class MemberReader {
 public:
  using Bytes = std::shared_ptr<std::string>;
  using Done = std::function<void(absl::StatusOr<Bytes> bytes, bool from_cache)>;

  // source: the source directory (shard files are opened beneath it, and
  // beneath cache->root(), never through a symlink out of either); it and
  // cache outlive the reader and io's operations.
  MemberReader(const RootDir* source, ShardCache* cache, StagingEngine* staging, IoService* io,
               StagerMetrics* metrics);
  ~MemberReader();

  // Reads member `member` (length bytes at offset) of `shard`, from the
  // cache when it is staged (and `source_only` is false), else from the
  // source. Errors name the member and shard: DEADLINE_EXCEEDED, NOT_FOUND,
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
    int fd = -1;
    bool opening = false;
    bool closing = false;  // dropped from handles_: close when idle
    int in_flight = 0;
    uint64_t size = 0;
    std::vector<Pending> waiting;
  };
  void Issue(const std::shared_ptr<Handle>& h, Pending p);
  void OnOpen(const std::shared_ptr<Handle>& h, int64_t r);
  void ReadDone(const std::shared_ptr<Handle>& h);
  void CloseLocked(Handle& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RootDir* const source_;
  ShardCache* cache_;
  StagingEngine* staging_;
  IoService* io_;
  StagerMetrics* metrics_;
  absl::Mutex mu_;
  // (shard, from the cache) -> its open file
  std::map<std::pair<std::string, bool>, std::shared_ptr<Handle>> handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_READER_H_
