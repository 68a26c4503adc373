#include "services/stager/stager_core.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_io.h"
#include "common/job_config.h"
#include "common/status.h"

namespace tutti::stager {

StagerCore::StagerCore(StagerOptions options, std::shared_ptr<StagerMetrics> metrics,
                       std::unique_ptr<IoBackend> staging_backend,
                       std::unique_ptr<IoBackend> read_backend)
    : opts_(std::move(options)), metrics_(std::move(metrics)),
      staging_backend_(std::move(staging_backend)), read_backend_(std::move(read_backend)) {}

StagerCore::~StagerCore() { Stop(); }

bool StagerCore::IsLocal(uint32_t rank) const { return rank >= first_rank_ && rank < first_rank_ + ranks_; }

std::vector<uint32_t> StagerCore::local_ranks() const {
  std::lock_guard<std::mutex> l(mu_);
  return LocalRanksLocked();
}

std::vector<uint32_t> StagerCore::LocalRanksLocked() const {
  std::vector<uint32_t> r;
  for (uint32_t i = 0; i < ranks_; ++i) r.push_back(first_rank_ + i);
  return r;
}

std::string StagerCore::ShmName(uint64_t step, uint32_t rank) const {
  return names_->Name(opts_.node, rank, step);
}

namespace {

// Probes up to 32 of the job's shards, spread over the index, in the source
// directory. None there: the wrong directory or an unmounted NFS path, refused
// now rather than failing every sample later. Some missing: a warning (their
// samples are skipped as `missing`, by the sample policy).
absl::Status CheckSourceHoldsShards(const std::string& source, const v1::JobInfo& job) {
  const int n = job.shards_size();
  if (n == 0) return absl::OkStatus();
  const int probes = std::min(n, 32);
  int missing = 0;
  std::string first;
  for (int i = 0; i < probes; ++i) {
    const std::string& name = job.shards(static_cast<int>(int64_t{i} * n / probes));
    absl::StatusOr<std::string> path = JoinUnder(source, name);
    struct stat st;
    if (!path.ok() || ::stat(path->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
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
    std::fprintf(stderr,
                 "tutti-stagerd: warning: %d of %d shards checked are missing from --source %s "
                 "(e.g. '%s'); their samples will be skipped as 'missing'\n",
                 missing, probes, source.c_str(), first.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StagerCore::Start(const v1::JobInfo& job) {
  job_ = job;
  config_ = job.config();
  ApplyJobDefaults(&config_);
  RETURN_IF_ERROR(Annotate(ValidateJobConfig(config_), "the packer's job config is not usable"));
  ranks_ = config_.ranks_per_node();
  const uint32_t nodes = config_.world_size() / ranks_;
  if (!opts_.node_auto) {
    if (opts_.node >= nodes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--node ", opts_.node, " does not exist: the job has ", nodes, " nodes (world_size ",
          config_.world_size(), " / ranks_per_node ", ranks_, "); use --node 0..", nodes - 1,
          " or --node=auto"));
    }
    first_rank_ = opts_.node * ranks_;
    node_known_ = true;
  }
  deadline_ = absl::Milliseconds(opts_.sample_deadline_ms ? opts_.sample_deadline_ms
                                                          : config_.sample_deadline_ms());
  stage_wait_ = opts_.stage_wait_ms ? absl::Milliseconds(opts_.stage_wait_ms) : deadline_;
  v1::SkipPolicy policy = config_.skip_policy();
  if (opts_.skip_policy == "drop") {
    policy = v1::SKIP_POLICY_DROP;
  } else if (opts_.skip_policy == "substitute") {
    policy = v1::SKIP_POLICY_SUBSTITUTE;
  } else if (!opts_.skip_policy.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("skip policy '", opts_.skip_policy,
                                                   "' is unknown; use 'drop' or 'substitute'"));
  }
  if (opts_.window == 0) return absl::InvalidArgumentError("--window must be at least 1");
  if (opts_.cache_dir.empty()) return absl::InvalidArgumentError("--cache is required");
  cache_ = std::make_unique<ShardCache>(opts_.cache_dir, opts_.cache_capacity_bytes);
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
  RETURN_IF_ERROR(CheckSourceHoldsShards(opts_.staging.source_dir, job));
  staging_->SetListener([this](const std::string&, ShardState) { cv_.notify_all(); });
  std::unique_ptr<IoBackend> backend = std::move(read_backend_);
  if (backend) {
  } else if (opts_.use_io_uring) {
    auto b = MakeUringBackend(opts_.read_queue_depth, opts_.read_queue_depth);
    if (!b.ok()) return Annotate(b.status(), "cannot set up io_uring for member reads");
    backend = std::move(*b);
  } else {
    backend = MakePreadBackend(16);
  }
  read_io_ = std::make_unique<IoService>(std::move(backend));
  reader_ = std::make_unique<MemberReader>(opts_.staging.source_dir, cache_.get(), staging_.get(),
                                           read_io_.get(), metrics_.get());
  const unsigned threads = opts_.decode_threads ? opts_.decode_threads
                                                : std::max(1u, std::thread::hardware_concurrency());
  pool_ = std::make_unique<ThreadPool>(threads);
  ctx_.reader = reader_.get();
  ctx_.pool = pool_.get();
  ctx_.substitutes = &substitutes_;
  ctx_.metrics = metrics_.get();
  ctx_.params = PatchifyParams::FromConfig(config_.vision());
  ctx_.config = &config_;
  ctx_.policy = policy;
  ctx_.deadline = deadline_;
  {
    std::lock_guard<std::mutex> l(mu_);
    started_ = true;
  }
  scheduler_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void StagerCore::Stop() {
  Callbacks cbs;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    for (auto& [step, s] : steps_) {
      for (auto& [rank, slot] : s.slots) {
        for (auto& w : slot.waiters) {
          cbs.push_back([d = std::move(w.done)] {
            d(absl::UnavailableError("tutti-stagerd is shutting down; retry against the restarted daemon"));
          });
        }
        slot.waiters.clear();
      }
    }
  }
  cv_.notify_all();
  for (auto& cb : cbs) cb();
  if (scheduler_.joinable()) scheduler_.join();
  read_io_.reset();  // ends reads (callbacks may still queue decodes)
  pool_.reset();     // finishes running decodes, drops queued ones
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [step, s] : steps_) {
      for (auto& [rank, slot] : s.slots) {
        if (slot.job) slot.job->Discard();
      }
    }
    steps_.clear();
  }
  {
    std::lock_guard<std::mutex> l(done_mu_);
    for (auto& j : done_jobs_) j->Discard();
    done_jobs_.clear();
  }
  reader_.reset();
  if (staging_) staging_->Stop();
}

StagerCore::Step& StagerCore::StepAt(uint64_t step) {
  Step& s = steps_[step];
  if (s.slots.empty()) {
    for (uint32_t r : LocalRanksLocked()) s.slots[r];
  }
  return s;
}

// ------------------------------------------------------------ plan intake
namespace {

// The shards this node stages for a plan: those of the local ranks' images,
// documents and audio, except shards named only by remote_load items (the
// packer staged those on another node; their members are read from the
// source). Plan order (first use) is kept.
std::vector<const v1::ShardRef*> ShardsToStage(const v1::StepPlan& plan) {
  std::map<uint64_t, uint32_t> shard_of;
  for (const auto& s : plan.samples()) shard_of[s.sample_id()] = s.shard();
  std::set<uint32_t> needed;
  auto need = [&](uint64_t sample) {
    if (auto it = shard_of.find(sample); it != shard_of.end()) needed.insert(it->second);
  };
  for (const auto& r : plan.ranks()) {
    for (const auto& e : r.encoders()) {
      for (const auto& ip : e.images()) {
        if (!ip.remote_load()) need(ip.sample_id());
      }
      for (const auto& ap : e.audio()) {
        if (!ap.remote_load()) need(ap.sample_id());
      }
    }
    for (const auto& mb : r.micro_batches()) {
      for (const auto& seq : mb.sequences()) {
        for (const auto& doc : seq.docs()) {
          if (!doc.remote_load()) need(doc.sample_id());
        }
      }
    }
  }
  std::vector<const v1::ShardRef*> out;
  for (int i = 0; i < plan.shards_size(); ++i) {
    if (needed.count(static_cast<uint32_t>(i))) out.push_back(&plan.shards(i));
  }
  return out;
}

}  // namespace

uint64_t StagerCore::PlanLimit() const {
  uint64_t limit = base_ + opts_.window + opts_.stage_ahead;
  if (job_.total_steps() != 0) limit = std::min<uint64_t>(limit, job_.total_steps());
  return limit;
}

StagerCore::PlanWant StagerCore::WaitPlanWanted(absl::Time deadline) {
  std::unique_lock<std::mutex> l(mu_);
  auto blocked = [&] {
    return !node_known_ || (plan_error_ && plan_error_->first <= next_plan_) ||
           next_plan_ >= PlanLimit();
  };
  while (!stopping_ && blocked()) {
    if (cv_.wait_until(l, absl::ToChronoTime(deadline)) == std::cv_status::timeout) break;
  }
  return PlanWant{next_plan_, PlanLimit(), generation_, stopping_, blocked()};
}

absl::Status StagerCore::AddPlan(v1::StepPlan plan, uint64_t generation) {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t step = plan.step();
  // A caller that asks for WaitPlanWanted's range never waits here.
  cv_.wait(l, [&] {
    return stopping_ || generation != generation_ || step < base_ + opts_.window + opts_.stage_ahead;
  });
  if (stopping_) return absl::CancelledError("stopping");
  if (generation != generation_) return absl::AbortedError("the window moved; restart the plan stream");
  if (step < next_plan_ || step < base_) return absl::OkStatus();  // already have it
  next_plan_ = step + 1;
  if (metrics_) metrics_->plans_received.Increment();
  absl::Status bad;
  if (!job_.config_fingerprint().empty() && !plan.config_fingerprint().empty() &&
      plan.config_fingerprint() != job_.config_fingerprint()) {
    bad = absl::FailedPreconditionError(absl::StrCat(
        "plan for step ", step, " has config fingerprint ", plan.config_fingerprint(),
        " but the job has ", job_.config_fingerprint(), ": the packer restarted with another "
        "config; restart this stager"));
  }
  Step& s = StepAt(step);
  auto shared = std::make_shared<const v1::StepPlan>(std::move(plan));
  s.plan = shared;
  s.plan_at = absl::Now();
  s.stage = ShardsToStage(*shared);
  for (auto& [rank, slot] : s.slots) {
    if (slot.state != SlotState::kWaitPlan) continue;
    bool found = false;
    for (const auto& rp : shared->ranks()) found |= rp.rank() == rank;
    if (!bad.ok()) {
      slot.state = SlotState::kFailed;
      slot.error = bad;
    } else if (!found) {
      slot.state = SlotState::kFailed;
      slot.error = absl::InvalidArgumentError(absl::StrCat(
          "the packer's plan for step ", step, " has no RankPlan for rank ", rank,
          " (node ", opts_.node, "); the packer and this stager disagree on the ranks"));
    } else {
      slot.state = SlotState::kWaitShards;
    }
  }
  if (bad.ok()) {
    for (const v1::ShardRef* ref : s.stage) staging_->Request(*ref, step);
  }
  UpdateWindow();
  l.unlock();
  cv_.notify_all();
  return bad;
}

void StagerCore::PlanFailed(uint64_t step, const absl::Status& status, uint64_t generation) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (generation != generation_) return;
    if (!plan_error_ || plan_error_->first > step) plan_error_ = std::make_pair(step, status);
  }
  cv_.notify_all();
}

// ------------------------------------------------------------ clients
absl::Status StagerCore::CheckAcquire(uint64_t step, uint32_t rank) {
  if (!started_ || stopping_) return absl::UnavailableError("tutti-stagerd is starting or stopping; retry");
  if (!IsLocal(rank)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " belongs to node ", rank / std::max(1u, ranks_), " but this tutti-stagerd "
        "serves node ", opts_.node, " (ranks ", first_rank_, "..", first_rank_ + ranks_ - 1,
        opts_.node_auto ? absl::StrCat("; learned from rank ", learned_from_, "'s first AcquireBatch "
                                       "under --node=auto")
                        : std::string(),
        "); ask the stager of node ", rank / std::max(1u, ranks_)));
  }
  if (job_.total_steps() != 0 && step >= job_.total_steps()) {
    return absl::OutOfRangeError(absl::StrCat("step ", step, " is past the job's end (",
                                              job_.total_steps(), " steps)"));
  }
  // A step before the window, or far beyond it, moves the window there when
  // nothing is in use (a job resuming from a checkpoint, before or after
  // where this daemon had got to); otherwise it is refused.
  const uint64_t far = base_ + 2 * uint64_t{opts_.window};
  if (step < base_ || step >= far) {
    const std::string busy = InUse();
    if (busy.empty()) {
      Seek(step, rank);
      return absl::OkStatus();
    }
    if (step < base_) {
      return absl::OutOfRangeError(absl::StrCat(
          "step ", step, " was already released by every rank of node ", opts_.node,
          "; the window starts at step ", base_, " and cannot move back while ", busy));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is far ahead of the prefetch window (steps ", base_, "..",
        base_ + opts_.window - 1, " are being prepared) and the window cannot move while ", busy,
        "; release earlier steps first (or raise --window)"));
  }
  if (auto it = steps_.find(step); it != steps_.end()) {
    auto s = it->second.slots.find(rank);
    if (s != it->second.slots.end() && s->second.state == SlotState::kReleased) {
      return absl::OutOfRangeError(absl::StrCat("step ", step, " of rank ", rank,
                                                " was already released, or given up when the rank asked for a later step; "
                                                "batches are handed out once, in step order"));
    }
  }
  if (plan_error_ && step >= plan_error_->first) {
    return absl::Status(plan_error_->second.code(),
                        absl::StrCat("the packer cannot serve step ", plan_error_->first,
                                     step == plan_error_->first ? "" : absl::StrCat(" (asked for step ", step, ")"),
                                     ": ", plan_error_->second.message()));
  }
  return absl::OkStatus();
}

