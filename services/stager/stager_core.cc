#include "services/stager/stager_core.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/cpu_count.h"
#include "common/file_io.h"
#include "common/job_config.h"
#include "common/log.h"
#include "common/status.h"

namespace tutti::stager {
namespace {

const Logger kLog("stager.core");

// Probes up to 32 of the job's shards, spread over the index, in the source
// directory. None there: the wrong directory or an unmounted NFS path, refused
// now rather than failing every sample later. Some missing: a warning (their
// samples are skipped as `missing`, by the sample policy).
absl::Status CheckSourceHoldsShards(const RootDir& root, const v1::JobInfo& job) {
  const std::string& source = root.path();
  const int n = job.shards_size();
  if (n == 0) return absl::OkStatus();
  const int probes = std::min(n, 32);
  int missing = 0;
  std::string first;
  for (int i = 0; i < probes; ++i) {
    const std::string& name = job.shards(static_cast<int>(int64_t{i} * n / probes));
    absl::StatusOr<std::string> path = JoinUnder(source, name);
    // Opened as the reads will open it: a shard whose name leads outside
    // --source counts as missing here (and is refused, by name, when read).
    const int fd = path.ok() ? root.Open(name.c_str(), O_RDONLY | O_NONBLOCK) : -EINVAL;
    struct stat st;
    const bool regular = fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (fd >= 0) ::close(fd);
    if (!regular) {
      if (missing++ == 0) first = name;
    }
  }
  if (missing == probes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--source ", source, " holds none of the job's shards (", probes, " of ", n,
        " checked, e.g. '", first, "'): pass the directory the packer's index was built from, "
        "and check that it is mounted on this node"));
  }
  if (missing > 0) {
    kLog.Warning(absl::StrCat(missing, " of ", probes, " shards checked are missing from --source ",
                              source, " (e.g. '", first,
                              "'); their samples will be skipped as 'missing'"),
                 {{"missing", missing}, {"checked", probes}, {"source", source}});
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::SkipPolicy> SkipPolicyOf(const std::string& name, v1::SkipPolicy job) {
  if (name.empty()) return job;
  if (name == "drop") return v1::SKIP_POLICY_DROP;
  if (name == "substitute") return v1::SKIP_POLICY_SUBSTITUTE;
  return absl::InvalidArgumentError(
      absl::StrCat("skip policy '", name, "' is unknown; use 'drop' or 'substitute'"));
}

}  // namespace

StagerCore::StagerCore(StagerOptions options, std::shared_ptr<StagerMetrics> metrics,
                       std::unique_ptr<IoBackend> staging_backend,
                       std::unique_ptr<IoBackend> read_backend)
    : opts_(std::move(options)), metrics_(std::move(metrics)),
      staging_backend_(std::move(staging_backend)), read_backend_(std::move(read_backend)) {}

StagerCore::~StagerCore() { Stop(); }

std::vector<uint32_t> StagerCore::local_ranks() const {
  absl::MutexLock l(&mu_);
  return ranks_ ? ranks_->ranks() : std::vector<uint32_t>{};
}

ShardState StagerCore::ShardStateOf(const std::string& shard) const {
  return staging_->Status(shard).state;
}

// ------------------------------------------------------------ start and stop
absl::Status StagerCore::Start(const v1::JobInfo& job) {
  job_ = job;
  config_ = job.config();
  ApplyJobDefaults(&config_);
  RETURN_IF_ERROR(Annotate(ValidateJobConfig(config_), "the packer's job config is not usable"));
  ASSIGN_OR_RETURN(NodeRanks ranks,
                   NodeRanks::Make(opts_.node_auto ? std::nullopt : std::optional(opts_.node),
                                   config_.ranks_per_node(), config_.world_size()));
  const absl::Duration deadline = absl::Milliseconds(
      opts_.sample_deadline_ms ? opts_.sample_deadline_ms : config_.sample_deadline_ms());
  ASSIGN_OR_RETURN(v1::SkipPolicy policy, SkipPolicyOf(opts_.skip_policy, config_.skip_policy()));
  if (opts_.window == 0) return absl::InvalidArgumentError("--window must be at least 1");
  if (opts_.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--lease_seconds must be at least 1");
  }
  if (opts_.cache_dir.empty()) return absl::InvalidArgumentError("--cache is required");
  if (!staging_backend_ || !read_backend_) {
    ASSIGN_OR_RETURN(const bool uring, ResolveIoBackend(opts_.io_backend));
    opts_.staging.use_io_uring = uring;
  }
  RETURN_IF_ERROR(StartParts(job));
  ctx_.reader = reader_.get();
  ctx_.pool = pool_.get();
  ctx_.metrics = metrics_.get();
  ctx_.params = PatchifyParams::FromConfig(config_.vision());
  ctx_.config = &config_;
  ctx_.policy = policy;
  ctx_.deadline = deadline;
  ctx_.peers = peers_.get();
  ctx_.skip_log = &skip_log_;
  ctx_.peer_timeout = absl::Milliseconds(opts_.peer_timeout_ms);
  ctx_.segment_access.gid = opts_.share_gid;
  BatchWindowOptions wo;
  wo.window = opts_.window;
  wo.memory_budget_bytes = opts_.memory_budget_bytes;
  wo.stage_wait = opts_.stage_wait_ms ? absl::Milliseconds(opts_.stage_wait_ms) : deadline;
  stage_wait_ = wo.stage_wait;
  wo.default_acquire_timeout_ms =
      std::min(opts_.default_acquire_timeout_ms, opts_.max_acquire_timeout_ms);
  wo.total_steps = job.total_steps();
  wo.lease = opts_.lease;
  wo.job_id = config_.job_id();
  {
    absl::MutexLock l(&mu_);
    ranks_.emplace(std::move(ranks));
    intake_.emplace(uint64_t{opts_.window} + opts_.stage_ahead, job.total_steps(),
                    job.config_fingerprint());
    window_.emplace(wo, &*ranks_, metrics_.get());
    started_ = true;
  }
  scheduler_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

// The cache, the segment names, staging, the member reader and the decode pool.
absl::Status StagerCore::StartParts(const v1::JobInfo& job) {
  cache_ = std::make_unique<ShardCache>(opts_.cache_dir, opts_.cache_capacity_bytes,
                                        opts_.staging.resolve);
  RETURN_IF_ERROR(cache_->Open());
  // The cache lock is held: the previous daemon of this directory is gone.
  ASSIGN_OR_RETURN(SegmentNames names, SegmentNames::Claim(opts_.cache_dir, config_.job_id()));
  names_ = std::move(names);
  if (metrics_) {
    metrics_->cache_capacity.Set(static_cast<double>(opts_.cache_capacity_bytes));
    metrics_->cache_bytes.Set(static_cast<double>(cache_->cached_bytes()));
    StagerMetrics* m = metrics_.get();
    cache_->SetEvictionListener([m](const std::string&, uint64_t) { m->cache_evictions.Increment(); });
  }
  staging_ = std::make_unique<StagingEngine>(opts_.staging, cache_.get(), metrics_.get(),
                                             std::move(staging_backend_));
  RETURN_IF_ERROR(staging_->Start());
  RETURN_IF_ERROR(CheckSourceHoldsShards(staging_->source_root(), job));
  staging_->SetListener([this](const std::string&, ShardState) { cv_.SignalAll(); });
  RETURN_IF_ERROR(StartReader());
  const unsigned threads = opts_.decode_threads ? opts_.decode_threads : UsableCpus();
  kLog.Info("decode pool", {{"threads", threads},
                            {"from", opts_.decode_threads ? "--decode_threads"
                                                          : "the CPUs this process may use"}});
  pool_ = std::make_unique<ThreadPool>(threads);
  return absl::OkStatus();
}

absl::Status StagerCore::StartReader() {
  // Cache and source reads on services of their own (each io_uring ring is
  // served by its own thread, whose io_uring workers are its own): a stalled
  // source never holds up a read from the cache.
  auto make = [&](const char* what) -> absl::StatusOr<std::unique_ptr<IoBackend>> {
    if (!opts_.staging.use_io_uring) return MakePreadBackend(16);
    // Twice the depth in workers: room for reads stuck on a stalled file,
    // which no longer count against the depth.
    auto b = MakeUringBackend(opts_.read_queue_depth, 2 * opts_.read_queue_depth);
    if (!b.ok()) return Annotate(b.status(), absl::StrCat("cannot set up io_uring for ", what));
    return std::move(*b);
  };
  std::unique_ptr<IoBackend> source = std::move(read_backend_);
  if (!source) {
    ASSIGN_OR_RETURN(source, make("member reads from the source"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<IoBackend> cache, make("member reads from the cache"));
  if (opts_.source_file_reads == 0) {
    return absl::InvalidArgumentError("source reads of one shard in flight must be at least 1");
  }
  IoServiceOptions source_options;
  source_options.per_file_limit = opts_.source_file_reads;
  source_io_ = std::make_unique<IoService>(std::move(source), source_options);
  cache_io_ = std::make_unique<IoService>(std::move(cache));
  reader_ = std::make_unique<MemberReader>(&staging_->source_root(), cache_.get(), staging_.get(),
                                           cache_io_.get(), source_io_.get(), metrics_.get());
  return absl::OkStatus();
}

void StagerCore::Stop() {
  Callbacks cbs;
  {
    absl::MutexLock l(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    window_->FailWaiters(
        absl::UnavailableError("tutti-stagerd is shutting down; retry against the restarted daemon"),
        &cbs);
    for (PeerRead& read : peer_waits_) {
      cbs.push_back([done = std::move(read.done)] {
        done(absl::UnavailableError(
                 "tutti-stagerd is shutting down: it serves no members now; read the source"),
             false);
      });
    }
    peer_waits_.clear();
  }
  cv_.SignalAll();
  for (auto& cb : cbs) cb();
  if (scheduler_.joinable()) scheduler_.join();
  // Ends the calls to other stagers (their callbacks fall back to reads,
  // which the services below then end).
  peers_.reset();
  // Ends reads (callbacks may still queue decodes); a read stuck in the
  // kernel is not waited for.
  source_io_.reset();
  cache_io_.reset();
  pool_.reset();     // finishes running decodes, drops queued ones
  {
    absl::MutexLock l(&mu_);
    window_->Clear();
  }
  {
    absl::MutexLock l(&done_mu_);
    for (auto& j : done_jobs_) j->Discard();
    done_jobs_.clear();
  }
  reader_.reset();
  if (staging_) staging_->Stop();
}

// ------------------------------------------------------------ plan intake
bool StagerCore::PlanBlocked() const {
  return !ranks_->known() || intake_->Blocked(window_->base());
}

StagerCore::PlanWant StagerCore::WaitPlanWanted(absl::Time deadline) {
  absl::MutexLock l(&mu_);
  while (!stopping_ && (!started_ || PlanBlocked())) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  if (!started_) return PlanWant{0, 0, 0, stopping_, true};
  return PlanWant{intake_->next(), intake_->Limit(window_->base()), intake_->generation(),
                  stopping_, PlanBlocked()};
}

absl::Status StagerCore::AddPlan(v1::StepPlan plan, uint64_t generation) {
  absl::Status bad;
  {
    absl::MutexLock l(&mu_);
    if (!started_) return absl::FailedPreconditionError("plans arrive only after Start");
    const uint64_t step = plan.step();
    // A caller that asks for WaitPlanWanted's range never waits here.
    while (!stopping_ && generation == intake_->generation() &&
           step >= window_->base() + opts_.window + opts_.stage_ahead) {
      cv_.Wait(&mu_);
    }
    if (stopping_) return absl::CancelledError("stopping");
    switch (intake_->Classify(step, generation, window_->base())) {
      case PlanIntake::Verdict::kStale:
        return absl::AbortedError("the window moved; restart the plan stream");
      case PlanIntake::Verdict::kHaveIt:
        return absl::OkStatus();
      case PlanIntake::Verdict::kTake:
        break;
    }
    if (metrics_) metrics_->plans_received.Increment();
    bad = intake_->Take(plan);
    // Sent again after the window moved back: the plan of a step is the same
    // every time (seed, step), and the one held is kept.
    if (bad.ok() && window_->HasPlan(step)) return absl::OkStatus();
    auto shared = std::make_shared<const v1::StepPlan>(std::move(plan));
    std::vector<const v1::ShardRef*> stage = ShardsToStage(*shared);
    if (bad.ok()) {
      for (const v1::ShardRef* ref : stage) staging_->Request(*ref, step);
    }
    window_->AddPlan(std::move(shared), std::move(stage), bad, absl::Now());
    ApplyShardSets();
  }
  cv_.SignalAll();
  return bad;
}

void StagerCore::PlanFailed(uint64_t step, const absl::Status& status, uint64_t generation) {
  {
    absl::MutexLock l(&mu_);
    if (!intake_) return;
    intake_->Failed(step, status, generation);
  }
  cv_.SignalAll();
}

// ------------------------------------------------------------ clients
absl::Status StagerCore::LocalRank(uint32_t rank) {
  if (!started_ || stopping_) {
    return absl::UnavailableError("tutti-stagerd is starting or stopping; retry");
  }
  if (!ranks_->known()) {
    RETURN_IF_ERROR(ranks_->Learn(rank));
    cv_.SignalAll();  // plan intake can start
  }
  return ranks_->CheckLocal(rank);
}

absl::Status StagerCore::Admit(uint64_t step, uint32_t rank, const ProcessKey& caller,
                               bool renews_leases) {
  RETURN_IF_ERROR(LocalRank(rank));
  RETURN_IF_ERROR(processes_.Check(rank, caller));
  window_->Heard(rank, caller.incarnation, absl::Now(), renews_leases);
  bool moved = false;
  RETURN_IF_ERROR(window_->Admit(step, rank, &moved));
  if (moved) intake_->Restart(window_->base());
  return intake_->ErrorFor(step);
}

absl::StatusOr<ProcessKey> StagerCore::RegisterRank(uint32_t rank) {
  Callbacks cbs;
  ProcessKey issued;
  {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(LocalRank(rank));
    uint64_t replaced = 0;
    issued = processes_.Register(rank, &replaced);
    kLog.Info("a process registered for the rank", {{"job", config_.job_id()},
                                                    {"rank", rank},
                                                    {"incarnation", absl::Hex(issued.incarnation)},
                                                    {"replaces", absl::Hex(replaced)}});
    window_->NewProcess(rank, issued.incarnation, &cbs);
    FollowWindow();
    ApplyShardSets();
  }
  cv_.SignalAll();
  for (auto& cb : cbs) cb();
  return issued;
}

absl::Status StagerCore::CheckCaller(uint32_t rank, const ProcessKey& caller) const {
  absl::MutexLock l(&mu_);
  return processes_.Check(rank, caller);
}

void StagerCore::FollowWindow() {
  if (uint64_t to = 0; window_->TakeMoved(&to)) intake_->Restart(to);
}

absl::Status StagerCore::CheckAcquireTimeout(uint32_t timeout_ms) const {
  if (timeout_ms <= opts_.max_acquire_timeout_ms) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "AcquireBatchRequest.timeout_ms ", timeout_ms, " is over the limit ",
      opts_.max_acquire_timeout_ms, " (tutti-stagerd --max_acquire_timeout_ms); ask for at most ",
      opts_.max_acquire_timeout_ms, " ms (0: the server's default) and call again if needed"));
}

void StagerCore::AcquireAsync(uint64_t step, uint32_t rank, uint32_t timeout_ms, AcquireDone done,
                              const ProcessKey& caller, bool renews_leases) {
  if (absl::Status s = CheckAcquireTimeout(timeout_ms); !s.ok()) return done(s);
  Callbacks cbs;
  {
    absl::MutexLock l(&mu_);
    absl::Status s = Admit(step, rank, caller, renews_leases);
    if (!s.ok()) {
      cbs.push_back([d = std::move(done), s] { d(s); });
    } else {
      window_->Acquire(step, rank, timeout_ms, absl::Now(), std::move(done), &cbs);
      FollowWindow();
      ApplyShardSets();
    }
  }
  cv_.SignalAll();
  for (auto& cb : cbs) cb();
}

absl::StatusOr<v1::BatchDescriptor> StagerCore::Acquire(uint64_t step, uint32_t rank,
                                                        uint32_t timeout_ms,
                                                        const ProcessKey& caller,
                                                        bool renews_leases) {
  absl::Mutex m;
  std::optional<absl::StatusOr<v1::BatchDescriptor>> result;
  AcquireAsync(
      step, rank, timeout_ms,
      [&](absl::StatusOr<v1::BatchDescriptor> r) {
        absl::MutexLock l(&m);
        result = std::move(r);
      },
      caller, renews_leases);
  absl::MutexLock l(&m);
  m.Await(absl::Condition(
      +[](std::optional<absl::StatusOr<v1::BatchDescriptor>>* r) { return r->has_value(); },
      &result));
  return std::move(*result);
}

absl::Status StagerCore::Release(uint64_t step, uint32_t rank, const ProcessKey& caller,
                                 std::optional<double> waited) {
  if (waited && !(std::isfinite(*waited) && *waited >= 0 && *waited <= kMaxWaitSeconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "release of step ", step, " rank ", rank, ": wait_seconds ", *waited,
        " is not a time; send the measured wait, 0 <= wait_seconds <= ", kMaxWaitSeconds,
        ", or leave it unset"));
  }
  if (waited && metrics_) metrics_->client_wait_seconds.Observe(*waited);
  Callbacks cbs;
  absl::Status result;
  {
    absl::MutexLock l(&mu_);
    if (!ranks_ || !ranks_->known()) {
      return absl::FailedPreconditionError(
          absl::StrCat("release of step ", step, " rank ", rank,
                       ": no batch was handed out yet (--node=auto "
                       "learns the node from the first rank that registers or asks for a batch)"));
    }
    RETURN_IF_ERROR(ranks_->CheckLocal(rank));
    // Batches are handed out only inside [base, base + 2 * window) (see
    // BatchWindow::Admit); a release beyond that names nothing held and would
    // only add empty steps to the window.
    const uint64_t far = window_->base() + 2 * uint64_t{window_->options().window};
    if (step >= far) {
      return absl::FailedPreconditionError(absl::StrCat(
          "release of step ", step, " rank ", rank, ": no batch that far ahead was handed out "
          "(batches are handed out for steps ", window_->base(), "..", far - 1, " now)"));
    }
    // Only the rank's process releases its batches: not a replaced one (its
    // successor's), nor another process naming an invented incarnation or none.
    result = processes_.Check(rank, caller);
    if (result.ok()) {
      window_->Heard(rank, caller.incarnation, absl::Now(), std::nullopt);
      window_->Release(step, rank, &cbs);
      FollowWindow();
      ApplyShardSets();
    }
  }
  cv_.SignalAll();
  for (auto& cb : cbs) cb();
  return result;
}

absl::StatusOr<std::vector<uint64_t>> StagerCore::RenewLeases(uint32_t rank,
                                                              const ProcessKey& caller,
                                                              const std::vector<uint64_t>& steps) {
  if (caller.incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a lease renewal of rank ", rank, " must name its process (incarnation 0)"));
  }
  std::vector<uint64_t> lost;
  absl::MutexLock l(&mu_);
  if (!started_ || stopping_) {
    return absl::UnavailableError("tutti-stagerd is starting or stopping; retry");
  }
  // A process registers only once the node is known (--node=auto).
  if (ranks_->known()) RETURN_IF_ERROR(ranks_->CheckLocal(rank));
  RETURN_IF_ERROR(processes_.Check(rank, caller));
  const absl::Time now = absl::Now();
  window_->Heard(rank, caller.incarnation, now, true);
  window_->Renew(rank, steps, now, &lost);
  return lost;
}

// ------------------------------------------------------------ scheduler
void StagerCore::ApplyShardSets() {
  std::set<std::string> pinned, open;
  if (!window_->TakeShardSets(&pinned, &open)) return;
  cache_->SetPinned(std::move(pinned));
  reader_->CloseExcept(open);
}

absl::StatusOr<std::shared_ptr<WindowBatch>> StagerCore::MakeBatch(
    const std::shared_ptr<const v1::StepPlan>& plan, int rank_index) {
  const uint32_t rank = plan->ranks(rank_index).rank();
  auto job = std::make_shared<BatchJob>(
      ctx_, plan, rank_index, names_->Name(rank / config_.ranks_per_node(), rank, plan->step()),
      [this](const std::shared_ptr<BatchJob>& j) { OnBatchReady(j); });
  RETURN_IF_ERROR(job->Plan());
  return std::shared_ptr<WindowBatch>(std::move(job));
}

void StagerCore::OnBatchReady(const std::shared_ptr<BatchJob>& job) {
  {
    absl::MutexLock l(&done_mu_);
    done_jobs_.push_back(job);
  }
  cv_.SignalAll();
}

void StagerCore::Tick(Callbacks* cbs) {
  std::vector<std::shared_ptr<BatchJob>> done;
  {
    absl::MutexLock l(&done_mu_);
    done.swap(done_jobs_);
  }
  const absl::Time now = absl::Now();
  for (auto& job : done) {
    if (!window_->Ready(job, now, cbs)) job->Discard();  // released or moved past meanwhile
  }
  auto shard_state = [this](const std::string& shard) { return ShardStateOf(shard); };
  // A copy that has made no progress for the stage wait (its source stalls)
  // is not waited for: the batch reads that shard's members from the source.
  auto build_state = [this, now](const std::string& shard) {
    const ShardStatusInfo st = staging_->Status(shard);
    if (st.state == ShardState::kStaging && now - st.progress_at > stage_wait_) {
      return ShardState::kFailed;
    }
    return st.state;
  };
  window_->StartBuilds(
      now, build_state,
      [this](const std::shared_ptr<const v1::StepPlan>& plan, int index) {
        return MakeBatch(plan, index);
      },
      cbs);
  window_->Tick(absl::Now(), *intake_, shard_state, cbs);
  FollowWindow();
  ServeWaitingPeers(absl::Now());
  PublishIo();
}

void StagerCore::PublishIo() {
  if (!metrics_) return;
  const IoServiceStats now[] = {staging_->io_stats(), source_io_->stats(), cache_io_->stats()};
  for (size_t i = 0; i < 3; ++i) {
    const char* io = kIoPaths[i];
    IoServiceStats& last = published_io_[i];
    auto add = [](prometheus::Counter& c, uint64_t now_n, uint64_t& last_n) {
      if (now_n > last_n) c.Increment(static_cast<double>(now_n - last_n));
      last_n = now_n;
    };
    add(metrics_->IoTimeouts(io, "file_system"), now[i].timeouts, last.timeouts);
    add(metrics_->IoTimeouts(io, "queue"), now[i].queued_timeouts, last.queued_timeouts);
    add(metrics_->IoStalledRefusals(io), now[i].stalled_refusals, last.stalled_refusals);
    metrics_->IoStalledOperations(io).Set(static_cast<double>(now[i].stuck));
  }
}

absl::Status StagerCore::Live() const {
  const int64_t last = last_tick_ns_.load();
  if (last == 0) return absl::OkStatus();  // not started yet
  const absl::Duration since = absl::Nanoseconds(absl::GetCurrentTimeNanos() - last);
  if (since > absl::Seconds(30)) {
    return absl::UnavailableError(absl::StrCat("the batch scheduler has not run for ",
                                               absl::FormatDuration(since)));
  }
  return absl::OkStatus();
}

void StagerCore::Loop() {
  mu_.Lock();
  while (!stopping_) {
    last_tick_ns_.store(absl::GetCurrentTimeNanos());
    Callbacks cbs;
    Tick(&cbs);
    if (!cbs.empty()) {
      mu_.Unlock();
      for (auto& cb : cbs) cb();
      mu_.Lock();
      continue;
    }
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(20));
  }
  mu_.Unlock();
}

// ------------------------------------------------------------ staging status
void StagerCore::ReadMemberForPeer(const v1::ShardRef& shard, const v1::MemberRef& member,
                                   absl::Time deadline, MemberReader::Done done) {
  absl::MutexLock l(&mu_);
  if (!started_ || stopping_) {
    done(absl::UnavailableError(
             "tutti-stagerd is starting or stopping: it serves no members now; read the source"),
         false);
    return;
  }
  // Another node's plan names this node as the shard's holder. Not staged
  // here yet: staged now, behind this node's own ranks' shards (a later
  // priority than any step they stage), so that its members come from the
  // cache and the source is read for the shard once. A name that leads
  // outside --source is left to the read, which refuses it (counted once).
  ShardState state = staging_->Status(shard.name()).state;
  if ((state == ShardState::kUnknown || state == ShardState::kFailed) &&
      JoinUnder(staging_->options().source_dir, shard.name()).ok()) {
    staging_->Request(shard, window_->base() + 2 * uint64_t{opts_.window} + opts_.stage_ahead);
    state = staging_->Status(shard.name()).state;
  }
  const absl::Time now = absl::Now();
  PeerRead read{shard, member, deadline, now + std::max(deadline - now, absl::ZeroDuration()) / 2,
                std::move(done)};
  if (state == ShardState::kPending || state == ShardState::kStaging) {
    peer_waits_.push_back(std::move(read));
    cv_.SignalAll();
    return;
  }
  ReadForPeer(std::move(read));
}

void StagerCore::ReadForPeer(PeerRead read) {
  // Under mu_: Stop() resets the reader only after stopping_ is set.
  reader_->Read(read.shard, read.member.name(), read.member.offset(), read.member.size(),
                read.deadline, std::move(read.done));
}

void StagerCore::ServeWaitingPeers(absl::Time now) {
  if (peer_waits_.empty()) return;
  std::vector<PeerRead> waiting;
  for (PeerRead& read : peer_waits_) {
    const ShardStatusInfo st = staging_->Status(read.shard.name());
    const bool copying = st.state == ShardState::kPending ||
                         (st.state == ShardState::kStaging && now - st.progress_at <= stage_wait_);
    if (copying && now < read.read_by) {
      waiting.push_back(std::move(read));
    } else {
      ReadForPeer(std::move(read));
    }
  }
  peer_waits_.swap(waiting);
}

bool StagerCore::Started() const {
  absl::MutexLock l(&mu_);
  return started_;
}

v1::StageStatus StagerCore::GetStageStatus() const {
  v1::StageStatus out;
  if (!Started()) return out;  // the cache and staging are set up by Start()
  for (const auto& info : staging_->Snapshot()) {
    switch (info.state) {
      case ShardState::kStaged:
        out.set_staged_files(out.staged_files() + 1);
        out.set_staged_bytes(out.staged_bytes() + info.bytes);
        break;
      case ShardState::kFailed: out.set_failed_files(out.failed_files() + 1); break;
      default: out.set_pending_files(out.pending_files() + 1); break;
    }
    v1::ShardStatus* s = out.add_shards();
    s->set_name(info.name);
    s->set_state(static_cast<v1::ShardStatus::State>(static_cast<int>(info.state)));
    s->set_bytes(info.bytes);
    if (!info.error.ok()) s->set_error(std::string(info.error.message()));
  }
  out.set_cache_bytes_used(cache_->used_bytes());
  out.set_cache_capacity_bytes(cache_->capacity());
  out.set_lease_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(opts_.lease)));
  return out;
}

}  // namespace tutti::stager
