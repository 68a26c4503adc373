// The node-local shard cache: which shards are in the cache directory, how
// many bytes they use, and which to evict (least recently used first, never a
// pinned shard: one named by a plan inside the window, or open for reading).
//
// On disk a finished shard has its source-relative name under the cache
// directory; a shard being written is "<name>.tutti-partial" and is only
// renamed into place after it was verified and fsync'd, so a crash leaves
// either the whole shard or a partial file, which Open() removes.
//
// Thread-safe: every method may be called from any thread.
#ifndef TUTTI_SERVICES_STAGER_STAGING_CACHE_H_
#define TUTTI_SERVICES_STAGER_STAGING_CACHE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/root_dir.h"

namespace tutti::stager {

class ShardCache {
 public:
  static constexpr const char* kPartialSuffix = ".tutti-partial";

  // capacity_bytes: total bytes of shards kept (0 = unlimited). resolve: how
  // names are opened beneath the directory (root_dir.h).
  ShardCache(std::string dir, uint64_t capacity_bytes, ResolveMode resolve = ResolveMode::kAuto);
  ~ShardCache();

  // Creates the directory, takes an exclusive lock on it (one daemon per
  // cache), removes partial files left by a crash and catalogues the rest
  // (regular files only; a symlink is never a cached shard). A cached file
  // that others may read (from an older version) is made 0640.
  absl::Status Open();

  const std::string& dir() const { return dir_; }
  // The directory as Open() found it: every shard file is opened, renamed
  // and removed beneath it, never through a symlink out of it.
  const RootDir& root() const { return *root_; }
  uint64_t capacity() const { return capacity_; }
  std::string PathOf(const std::string& name) const;
  std::string PartialPathOf(const std::string& name) const;

  // True when `name` is cached with the expected size (0 = any); a cached
  // file of another size is removed. Counts as a use.
  bool Has(const std::string& name, uint64_t expected_size);
  // Reserves room for a shard about to be staged, evicting unpinned shards
  // (least recently used first); the names of the shards evicted are added
  // to `evicted` when given (also when the reservation fails), so that the
  // caller stops counting them as staged. RESOURCE_EXHAUSTED when even that
  // is not enough, naming the sizes involved.
  absl::Status Reserve(const std::string& name, uint64_t bytes,
                       std::vector<std::string>* evicted = nullptr);
  // The staged shard was renamed into place.
  void Commit(const std::string& name, uint64_t bytes);
  // Staging failed: drop the reservation.
  void Abort(const std::string& name);

  // Replaces the set of shards named by plans inside the window.
  void SetPinned(std::set<std::string> names);
  // Readers hold a shard open: it is not evicted while held.
  void Hold(const std::string& name);
  void Unhold(const std::string& name);

  uint64_t used_bytes() const;     // cached + reserved
  uint64_t cached_bytes() const;
  size_t cached_files() const;
  uint64_t evictions() const;
  // Called (outside the lock) with the name of every evicted shard.
  void SetEvictionListener(std::function<void(const std::string&, uint64_t)> fn);

 private:
  struct Entry {
    uint64_t bytes = 0;
    uint64_t last_use = 0;  // logical clock
    bool reserved = false;  // being staged
    int holds = 0;
  };
  absl::Status Scan(const std::string& sub) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Removes a cached file (the lock is held only for the bookkeeping).
  void Remove(const std::string& name) const;

  const std::string dir_;
  const uint64_t capacity_;
  const ResolveMode resolve_;
  std::unique_ptr<RootDir> root_;  // set by Open()
  int lock_fd_ = -1;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> pinned_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(const std::string&, uint64_t)> on_evict_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGING_CACHE_H_