std::string StagerCore::InUse() const {
  for (const auto& [step, st] : steps_) {
    for (const auto& [rank, slot] : st.slots) {
      if (!slot.waiters.empty()) return absl::StrCat("rank ", rank, " waits for step ", step);
      if (slot.handed_out && slot.state != SlotState::kReleased) {
        return absl::StrCat("rank ", rank, " holds step ", step);
      }
    }
  }
  return "";
}

void StagerCore::Seek(uint64_t step, uint32_t rank) {
  std::fprintf(stderr, "tutti-stagerd: rank %u asked for step %llu; nothing is in use, so the window "
               "moves from step %llu there\n", rank, static_cast<unsigned long long>(step),
               static_cast<unsigned long long>(base_));
  for (auto& [s, st] : steps_) {
    for (auto& [r, slot] : st.slots) {
      if (slot.job) {
        memory_ -= slot.job->bytes();
        slot.job->Discard();
      }
    }
  }
  steps_.clear();
  base_ = next_plan_ = step;
  ++generation_;
  plan_error_.reset();
  UpdateWindow();
}

void StagerCore::SkipEarlier(uint64_t step, uint32_t rank) {
  // A job resumed at a step inside the window (or a rank that skips steps)
  // never takes the earlier ones; batches handed out or waited for stay.
  bool changed = false;
  for (uint64_t s = base_; s < step; ++s) {
    Slot& slot = StepAt(s).slots[rank];
    if (slot.state == SlotState::kReleased || slot.handed_out || !slot.waiters.empty()) continue;
    if (slot.job) {
      memory_ -= slot.job->bytes();
      slot.job->Discard();
      slot.job.reset();
    }
    slot.state = SlotState::kReleased;
    changed = true;
  }
  if (changed) UpdateWindow();
}

