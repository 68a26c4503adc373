// The serialized StepPlans the packer has served, kept so that the same
// (step, rank set) asked again is answered with the same bytes instead of
// building and serializing the plan again: a plan is a pure function of its
// step and ranks, so a kept plan is always the right answer.
//
// Bounded: steps more than `keep_behind` below the newest step asked for are
// dropped, and while the bytes kept exceed max_bytes the lowest steps are
// dropped (the step being added last); a plan larger than max_bytes on its
// own is served but not kept.
//
// Thread-safe.
#ifndef TUTTI_SERVICES_PACKER_SERVED_PLANS_H_
#define TUTTI_SERVICES_PACKER_SERVED_PLANS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tutti::packer {

struct ServedPlansOptions {
  // Bytes of serialized plans kept at most (tutti-packerd
  // --served_plan_cache_bytes). Default 256 MiB: every single-rank plan of
  // a 2,560-rank job over a 16-step window is about 100 MB.
  uint64_t max_bytes = uint64_t{256} << 20;
  // Steps kept below the newest one asked for (the plan window).
  uint32_t keep_behind = 8;
};

class ServedPlans {
 public:
  using Bytes = std::shared_ptr<const std::string>;

  explicit ServedPlans(ServedPlansOptions options) : options_(options) {}

  // The ranks as a key: sorted, without duplicates (empty: all ranks).
  static std::vector<uint32_t> Key(absl::Span<const uint32_t> ranks);

  // The kept bytes of (step, key), or null. `key` from Key().
  Bytes Find(uint64_t step, const std::vector<uint32_t>& key) const;
  // Keeps `bytes` for (step, key) within the bounds; returns what is kept
  // for it (an earlier insertion wins) or, when it is not kept, `bytes`.
  Bytes Insert(uint64_t step, std::vector<uint32_t> key, Bytes bytes);

  uint64_t bytes() const;
  uint64_t entries() const;
  uint64_t steps() const;

 private:
  using StepPlans = absl::flat_hash_map<std::vector<uint32_t>, Bytes>;
  // Drops the steps behind the newest, then the lowest others than `keep`
  // while over max_bytes.
  void Trim(uint64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(std::map<uint64_t, absl::flat_hash_map<std::vector<uint32_t>, Bytes>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServedPlansOptions options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, StepPlans> by_step_ ABSL_GUARDED_BY(mu_);
  uint64_t newest_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_SERVED_PLANS_H_
