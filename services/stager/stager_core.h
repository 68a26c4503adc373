// The stager's logic, composed of its parts: plan intake (plan_intake.h:
// which plans to ask the packer for), the batch window (batch_window.h: one
// slot per step and local rank, the memory budget, client answers), staging
// (staging.h, cache.h, reader.h: shards into the node-local cache, member
// reads) and decode (batch_job.h, batch_layout.h, decode.h: one batch built
// into its shared-memory segment). It takes the job and step plans (from
// the packer, through whoever calls AddPlan) and answers clients'
// Acquire/Release. No network I/O.
//
// Threads: one scheduler thread (starting builds, deadlines, window upkeep);
// the staging and member-read IoService threads; the decode pool. Public
// methods are thread-safe; Start and Stop are called by one owner.
#ifndef TUTTI_SERVICES_STAGER_STAGER_CORE_H_
#define TUTTI_SERVICES_STAGER_STAGER_CORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/uring_file.h"
#include "services/stager/decode/batch_job.h"
#include "services/stager/decode/shm_names.h"
#include "services/stager/decode/thread_pool.h"
#include "services/stager/member_peers.h"
#include "services/stager/metrics.h"
#include "services/stager/plan_intake.h"
#include "services/stager/staging/cache.h"
#include "services/stager/staging/reader.h"
#include "services/stager/staging/staging.h"
#include "services/stager/window/batch_window.h"
#include "services/stager/window/node_ranks.h"
#include "services/stager/window/rank_processes.h"
#include "tutti/v1/packer.pb.h"
#include "tutti/v1/stager.pb.h"

namespace tutti::stager {

// The longest wait a ReleaseBatch may report (about 11.6 days, as the
// packer's bound on a reported phase).
inline constexpr double kMaxWaitSeconds = 1e6;

struct StagerOptions {
  uint32_t node = 0;                    // node index: local ranks are node*ranks_per_node + [0, ranks_per_node)
  bool node_auto = false;               // learn `node` from the first rank that registers or
                                        // asks for a batch (rank / ranks_per_node);
                                        // until then no plans are fetched and nothing is staged
  std::string cache_dir;                // node-local cache directory (NVMe)
  uint64_t cache_capacity_bytes = 0;    // 0 = unlimited
  StagingOptions staging;               // source_dir, queue depth, block size, O_DIRECT, ...
  unsigned decode_threads = 0;          // 0 = one per CPU this process may use (UsableCpus)
  uint32_t window = 4;                  // steps of batches built ahead, per local rank
  uint32_t stage_ahead = 16;            // steps beyond the window whose shards are staged early
  uint64_t memory_budget_bytes = 8ull << 30;  // shared memory held by batches
  uint32_t sample_deadline_ms = 0;      // 0 = the job's sample_deadline_ms
  std::string skip_policy;              // "", "drop" or "substitute" ("" = the job's)
  uint32_t stage_wait_ms = 0;           // how long a batch waits for its shards to be staged
                                        // before reading them from the source (0 = sample deadline)
  uint32_t default_acquire_timeout_ms = 120000;  // AcquireBatch with timeout_ms 0
  // The longest AcquireBatch wait a client may ask for (timeout_ms above it
  // is refused; --max_acquire_timeout_ms): a waiter holds a call and a
  // window slot until it is answered.
  uint32_t max_acquire_timeout_ms = 3600000;
  absl::Duration lease = absl::Seconds(60);  // --lease_seconds: a renewing client's holds,
                                        // and its rank, last this long without a call
                                        // (BatchWindowOptions.lease)
  int share_gid = -1;                   // group that may map the batch segments (0640) and, in
                                        // the server, connect to the Unix socket (0660);
                                        // -1 = the daemon's own
  IoBackendChoice io_backend = IoBackendChoice::kAuto;  // staging and member reads: io_uring,
                                        // pread threads, or io_uring unless refused (auto);
                                        // decides staging.use_io_uring at Start
  unsigned read_queue_depth = 128;      // member reads in flight, from the cache and from
                                        // the source each (their own I/O services)
  // Member reads of one shard at the source in flight, stuck ones included
  // (IoServiceOptions::per_file_limit): a shard whose source stops
  // answering holds at most this many source-read workers, and once they
  // are all stuck its members are skipped at once (reason deadline) until
  // one returns. With staging.file_queue_depth, keep it under a FUSE
  // mount's background limit (12 by default).
  unsigned source_file_reads = 4;
  // How long the holder's stager has to send a remote_load member
  // (--peer_timeout_ms) before it is read from the source; within the sample
  // deadline. 0 = half of what is left of the sample deadline when the read
  // starts.
  uint32_t peer_timeout_ms = 0;
};

class StagerCore {
 public:
  using AcquireDone = std::function<void(absl::StatusOr<v1::BatchDescriptor>)>;