void StagerCore::AcquireAsync(uint64_t step, uint32_t rank, uint32_t timeout_ms, AcquireDone done) {
  absl::StatusOr<v1::BatchDescriptor> now_result;
  bool answer_now = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    absl::Status s = node_known_ ? absl::OkStatus() : LearnNode(rank);
    if (s.ok()) s = CheckAcquire(step, rank);
    if (!s.ok()) {
      now_result = s;
      answer_now = true;
    } else {
      SkipEarlier(step, rank);
      Slot& slot = StepAt(step).slots[rank];
      if (slot.state == SlotState::kReady) {
        slot.handed_out = true;
        now_result = slot.job->descriptor();
        answer_now = true;
        if (metrics_) metrics_->client_wait_seconds.Observe(0);
      } else if (slot.state == SlotState::kFailed) {
        now_result = slot.error;
        answer_now = true;
      } else {
        const absl::Time now = absl::Now();
        const uint32_t t = timeout_ms ? timeout_ms : opts_.default_acquire_timeout_ms;
        slot.waiters.push_back(Waiter{now + absl::Milliseconds(t), now, std::move(done)});
      }
    }
  }
  cv_.notify_all();
  if (answer_now) done(std::move(now_result));
}

absl::Status StagerCore::LearnNode(uint32_t rank) {
  if (!started_ || stopping_) return absl::UnavailableError("tutti-stagerd is starting or stopping; retry");
  if (rank >= config_.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in the job (world size ",
                                                   config_.world_size(), ")"));
  }
  opts_.node = rank / ranks_;
  first_rank_ = opts_.node * ranks_;
  learned_from_ = rank;
  node_known_ = true;
  std::fprintf(stderr, "tutti-stagerd: --node=auto: rank %u asked first, so this is node %u (ranks %u..%u)\n",
               rank, opts_.node, first_rank_, first_rank_ + ranks_ - 1);
  cv_.notify_all();  // plan intake can start
  return absl::OkStatus();
}

