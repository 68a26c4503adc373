// The batch window: for each step from the window's first one, one slot per
// local rank, each moving through
//   wait for plan -> wait for shards -> building -> ready -> (handed out) -> released
// (or failed, with the error its client gets). It decides which batches to
// build next (steps inside the window whose shards are staged, or have
// waited long enough, within the shared-memory budget), answers clients
// (at once, or when their batch is ready, or at their deadline), gives up a
// rank's earlier steps when it asks for a later one, moves the window to
// steps asked for outside it, and advances it as every local rank releases
// its first step.
//
// Ranks that come and go. A rank's process registers (rank_processes.h
// issues it an incarnation). A new process of a rank means its old process
// is gone (it died and was restarted, or the job was restarted from a
// checkpoint): everything the old one, or calls naming no process, held or
// waited for is reclaimed (batches freed, built again if asked for; waiting
// calls answered ABORTED), never anything another rank holds.
//
// Moves. The window hands out the batches of steps base .. base + 2 x window
// - 1 and builds those of its first `window` steps. A step asked for outside
// it moves it to start at the earliest of that step and every step in use
// (held, or waited for), when all of them then lie inside it: what is in use
// stays, and the ranks seen at later steps give up the steps added before
// them. So ranks that come back at different steps (a job resumed from a
// checkpoint, a stager restarted under a running job), in any order and up
// to 2 x window - 1 steps apart, are all served, and a waiting rank never
// keeps the window from a step another needs. Ranks farther apart wait (up
// to their timeout) for what is in use to move, told which rank holds or
// waits for which step.
//
// Leases. A client that renews its leases (AcquireBatchRequest.renews_leases)
// holds each batch on a lease of `lease`: a hold its process does not renew
// in time is freed (counted, logged with job, rank and step), and a rank
// whose process is not heard from within the lease (it died, or hangs) is
// taken as gone: what it held is freed, its waiting calls are answered, no
// batch is built for it and the window advances past its slots with the
// other ranks. A renewal keeps a hold however long it is held. The rank is
// back with its next call (the same process, or a new incarnation).
//
// Pure logic: no threads, no I/O, the clock passed in. Answers to clients
// are returned as callbacks for the caller to run outside its lock.
// Not thread-safe: StagerCore keeps it under its lock.
#ifndef TUTTI_SERVICES_STAGER_WINDOW_BATCH_WINDOW_H_
#define TUTTI_SERVICES_STAGER_WINDOW_BATCH_WINDOW_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/stager/metrics.h"
#include "services/stager/plan_intake.h"
#include "services/stager/staging/staging.h"
#include "services/stager/window/node_ranks.h"
#include "tutti/v1/plan.pb.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::stager {

struct BatchWindowOptions {
  uint32_t window = 4;                           // steps of batches built ahead, per local rank
  uint64_t memory_budget_bytes = 8ull << 30;     // shared memory all batches may hold together
  absl::Duration stage_wait = absl::Seconds(2);  // a step waits this long for its shards, then
                                                 // builds from the source
  uint32_t default_acquire_timeout_ms = 120000;  // an Acquire with timeout 0 waits this long
  uint64_t total_steps = 0;                      // the job's steps (0 = open-ended)
  absl::Duration lease = absl::Seconds(60);      // how long a renewing client's hold, and
                                                 // its rank, last without being heard from
  std::string job_id;                            // named in the log lines about leases
};

// One batch the window holds (BatchJob in the daemon).
class WindowBatch {
 public:
  virtual ~WindowBatch() = default;
  virtual uint64_t step() const = 0;
  virtual uint32_t rank() const = 0;
  virtual uint64_t bytes() const = 0;  // shared memory it holds
  // Starts building it; its owner calls BatchWindow::Ready once it is built.
  virtual absl::Status Start() = 0;
  virtual absl::Time started() const = 0;
  virtual absl::Time deadline() const = 0;
  virtual void Expire() = 0;   // gives up on work still pending (a safety net)
  virtual void Discard() = 0;  // no one will read it: its segment goes
  virtual const v1::BatchDescriptor& descriptor() const = 0;  // once built
  virtual std::string PendingSummary() const = 0;             // what is outstanding
};

class BatchWindow {
 public:
  using Answer = std::function<void(absl::StatusOr<v1::BatchDescriptor>)>;
  using Callbacks = std::vector<std::function<void()>>;
  // Lays out the batch of `rank` (the plan's rank_index-th RankPlan); an
  // error fails that slot.
  using MakeBatch = std::function<absl::StatusOr<std::shared_ptr<WindowBatch>>(
      const std::shared_ptr<const v1::StepPlan>& plan, int rank_index)>;
  using ShardStateOf = std::function<ShardState(const std::string& shard)>;

  // ranks: this node's ranks (the caller's, kept alive by it).
  BatchWindow(BatchWindowOptions options, const NodeRanks* ranks, StagerMetrics* metrics)
      : opts_(options), ranks_(ranks), metrics_(metrics) {}

  uint64_t base() const { return base_; }
  uint64_t memory() const { return memory_; }
  const BatchWindowOptions& options() const { return opts_; }

