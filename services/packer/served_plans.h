// The serialized StepPlans the packer has served, kept so that the same
// (step, rank set) asked again is answered with the same bytes instead of
// building and serializing the plan again: a plan is a pure function of its
// step and ranks, so a kept plan is always the right answer.
//
// Built once: while the bytes of a (step, rank set) are being built (asked
// for the first time, or precomputed when the plan window planned the step),
// later requests for them wait for that build instead of building them
// again; requests for other plans are not held up by it (no lock is held
// while a plan is built or serialized).
//
// Bounded: steps more than `keep_behind` below the newest step asked for are
// dropped, and while the bytes kept exceed max_bytes the lowest steps are
// dropped (the step being added last); a plan larger than max_bytes on its
// own is served but not kept. Precomputed bytes never drop others: they are
// kept only while they fit.
//
// Thread-safe.
#ifndef TUTTI_SERVICES_PACKER_SERVED_PLANS_H_
#define TUTTI_SERVICES_PACKER_SERVED_PLANS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tutti::packer {

// Rank sets whose plans are built and serialized when the plan window has
// planned a step, before any client asks (tutti-packerd
// --served_plan_precompute). Bits.
enum PrecomputeShapes : uint32_t {
  kPrecomputeNone = 0,
  kPrecomputeNodes = 1,  // each node's ranks (ranks_per_node consecutive), as a stager asks
  kPrecomputeRanks = 2,  // each single rank
};

struct ServedPlansOptions {
  // Bytes of serialized plans kept at most (tutti-packerd
  // --served_plan_cache). Default 256 MiB: every single-rank plan of a
  // 2,560-rank job over 16 steps is about 220 MB.
  uint64_t max_bytes = uint64_t{256} << 20;
  // Steps kept below the newest one asked for (the plan window).
  uint32_t keep_behind = 8;
  // PrecomputeShapes bits. Default none here (tests, libraries);
  // tutti-packerd precomputes nodes and ranks by default.
  uint32_t precompute = kPrecomputeNone;
};

class ServedPlans {
 public:
  using Bytes = std::shared_ptr<const std::string>;
  using Done = std::function<void(absl::StatusOr<Bytes>)>;

  explicit ServedPlans(ServedPlansOptions options) : options_(options) {}

  // The ranks as a key: sorted, without duplicates (empty: all ranks).
  static std::vector<uint32_t> Key(absl::Span<const uint32_t> ranks);

  // A request for (step, key), `key` from Key(); moves the newest step asked
  // for. Returns the kept bytes (then *done is left alone) or null: then
  // *done was moved into the waiters of (step, key) and runs when its build
  // completes, and *build says whether this caller is the one to build them
  // and call Complete (false: a build is already under way).
  Bytes Serve(uint64_t step, const std::vector<uint32_t>& key, Done* done, bool* build);

  // Before precomputing (step, key): kClaimed when this caller is to build
  // them and call Complete(..., precomputed = true); kSkip when they are
  // kept or being built, or the step is behind the window; kFull when the
  // budget leaves no room for more.
  enum class Claim { kClaimed, kSkip, kFull };
  Claim ClaimPrecompute(uint64_t step, const std::vector<uint32_t>& key);

  // The build of a claimed (step, key) is done: OK bytes are kept within
  // the bounds (precomputed ones only while they fit). Returns its waiters
  // with what they are served (the kept bytes or `result`); Run() them.
  struct Completed {
    std::vector<Done> waiters;
    absl::StatusOr<Bytes> served;
    void Run() {
      for (Done& w : waiters) w(served);
    }
  };
  [[nodiscard]] Completed Complete(uint64_t step, const std::vector<uint32_t>& key,
                                   absl::StatusOr<Bytes> result, bool precomputed);

  // The kept bytes of (step, key), or null.
  Bytes Find(uint64_t step, const std::vector<uint32_t>& key) const;
  // Keeps `bytes` for (step, key) within the bounds; returns what is kept
  // for it (an earlier insertion wins) or, when it is not kept, `bytes`.
  Bytes Insert(uint64_t step, std::vector<uint32_t> key, Bytes bytes);

  const ServedPlansOptions& options() const { return options_; }
  uint64_t bytes() const;
  uint64_t entries() const;
  uint64_t steps() const;
  uint64_t building() const;  // builds under way

 private:
  using StepPlans = absl::flat_hash_map<std::vector<uint32_t>, Bytes>;
  using PendingKey = std::pair<uint64_t, std::vector<uint32_t>>;
  Bytes InsertLocked(uint64_t step, std::vector<uint32_t> key, Bytes bytes, bool only_if_room)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Bytes FindLocked(uint64_t step, const std::vector<uint32_t>& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the steps behind the newest, then the lowest others than `keep`
  // while over max_bytes.
  void Trim(uint64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Drop(std::map<uint64_t, StepPlans>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ServedPlansOptions options_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, StepPlans> by_step_ ABSL_GUARDED_BY(mu_);
  // Builds under way, with the requests waiting for each.
  absl::flat_hash_map<PendingKey, std::vector<Done>> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t newest_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  // Size of the last precomputed plan: room for another is judged by it.
  uint64_t last_precomputed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_SERVED_PLANS_H_