absl::StatusOr<v1::BatchDescriptor> StagerCore::Acquire(uint64_t step, uint32_t rank, uint32_t timeout_ms) {
  std::mutex m;
  std::condition_variable cv;
  std::optional<absl::StatusOr<v1::BatchDescriptor>> result;
  AcquireAsync(step, rank, timeout_ms, [&](absl::StatusOr<v1::BatchDescriptor> r) {
    std::lock_guard<std::mutex> l(m);
    result = std::move(r);
    cv.notify_all();
  });
  std::unique_lock<std::mutex> l(m);
  cv.wait(l, [&] { return result.has_value(); });
  return std::move(*result);
}

absl::Status StagerCore::Release(uint64_t step, uint32_t rank) {
  Callbacks cbs;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!node_known_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "release of step ", step, " rank ", rank, ": no batch was handed out yet (--node=auto "
          "learns the node from the first AcquireBatch)"));
    }
    if (!IsLocal(rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " belongs to node ", rank / std::max(1u, ranks_),
          " but this tutti-stagerd serves node ", opts_.node, " (ranks ", first_rank_, "..",
          first_rank_ + ranks_ - 1, ")"));
    }
    if (step < base_) return absl::OkStatus();
    Slot& slot = StepAt(step).slots[rank];
    if (slot.job) {
      memory_ -= slot.job->bytes();
      slot.job->Discard();
      slot.job.reset();
    }
    slot.state = SlotState::kReleased;
    for (auto& w : slot.waiters) {
      cbs.push_back([d = std::move(w.done), step, rank] {
        d(absl::OutOfRangeError(absl::StrCat("step ", step, " of rank ", rank, " was released while waited for")));
      });
    }
    slot.waiters.clear();
    UpdateWindow();
  }
  cv_.notify_all();
  for (auto& cb : cbs) cb();
  return absl::OkStatus();
}