  // ---- clients (the rank is local)
  // A new process registered for `rank` (RankProcesses issued it
  // `incarnation`): everything an earlier process of the rank, or a call
  // naming none, held or waited for is reclaimed (see Ranks that come and go).
  void NewProcess(uint32_t rank, uint64_t incarnation, Callbacks* cbs);
  // The rank's current process, checked by the caller, called at `now`
  // (incarnation 0: a call naming none, nothing recorded). renews: whether
  // it renews its leases (AcquireBatch says; nullopt: as before). A rank
  // taken as gone is back.
  void Heard(uint32_t rank, uint64_t incarnation, absl::Time now, std::optional<bool> renews);
  // After Heard: the rank's current process still holds the batches of
  // `steps`: their leases start again at `now`. *lost gets the steps named
  // that it does not hold (freed when their lease lapsed, or never handed out).
  void Renew(uint32_t rank, const std::vector<uint64_t>& steps, absl::Time now,
             std::vector<uint64_t>* lost);
  // Whether the rank was taken as gone (its lease lapsed) and has not called since.
  bool Gone(uint32_t rank) const;
  // Whether `rank` may ask for `step` now. A step outside the window moves
  // it (see Moves above; *moved = true: the caller restarts plan intake at
  // base()); one that cannot yet waits in Acquire. Refuses a step past the
  // job's end and one already released.
  absl::Status Admit(uint64_t step, uint32_t rank, bool* moved);
  // After Admit: gives up the rank's earlier steps it never took, then answers
  // at once (ready or failed) or keeps `done` until the batch is ready or
  // `timeout_ms` (0 = the default) passes. A step outside the window waits
  // for the window to move there.
  void Acquire(uint64_t step, uint32_t rank, uint32_t timeout_ms, absl::Time now, Answer done,
               Callbacks* cbs);
  // The rank is done with the batch: its segment goes; waiters for it get
  // OUT_OF_RANGE.
  void Release(uint64_t step, uint32_t rank, Callbacks* cbs);
  // The first step in use ("" when none): "rank R holds step S" or "rank R
  // waits for step S".
  std::string InUse() const;
  // The window moved by itself to let waiting requests in: true once per
  // move, with the step it moved to (the caller restarts plan intake there).
  bool TakeMoved(uint64_t* step);

  // ---- plans
  bool HasPlan(uint64_t step) const {
    auto it = steps_.find(step);
    return it != steps_.end() && it->second.plan != nullptr;
  }
  // The plan of a step: each local rank's slot waits for its shards, or
  // fails with `bad` (a plan for another job) or for want of a RankPlan.
  // stage: the shards this node stages for it (pointers into *plan).
  void AddPlan(std::shared_ptr<const v1::StepPlan> plan, std::vector<const v1::ShardRef*> stage,
               const absl::Status& bad, absl::Time now);

  // ---- building (the scheduler)
  // Starts the batches of steps inside the window whose shards are staged or
  // failed (or that waited stage_wait), in step order, while they fit the
  // memory budget.
  void StartBuilds(absl::Time now, const ShardStateOf& shard_state, const MakeBatch& make,
                   Callbacks* cbs);
  // A batch finished building. False when its slot no longer wants it
  // (released or moved past meanwhile): the caller discards it.
  bool Ready(const std::shared_ptr<WindowBatch>& batch, absl::Time now, Callbacks* cbs);
  // Deadlines: leases that lapsed are ended (see Leases above), builds
  // overdue are expired, clients past their timeout get DEADLINE_EXCEEDED
  // saying what their batch waits for, slots without a plan that the packer
  // cannot serve fail. Updates the window gauges.
  void Tick(absl::Time now, const PlanIntake& intake, const ShardStateOf& shard_state,
            Callbacks* cbs);

  // ---- cache and reader upkeep
  // After a change: the shards plans in the window hold pinned (every
  // planned step's staged shards) and those of steps inside the window (kept
  // open for reading). False when nothing changed since the last call.
  bool TakeShardSets(std::set<std::string>* pinned, std::set<std::string>* open);

  // ---- shutdown
  // Every waiting client gets UNAVAILABLE.
  void FailWaiters(const absl::Status& status, Callbacks* cbs);
  // Discards every batch (their segments go).
  void Clear();

 private:
  enum class SlotState { kWaitPlan, kWaitShards, kBuilding, kReady, kFailed, kReleased };
  struct Waiter {
    absl::Time deadline;
    absl::Time since;
    Answer done;
  };
  struct Slot {
    SlotState state = SlotState::kWaitPlan;
    std::shared_ptr<WindowBatch> batch;
    absl::Status error;
    std::vector<Waiter> waiters;
    bool handed_out = false;  // a client got the batch (and holds it until it releases)
    absl::Time renewed;       // when it was handed out or its lease last renewed
  };
  struct Presence {       // a rank's current process, once it named an incarnation
    bool renews = false;  // it renews its leases: it is taken as gone when silent
    absl::Time heard;     // its last call
    bool gone = false;    // its lease lapsed and it has not called since
  };
  struct SeekWaiter {  // a request for a step outside the window, waiting for it to move
    uint64_t step;
    uint32_t rank;
    Waiter waiter;
  };
  struct Step {
    std::shared_ptr<const v1::StepPlan> plan;
    std::vector<const v1::ShardRef*> stage;  // shards this node stages for it (into *plan)
    absl::Time plan_at;
    std::map<uint32_t, Slot> slots;  // local rank -> slot
  };

