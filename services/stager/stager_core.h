// The stager's logic: takes the job description and step plans (from the
// packer, through whoever calls AddPlan), stages the shards the plans name
// in step order, builds a window of ready batches per local rank in shared
// memory, and answers clients' Acquire/Release. No network I/O.
//
// Threads: one scheduler thread (starting builds, deadlines, window
// movement); the staging and member-read IoService threads; the decode pool.
// Public methods are thread-safe.
#ifndef TUTTI_SERVICES_STAGER_STAGER_CORE_H_
#define TUTTI_SERVICES_STAGER_STAGER_CORE_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/uring_file.h"
#include "services/stager/batch_job.h"
#include "services/stager/cache.h"
#include "services/stager/metrics.h"
#include "services/stager/reader.h"
#include "services/stager/shm_names.h"
#include "services/stager/staging.h"
#include "services/stager/thread_pool.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::stager {

struct StagerOptions {
  uint32_t node = 0;                    // node index: local ranks are node*ranks_per_node + [0, ranks_per_node)
  bool node_auto = false;               // learn `node` from the first AcquireBatch (rank / ranks_per_node);
                                        // until then no plans are fetched and nothing is staged
  std::string cache_dir;                // node-local cache directory (NVMe)
  uint64_t cache_capacity_bytes = 0;    // 0 = unlimited
  StagingOptions staging;               // source_dir, queue depth, block size, O_DIRECT, ...
  unsigned decode_threads = 0;          // 0 = one per core
  uint32_t window = 4;                  // steps of batches built ahead, per local rank
  uint32_t stage_ahead = 16;            // steps beyond the window whose shards are staged early
  uint64_t memory_budget_bytes = 8ull << 30;  // shared memory held by batches
  uint32_t sample_deadline_ms = 0;      // 0 = the job's sample_deadline_ms
  std::string skip_policy;              // "", "drop" or "substitute" ("" = the job's)
  uint32_t stage_wait_ms = 0;           // how long a batch waits for its shards to be staged
                                        // before reading them from the source (0 = sample deadline)
  uint32_t default_acquire_timeout_ms = 120000;  // AcquireBatch with timeout_ms 0
  bool use_io_uring = true;             // member reads through io_uring (else threads)
  unsigned read_queue_depth = 128;      // member reads in flight
};

class StagerCore {
 public:
  using AcquireDone = std::function<void(absl::StatusOr<v1::BatchDescriptor>)>;

  // Backends: null = built from the options; tests inject fault doubles.
  StagerCore(StagerOptions options, std::shared_ptr<StagerMetrics> metrics,
             std::unique_ptr<IoBackend> staging_backend = nullptr,
             std::unique_ptr<IoBackend> read_backend = nullptr);
  ~StagerCore();

  // Validates the job, opens the cache (removing partial files), starts
  // staging, the decode pool and the scheduler.
  absl::Status Start(const v1::JobInfo& job);
  void Stop();  // fails waiters with UNAVAILABLE, unlinks every segment

  const v1::JobInfo& job() const { return job_; }
  // This node's ranks (empty-handed callers wait in WaitPlanWanted until the
  // node is known under node_auto).
  std::vector<uint32_t> local_ranks() const;
  uint32_t window() const { return opts_.window; }

  // ---- plan intake (one caller thread)
  // The range of steps whose plans are wanted next, [step, end), and the
  // stream generation. Blocks (until `deadline`, then `blocked`) while the
  // core holds every plan it has room for: plans are held for the window and
  // stage_ahead steps beyond it, so `end` is base + window + stage_ahead
  // (capped at the job's end), and room appears as clients release batches.
  // The caller asks the packer for exactly that range. A seek bumps the
  // generation: the caller then restarts its stream at the new step.
  struct PlanWant {
    uint64_t step = 0;
    uint64_t end = 0;      // exclusive; > step unless blocked
    uint64_t generation = 0;
    bool stop = false;
    bool blocked = false;  // nothing to ask for now (no room, dataset end or a packer error)
  };
  PlanWant WaitPlanWanted(absl::Time deadline);
  // Adds the next plan. ABORTED when the generation moved on (restart the
  // stream); INVALID_ARGUMENT / FAILED_PRECONDITION for a plan that does not
  // fit (recorded for that step).
  absl::Status AddPlan(v1::StepPlan plan, uint64_t generation);
  // The packer cannot serve `step` (and what follows): clients asking for it
  // get this status with context.
  void PlanFailed(uint64_t step, const absl::Status& status, uint64_t generation);