// ------------------------------------------------------------ scheduler
void StagerCore::UpdateWindow() {
  while (true) {
    auto it = steps_.find(base_);
    if (it == steps_.end()) break;
    bool all = true;
    for (const auto& [r, slot] : it->second.slots) all &= slot.state == SlotState::kReleased;
    if (!all) break;
    steps_.erase(it);
    ++base_;
  }
  std::set<std::string> pinned, window;
  for (auto& [step, s] : steps_) {
    if (!s.plan) continue;
    for (const v1::ShardRef* ref : s.stage) pinned.insert(ref->name());
    if (step < base_ + opts_.window) {
      for (const auto& ref : s.plan->shards()) window.insert(ref.name());
    }
  }
  cache_->SetPinned(std::move(pinned));
  reader_->CloseExcept(window);
}

void StagerCore::OnJobReady(const std::shared_ptr<BatchJob>& job) {
  {
    std::lock_guard<std::mutex> l(done_mu_);
    done_jobs_.push_back(job);
  }
  cv_.notify_all();
}

void StagerCore::FinishSlot(Slot& slot, Callbacks* cbs) {
  const absl::Time now = absl::Now();
  for (auto& w : slot.waiters) {
    absl::StatusOr<v1::BatchDescriptor> r = slot.state == SlotState::kReady
                                                ? absl::StatusOr<v1::BatchDescriptor>(slot.job->descriptor())
                                                : absl::StatusOr<v1::BatchDescriptor>(slot.error);
    if (metrics_) metrics_->client_wait_seconds.Observe(absl::ToDoubleSeconds(now - w.since));
    slot.handed_out |= r.ok();
    cbs->push_back([d = std::move(w.done), r = std::move(r)]() mutable { d(std::move(r)); });
  }
  slot.waiters.clear();
}

