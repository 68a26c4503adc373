// Names of one daemon's batch segments in shared memory:
//   /tutti-<job>-<pid>-<nonce>-n<node>-r<rank>-s<step>
// The pid and a random nonce make them this daemon's alone, so two stagers
// on one host (two jobs with the same id, tests running side by side) never
// share a name; segments are created exclusively besides (O_EXCL). The
// prefix is recorded in the cache directory (which one daemon holds at a
// time), so the next daemon of that directory removes what a crashed one
// left, and never another daemon's segments.
//
// Thread-compatible: Claim once, then Name from any thread.
#ifndef TUTTI_SERVICES_STAGER_DECODE_SHM_NAMES_H_
#define TUTTI_SERVICES_STAGER_DECODE_SHM_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tutti::stager {

class SegmentNames {
 public:
  // The file in the cache directory that records the prefix in use.
  static constexpr const char* kRecordFile = ".tutti-shm";

  // Removes the segments whose prefix `cache_dir`'s record names (the
  // previous daemon of that directory, gone: the caller holds the cache
  // lock), picks a new prefix for `job_id` and records it. *removed (if
  // set) receives how many stale segments were removed.
  static absl::StatusOr<SegmentNames> Claim(const std::string& cache_dir, const std::string& job_id,
                                            int* removed = nullptr);

  std::string Name(uint32_t node, uint32_t rank, uint64_t step) const;
  const std::string& prefix() const { return prefix_; }

 private:
  explicit SegmentNames(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string prefix_;  // "/tutti-<job>-<pid>-<nonce>"
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_DECODE_SHM_NAMES_H_
