// Exact apportionment of a stream's per-step draw among the sources of a
// mixture (services/packer/README.md, "Mixtures").
//
// A segment holds integer weights w_s (sum U): source s's share of a step of
// N samples is a_s = N w_s / U. A step gives every source floor(a_s) plus
// one "extra" to R = N - sum floor(a_s) of them, so counts sum to N and each
// is within one sample of its share. The extras follow PD^2 (Anderson and
// Srinivasan's Pfair priorities: earliest pseudo-deadline, then the b-bit,
// then the later group deadline), which is optimal for R processors and
// tasks of rates frac(a_s) summing to R: every source's extras since the
// segment began stay strictly within one of frac(a_s) x steps, so its count
// since then stays strictly within one sample of a_s x steps (exactly on it
// whenever that is an integer). Every segment starts afresh: a change of
// weights takes the counts as they stand.
//
// The extras repeat with period P = U / gcd(U, N) (all lags are 0 there), so
// a step is found from the period's start; a position within the period is
// replayed from a checkpoint (every kCheckpointSteps steps, one bit per
// source: whether its extra came early) or from a recently computed state.
// A step far into a segment whose period is long costs one pass over the
// steps from the segment's start to it the first time (about a microsecond
// a step at 200 sources); every later step near it costs at most
// kCheckpointSteps steps.
#ifndef TUTTI_SERVICES_PACKER_CORE_APPORTION_H_
#define TUTTI_SERVICES_PACKER_CORE_APPORTION_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tutti::packer {

// Integer weights with the same ratios as `w` (finite, >= 0, some > 0):
// exact when every weight is a decimal of at most 9 places (0.3 -> 3 of 10),
// else in fixed point, 52 bits below the largest weight. Reduced by their
// greatest common divisor.
std::vector<uint64_t> ExactWeights(const std::vector<double>& w);

struct ApportionSegment {
  uint64_t start_step = 0;
  std::vector<uint64_t> weights;  // per source; sum > 0, below 2^62
};

class Apportionment {
 public:
  static constexpr uint64_t kCheckpointSteps = 64;

  // `segments`: start_step strictly increasing, the first at 0, each with
  // `sources` weights. per_step: N.
  Apportionment(uint32_t per_step, uint32_t sources, std::vector<ApportionSegment> segments);

  uint32_t per_step() const { return per_step_; }
  uint32_t sources() const { return sources_; }
  size_t num_segments() const { return segs_.size(); }
  uint64_t segment_start(size_t k) const { return segs_[k].start; }
  size_t SegmentOf(uint64_t step) const;

  // count[s]: source s's samples at `step`; before[s] (may be null): its
  // samples in the steps before. Thread-safe.
  void At(uint64_t step, uint32_t* count, uint64_t* before) const;
  // Source s's share at `step`, N w_s / U.
  double Share(uint64_t step, uint32_t s) const;
  // The most source s draws in any step: max over segments of ceil(a_s).
  uint32_t MaxCount(uint32_t s) const { return max_count_[s]; }
  // The step whose draw holds source s's sample number q (its q-th since
  // step 0): before(step) <= q < before(step + 1). Requires that s draws
  // that many at all (some later segment gives it a share, or q is below
  // what the segments that do give it reach).
  uint64_t StepOf(uint32_t s, uint64_t q) const;
  // Source s's samples before step `step` (At's `before` for one source).
  uint64_t Before(uint64_t step, uint32_t s) const;

 private:
  struct Seg {
    uint64_t start = 0, end = UINT64_MAX;  // [start, end)
    unsigned __int128 U = 0;
    std::vector<uint64_t> base;    // floor(N w_s / U)
    std::vector<uint64_t> p;       // (N w_s) mod U: extras' rate numerators
    std::vector<uint64_t> qU, rU;  // U = qU p + rU, per source with p > 0
    uint64_t R = 0;                // extras a step: sum p / U
    uint64_t period = 0;           // steps after which every lag is 0
  };
  // A source's next extra (Pfair subtask i = extras + 1): the first step it
  // may come, and i U = a p + b (its deadline is a + (b > 0)).
  struct Next {
    uint64_t release = 0, a = 0, b = 0;
  };
  // A position within a segment's period: extras so far per source.
  struct State {
    size_t seg = 0;
    uint64_t j = 0;  // steps into the period
    std::vector<uint64_t> extras;
    std::vector<Next> next;
  };
  void InitNext(const Seg& g, State* st) const;
  // One step of PD^2 at period position st->j: sets took[s] and advances.
  void Step(const Seg& g, State* st, std::vector<uint8_t>* took) const;
  // The state at period position j of segment k.
  void StateAt(size_t k, uint64_t j, State* st) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cumulative counts before segment k's start.
  const std::vector<uint64_t>& SegmentBefore(size_t k) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Extras of source s in the first j steps of segment k (any j).
  uint64_t ExtrasAfter(size_t k, uint64_t j, uint32_t s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AtLocked(uint64_t step, uint32_t* count, uint64_t* before) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint32_t per_step_;
  uint32_t sources_;
  std::vector<Seg> segs_;
  std::vector<uint32_t> max_count_;

  mutable absl::Mutex mu_;
  // Per segment: checkpoints (bit s of checkpoint c: source s's extra of
  // period position c x kCheckpointSteps came early), cumulative counts
  // before it (empty until computed).
  mutable std::vector<std::map<uint64_t, std::vector<uint64_t>>> checkpoints_ ABSL_GUARDED_BY(mu_);
  mutable std::vector<std::vector<uint64_t>> before_ ABSL_GUARDED_BY(mu_);
  // States computed recently, for the next steps.
  mutable std::vector<State> recent_ ABSL_GUARDED_BY(mu_);
  mutable size_t recent_next_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_CORE_APPORTION_H_