std::string StagerCore::Pending(uint64_t step, uint32_t rank, const Slot& slot) const {
  switch (slot.state) {
    case SlotState::kWaitPlan:
      return absl::StrCat("no plan for step ", step, " from the packer yet (plans received up to step ",
                          next_plan_ == 0 ? std::string("none") : absl::StrCat(next_plan_ - 1), ")");
    case SlotState::kWaitShards: {
      if (step >= base_ + opts_.window) {
        return absl::StrCat("step ", step, " is outside the window ", base_, "..",
                            base_ + opts_.window - 1, " until earlier steps are released");
      }
      std::vector<std::string> shards;
      for (const v1::ShardRef* ref : steps_.at(step).stage) {
        const ShardState st = staging_->Status(ref->name()).state;
        if (st != ShardState::kStaged) shards.push_back(absl::StrCat(ref->name(), " (", ShardStateName(st), ")"));
      }
      return absl::StrCat("waiting for shards ", absl::StrJoin(shards, ", "),
                          " or for the memory budget (", memory_, " of ", opts_.memory_budget_bytes,
                          " bytes used)");
    }
    case SlotState::kBuilding:
      return absl::StrCat("still reading/decoding: ", slot.job->PendingSummary());
    default:
      return "nothing";
  }
}

void StagerCore::StartBuilds(std::unique_lock<std::mutex>& l, Callbacks* cbs) {
  const absl::Time now = absl::Now();
  for (auto& [step, s] : steps_) {
    if (step >= base_ + opts_.window) break;
    if (!s.plan) continue;
    bool shards_ready = now - s.plan_at >= stage_wait_;
    if (!shards_ready) {
      shards_ready = true;
      for (const v1::ShardRef* ref : s.stage) {
        const ShardState st = staging_->Status(ref->name()).state;
        if (st != ShardState::kStaged && st != ShardState::kFailed) {
          shards_ready = false;
          break;
        }
      }
    }
    if (!shards_ready) continue;
    for (auto& [rank, slot] : s.slots) {
      if (slot.state != SlotState::kWaitShards) continue;
      int index = -1;
      for (int i = 0; i < s.plan->ranks_size(); ++i) {
        if (s.plan->ranks(i).rank() == rank) index = i;
      }
      auto job = std::make_shared<BatchJob>(ctx_, s.plan, index, ShmName(step, rank));
      absl::Status st = job->Plan();
      if (st.ok() && job->bytes() > opts_.memory_budget_bytes) {
        st = absl::ResourceExhaustedError(absl::StrCat(
            "the batch for step ", step, " rank ", rank, " needs ", job->bytes(),
            " bytes of shared memory, more than the whole budget (", opts_.memory_budget_bytes,
            "); raise --memory_budget"));
      }
      if (st.ok() && memory_ > 0 && memory_ + job->bytes() > opts_.memory_budget_bytes) return;
      if (st.ok()) {
        st = job->Start([this](const std::shared_ptr<BatchJob>& j) { OnJobReady(j); });
      }
      if (!st.ok()) {
        slot.state = SlotState::kFailed;
        slot.error = st;
        FinishSlot(slot, cbs);
        continue;
      }
      memory_ += job->bytes();
      slot.job = std::move(job);
      slot.state = SlotState::kBuilding;
    }
  }
}