  Step& StepAt(uint64_t step);
  void Free(Slot& slot);  // discards its batch and returns its memory
  void Finish(Slot& slot, absl::Time now, Callbacks* cbs);  // answers its waiters
  void Seek(uint64_t step, uint32_t rank);
  // Hands `done` the slot's batch now, or keeps it as a waiter.
  void AcquireSlot(uint64_t step, uint32_t rank, Waiter waiter, Callbacks* cbs);
  // Moves the window for a waiting request outside it where MoveFor can,
  // and hands those inside it their slots.
  void TrySeek(Callbacks* cbs);
  // The steps in use: held (handed out, not released) or waited for, by ranks
  // not taken as gone. A waiting request outside the window is not a use.
  struct Uses {
    bool any = false;
    uint64_t lo = 0, hi = 0;  // the first and the last, when any
  };
  Uses InUseSpan() const;
  static bool Used(const Slot& slot) {
    return !slot.waiters.empty() || (slot.handed_out && slot.state != SlotState::kReleased);
  }
  // Moves the window for `rank`'s request of `step` (outside it) so that it
  // starts at the earliest of `step` and the steps in use, when they all lie
  // within Span() of it: with nothing in use a Seek; else what is in use stays
  // and the window moves back (MoveBack) or on (MoveForward). False: too far apart.
  bool MoveFor(uint64_t step, uint32_t rank, const Uses& uses);
  // The window starts at `to`, before it: the ranks seen at the window's steps
  // give up their slots of the steps added (they ask for none of them).
  void MoveBack(uint64_t to, uint32_t rank);
  // The window starts at `to`, after it; the steps before it (none in use) go.
  void MoveForward(uint64_t to, uint32_t rank);
  // For messages: a use ("rank R holds step S"), the use farthest from
  // `step`, and what keeps the window's first step: each rank not done with it.
  static std::string UseOf(uint64_t step, uint32_t rank, const Slot& slot);
  std::string FarthestUse(uint64_t step) const;
  std::string BaseHeldBy() const;
  void Reclaim(uint32_t rank, Callbacks* cbs);
  // Answers every waiting call of the rank (its slots' and its seeks) with `status`.
  void AnswerWaiters(uint32_t rank, const absl::Status& status, Callbacks* cbs);
  static bool Held(const Slot& slot) { return slot.handed_out && slot.state == SlotState::kReady; }
  bool Renews(uint32_t rank) const;  // its current process renews its leases
  // Ends the leases that lapsed by `now`: ranks not heard from, holds not renewed.
  void ExpireLeases(absl::Time now, Callbacks* cbs);
  // A rank taken as gone: its waiting calls answered, its holds and ready batches freed.
  void GiveUp(uint32_t rank, absl::Time now, Callbacks* cbs);
  // Frees a hold whose lease lapsed (counted, logged).
  void EndLease(uint64_t step, uint32_t rank, Slot& slot, absl::Time now, const char* why);
  // Steps whose batches are handed out: base .. base + Span() - 1 (those
  // built are the first `window` of them).
  uint64_t Span() const { return 2 * uint64_t{opts_.window}; }
  bool InWindow(uint64_t step) const { return step >= base_ && step < base_ + Span(); }
  void SkipEarlier(uint64_t step, uint32_t rank);
  void Advance();  // moves base past released steps; marks the shard sets changed
  bool ShardsReady(const Step& s, absl::Time now, const ShardStateOf& shard_state) const;
  // Starts the batch of one slot: false when it must wait for memory.
  bool StartSlot(uint64_t step, Step& s, uint32_t rank, Slot& slot, const MakeBatch& make,
                 absl::Time now, Callbacks* cbs);
  std::string Pending(uint64_t step, const Slot& slot, const PlanIntake& intake,
                      const ShardStateOf& shard_state) const;
  void TimeOutWaiters(uint64_t step, uint32_t rank, Slot& slot, absl::Time now,
                      const PlanIntake& intake, const ShardStateOf& shard_state, Callbacks* cbs);

  const BatchWindowOptions opts_;
  const NodeRanks* ranks_;
  StagerMetrics* metrics_;
  uint64_t base_ = 0;    // first step of the window
  uint64_t memory_ = 0;  // bytes of live segments
  std::map<uint64_t, Step> steps_;
  bool shards_changed_ = false;
  std::vector<SeekWaiter> seeks_;
  bool moved_ = false;                                  // TrySeek moved the window
  std::map<uint32_t, uint64_t> incarnation_;  // rank -> its current process (for log lines)
  std::map<uint32_t, Presence> presence_;               // rank -> its current process's calls
  absl::Time clock_ = absl::InfinitePast();             // the latest time a call passed in
  absl::Time last_expire_ = absl::InfinitePast();       // the last ExpireLeases
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_WINDOW_BATCH_WINDOW_H_