  // Backends: null = built from the options; tests inject fault doubles
  // (read_backend: member reads from the source).
  StagerCore(StagerOptions options, std::shared_ptr<StagerMetrics> metrics,
             std::unique_ptr<IoBackend> staging_backend = nullptr,
             std::unique_ptr<IoBackend> read_backend = nullptr);
  ~StagerCore();

  // The stagers of other nodes that remote_load members are asked of first
  // (member_peers.h); call before Start. Without: always the source. Stop()
  // destroys them first, so their calls end before the reads they fall back to.
  void SetPeers(std::unique_ptr<MemberPeers> peers) { peers_ = std::move(peers); }

  // Validates the job, opens the cache (removing partial files), starts
  // staging, the decode pool and the scheduler.
  absl::Status Start(const v1::JobInfo& job);
  // Fails waiters with UNAVAILABLE, stops every thread, unlinks every segment.
  void Stop();

  // OK while the scheduler runs (it ticks every 20 ms or sooner); for /healthz.
  absl::Status Live() const;

  // Set by Start.
  const v1::JobInfo& job() const { return job_; }
  // This node's ranks (empty until the node is known under node_auto).
  std::vector<uint32_t> local_ranks() const;
  uint32_t window() const { return opts_.window; }

  // ---- plan intake (one caller thread)
  // The range of steps whose plans are wanted next, [step, end), and the
  // stream generation. Blocks (until `deadline`, then `blocked`) while the
  // core holds every plan it has room for (see plan_intake.h) or the node is
  // not known yet. The caller asks the packer for exactly that range. A seek
  // bumps the generation: the caller then restarts its stream at the new step.
  struct PlanWant {
    uint64_t step = 0;
    uint64_t end = 0;      // exclusive; > step unless blocked
    uint64_t generation = 0;
    bool stop = false;
    bool blocked = false;  // nothing to ask for now (no room, dataset end or a packer error)
  };
  PlanWant WaitPlanWanted(absl::Time deadline);
  // Adds the next plan. ABORTED when the generation moved on (restart the
  // stream); CANCELLED when stopping; FAILED_PRECONDITION for a plan of
  // another config (recorded for that step).
  absl::Status AddPlan(v1::StepPlan plan, uint64_t generation);
  // The packer cannot serve `step` (and what follows): clients asking for it
  // get this status with context.
  void PlanFailed(uint64_t step, const absl::Status& status, uint64_t generation);

  // ---- clients
  // A new process for `rank` (RegisterRank): the incarnation and key issued
  // to it (rank_processes.h); what the rank's earlier process, or calls
  // naming none, held or waited for is reclaimed (BatchWindow::NewProcess).
  // Learns the node under node_auto. INVALID_ARGUMENT for a rank of another
  // node; UNAVAILABLE while starting or stopping.
  absl::StatusOr<ProcessKey> RegisterRank(uint32_t rank);
  // OK when a call naming `caller` may act for `rank` (RankProcesses::Check);
  // every call below checks the same, before it changes anything.
  absl::Status CheckCaller(uint32_t rank, const ProcessKey& caller) const;
  // caller: the process the call names (as RegisterRank issued it; none: a
  // client that registers no process, only while none registered for the rank).
  // renews_leases: the client renews the leases of what it holds (RenewLeases).
  // waited: how long the rank waited for this batch, as it measured it: a
  // finite number of seconds in [0, kMaxWaitSeconds], else the release is
  // INVALID_ARGUMENT and changes nothing.
  // timeout_ms above max_acquire_timeout_ms is INVALID_ARGUMENT
  // (CheckAcquireTimeout), answered at once.
  void AcquireAsync(uint64_t step, uint32_t rank, uint32_t timeout_ms, AcquireDone done,
                    const ProcessKey& caller = {}, bool renews_leases = false);
  absl::StatusOr<v1::BatchDescriptor> Acquire(uint64_t step, uint32_t rank, uint32_t timeout_ms,
                                              const ProcessKey& caller = {},
                                              bool renews_leases = false);
  absl::Status Release(uint64_t step, uint32_t rank, const ProcessKey& caller = {},
                       std::optional<double> waited = std::nullopt);
  // The rank's process `caller` (named: incarnation non-zero) still holds
  // the batches of `steps`: their leases start again. Returns the steps named
  // that it does not hold (see BatchWindow::Renew). INVALID_ARGUMENT for
  // incarnation 0 or a rank of another node; else as CheckCaller.
  absl::StatusOr<std::vector<uint64_t>> RenewLeases(uint32_t rank, const ProcessKey& caller,
                                                    const std::vector<uint64_t>& steps);
  absl::Duration lease() const { return opts_.lease; }
  // INVALID_ARGUMENT naming the field and the limit when an AcquireBatch
  // asks to wait longer than max_acquire_timeout_ms.
  absl::Status CheckAcquireTimeout(uint32_t timeout_ms) const;