void StagerCore::Tick(std::unique_lock<std::mutex>& l, Callbacks* cbs) {
  std::vector<std::shared_ptr<BatchJob>> done;
  {
    std::lock_guard<std::mutex> dl(done_mu_);
    done.swap(done_jobs_);
  }
  for (auto& job : done) {
    auto it = steps_.find(job->step());
    Slot* slot = nullptr;
    if (it != steps_.end()) {
      auto s = it->second.slots.find(job->rank());
      if (s != it->second.slots.end() && s->second.job == job) slot = &s->second;
    }
    if (slot == nullptr) {
      job->Discard();  // released or moved past meanwhile
      continue;
    }
    slot->state = SlotState::kReady;
    if (metrics_) {
      metrics_->batches_built.Increment();
      metrics_->batch_build_seconds.Observe(absl::ToDoubleSeconds(absl::Now() - job->started()));
    }
    FinishSlot(*slot, cbs);
  }
  StartBuilds(l, cbs);
  const absl::Time now = absl::Now();
  int ready = 0, building = 0;
  for (auto& [step, s] : steps_) {
    for (auto& [rank, slot] : s.slots) {
      ready += slot.state == SlotState::kReady;
      building += slot.state == SlotState::kBuilding;
      if (slot.state == SlotState::kBuilding && now > slot.job->deadline() + absl::Seconds(1)) {
        slot.job->Expire();
      }
      if (slot.state == SlotState::kWaitPlan && plan_error_ && step >= plan_error_->first) {
        slot.state = SlotState::kFailed;
        slot.error = absl::Status(plan_error_->second.code(),
                                  absl::StrCat("the packer cannot serve step ", step, ": ",
                                               plan_error_->second.message()));
        FinishSlot(slot, cbs);
      }
      for (auto w = slot.waiters.begin(); w != slot.waiters.end();) {
        if (w->deadline > now) {
          ++w;
          continue;
        }
        absl::Status err = absl::DeadlineExceededError(absl::StrCat(
            "the batch for step ", step, " rank ", rank, " was not ready within ",
            absl::FormatDuration(w->deadline - w->since), ": ", Pending(step, rank, slot)));
        if (metrics_) metrics_->client_wait_seconds.Observe(absl::ToDoubleSeconds(now - w->since));
        cbs->push_back([d = std::move(w->done), err] { d(err); });
        w = slot.waiters.erase(w);
      }
    }
  }
  if (metrics_) {
    metrics_->window_batches.Set(ready);
    metrics_->window_building.Set(building);
    metrics_->batch_memory.Set(static_cast<double>(memory_));
  }
}

void StagerCore::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    Callbacks cbs;
    Tick(l, &cbs);
    if (!cbs.empty()) {
      l.unlock();
      for (auto& cb : cbs) cb();
      l.lock();
      continue;
    }
    cv_.wait_for(l, std::chrono::milliseconds(20));
  }
}

// ------------------------------------------------------------ staging RPCs
v1::StageResponse StagerCore::Stage(const v1::StageRequest& request) {
  std::vector<std::string> names(request.shards().begin(), request.shards().end());
  if (names.empty()) names.assign(job_.shards().begin(), job_.shards().end());
  for (const auto& n : names) {
    v1::ShardRef ref;
    ref.set_name(n);
    staging_->Request(ref, ~uint64_t{0} >> 1);  // after every plan's shards
  }
  if (request.wait()) staging_->Wait(names, absl::Now() + absl::Hours(24)).IgnoreError();
  v1::StageResponse resp;
  for (const auto& n : names) {
    ShardStatusInfo info = staging_->Status(n);
    v1::ShardStatus* s = resp.add_shards();
    s->set_name(n);
    s->set_state(static_cast<v1::ShardStatus::State>(static_cast<int>(info.state)));
    s->set_bytes(info.bytes);
    if (!info.error.ok()) s->set_error(std::string(info.error.message()));
  }
  return resp;
}

v1::StageStatus StagerCore::GetStageStatus() const {
  v1::StageStatus out;
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
  return out;
}

}  // namespace tutti::stager