  // ---- clients
  void AcquireAsync(uint64_t step, uint32_t rank, uint32_t timeout_ms, AcquireDone done);
  absl::StatusOr<v1::BatchDescriptor> Acquire(uint64_t step, uint32_t rank, uint32_t timeout_ms);
  absl::Status Release(uint64_t step, uint32_t rank);

  // ---- staging RPCs
  v1::StageResponse Stage(const v1::StageRequest& request);
  v1::StageStatus GetStageStatus() const;

  StagingEngine* staging() { return staging_.get(); }
  ShardCache* cache() { return cache_.get(); }

 private:
  enum class SlotState { kWaitPlan, kWaitShards, kBuilding, kReady, kFailed, kReleased };
  struct Waiter {
    absl::Time deadline;
    absl::Time since;
    AcquireDone done;
  };
  struct Slot {
    SlotState state = SlotState::kWaitPlan;
    std::shared_ptr<BatchJob> job;
    absl::Status error;
    std::vector<Waiter> waiters;
    bool handed_out = false;  // a client got the batch (and holds it until it releases)
  };
  struct Step {
    std::shared_ptr<const v1::StepPlan> plan;
    std::vector<const v1::ShardRef*> stage;  // shards this node stages for it (into *plan)
    absl::Time plan_at;
    std::map<uint32_t, Slot> slots;  // local rank -> slot
  };
  using Callbacks = std::vector<std::function<void()>>;

  void Loop();
  void Tick(std::unique_lock<std::mutex>& l, Callbacks* cbs);
  void StartBuilds(std::unique_lock<std::mutex>& l, Callbacks* cbs);
  void OnJobReady(const std::shared_ptr<BatchJob>& job);
  void FinishSlot(Slot& slot, Callbacks* cbs);
  void UpdateWindow();
  absl::Status CheckAcquire(uint64_t step, uint32_t rank);
  Step& StepAt(uint64_t step);
  std::string ShmName(uint64_t step, uint32_t rank) const;
  std::string Pending(uint64_t step, uint32_t rank, const Slot& slot) const;
  bool IsLocal(uint32_t rank) const;
  std::vector<uint32_t> LocalRanksLocked() const;
  absl::Status LearnNode(uint32_t rank);
  // What keeps the window where it is ("" when nothing): a held batch or a waiting client.
  std::string InUse() const;
  void Seek(uint64_t step, uint32_t rank);  // moves the window to `step`
  // Gives up `rank`'s steps before `step` that it never took (ranks ask in
  // step order), so the window can move past them.
  void SkipEarlier(uint64_t step, uint32_t rank);
  // One past the last step whose plan the core has room for.
  uint64_t PlanLimit() const;

  StagerOptions opts_;
  std::shared_ptr<StagerMetrics> metrics_;
  std::unique_ptr<IoBackend> staging_backend_;
  std::unique_ptr<IoBackend> read_backend_;
  v1::JobInfo job_;
  v1::JobConfig config_;
  uint32_t ranks_ = 1;                    // ranks per node; set by Start
  uint32_t first_rank_ = 0;               // guarded by mu_ (fixed once the node is known)
  bool node_known_ = false;               // guarded by mu_
  uint32_t learned_from_ = 0;             // guarded by mu_: the rank that fixed the node (auto)
  absl::Duration deadline_ = absl::Seconds(2);
  absl::Duration stage_wait_;
  std::optional<SegmentNames> names_;    // set by Start
  std::unique_ptr<ShardCache> cache_;
  std::unique_ptr<StagingEngine> staging_;
  std::unique_ptr<IoService> read_io_;
  std::unique_ptr<MemberReader> reader_;
  std::unique_ptr<ThreadPool> pool_;
  SubstitutePool substitutes_;
  BuildContext ctx_;

  mutable std::mutex mu_;
  std::condition_variable cv_;            // scheduler and plan intake wake-ups
  bool started_ = false, stopping_ = false;  // guarded by mu_
  uint64_t base_ = 0;                     // guarded by mu_: first step of the window
  uint64_t next_plan_ = 0;                // guarded by mu_: next step wanted from the packer
  uint64_t generation_ = 0;               // guarded by mu_
  std::map<uint64_t, Step> steps_;        // guarded by mu_
  std::optional<std::pair<uint64_t, absl::Status>> plan_error_;  // guarded by mu_
  uint64_t memory_ = 0;                   // guarded by mu_: bytes of live segments

  std::mutex done_mu_;
  std::vector<std::shared_ptr<BatchJob>> done_jobs_;  // guarded by done_mu_

  std::thread scheduler_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGER_CORE_H_