  // ---- staging status
  // Whether Start() succeeded: before it (the daemon waits for its job from
  // the packer) there is no cache or staging to report on.
  bool Started() const;
  // Empty before Start().
  v1::StageStatus GetStageStatus() const;

  // ---- peers
  // Reads one member for another node's stager (FetchMembers): from this
  // node's cache when the shard is staged here, else from the source, each
  // read bounded as the stager's own (path refusals, the source's per-file
  // bound), with `deadline`. A shard not staged here (this node restarted,
  // or the asking node's plans ran ahead of its own) is asked of staging
  // first, after this node's own ranks' shards; a failed one is asked again
  // (staging's retry wait holds). While the shard is queued or being copied
  // the read waits for the copy, for at most half the time left to
  // `deadline` (a copy that makes no progress for the stage wait is not
  // waited for), and is then served from the cache, else from the source:
  // either way the source is read for the member at most once. UNAVAILABLE
  // (to `done`) before Start and once stopping, also for reads waiting then.
  void ReadMemberForPeer(const v1::ShardRef& shard, const v1::MemberRef& member,
                         absl::Time deadline, MemberReader::Done done);
  // The sample deadline in force (set by Start).
  absl::Duration sample_deadline() const { return ctx_.deadline; }

  StagingEngine* staging() { return staging_.get(); }
  ShardCache* cache() { return cache_.get(); }

 private:
  using Callbacks = BatchWindow::Callbacks;

  absl::Status StartParts(const v1::JobInfo& job);
  absl::Status StartReader();
  void Loop();
  void Tick(Callbacks* cbs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The I/O services' timeouts and stalled operations into the metrics.
  void PublishIo() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<WindowBatch>> MakeBatch(
      const std::shared_ptr<const v1::StepPlan>& plan, int rank_index);
  void OnBatchReady(const std::shared_ptr<BatchJob>& job);
  // Checks a client's request and moves the window (and intake) if it must.
  absl::Status Admit(uint64_t step, uint32_t rank, const ProcessKey& caller, bool renews_leases)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Learns the node from `rank` under node_auto, then checks it is local.
  absl::Status LocalRank(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restarts plan intake where the window moved by itself, if it did.
  void FollowWindow() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the window's shard sets to the cache (pinned) and the reader (open).
  void ApplyShardSets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PlanBlocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A member another node's stager asked for (ReadMemberForPeer), waiting
  // until `read_by` for its shard's copy into the cache.
  struct PeerRead {
    v1::ShardRef shard;
    v1::MemberRef member;
    absl::Time deadline, read_by;
    MemberReader::Done done;
  };
  void ReadForPeer(PeerRead read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads the waiting members whose copy ended, stalls or took too long.
  void ServeWaitingPeers(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ShardState ShardStateOf(const std::string& shard) const;

  // Fixed at construction, or set by Start before any thread runs.
  StagerOptions opts_;
  std::shared_ptr<StagerMetrics> metrics_;
  std::unique_ptr<IoBackend> staging_backend_;
  std::unique_ptr<IoBackend> read_backend_;
  v1::JobInfo job_;
  v1::JobConfig config_;
  std::optional<SegmentNames> names_;
  std::unique_ptr<ShardCache> cache_;
  std::unique_ptr<StagingEngine> staging_;
  std::unique_ptr<IoService> cache_io_;   // member reads from the cache
  std::unique_ptr<IoService> source_io_;  // member reads from the source
  std::unique_ptr<MemberReader> reader_;
  std::unique_ptr<MemberPeers> peers_;
  LogRateLimit skip_log_{absl::Seconds(10), 10};  // BuildContext::skip_log
  std::unique_ptr<ThreadPool> pool_;
  BuildContext ctx_;
  absl::Duration stage_wait_;  // BatchWindowOptions::stage_wait

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // scheduler and plan intake wake-ups
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<NodeRanks> ranks_ ABSL_GUARDED_BY(mu_);
  std::optional<PlanIntake> intake_ ABSL_GUARDED_BY(mu_);
  std::optional<BatchWindow> window_ ABSL_GUARDED_BY(mu_);
  // What PublishIo last saw of each I/O service (kIoPaths order).
  IoServiceStats published_io_[3] ABSL_GUARDED_BY(mu_);
  RankProcesses processes_ ABSL_GUARDED_BY(mu_);
  std::vector<PeerRead> peer_waits_ ABSL_GUARDED_BY(mu_);

  // Batches built, handed from the decode/read threads to the scheduler.
  absl::Mutex done_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::shared_ptr<BatchJob>> done_jobs_ ABSL_GUARDED_BY(done_mu_);

  std::atomic<int64_t> last_tick_ns_{0};  // when the scheduler last ran (absl::GetCurrentTimeNanos)
  std::thread scheduler_;
};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_STAGER_CORE_H_
