#include "services/stager/window/batch_window.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"

namespace tutti::stager {
namespace {
const Logger kLog("stager.window");
}  // namespace

BatchWindow::Step& BatchWindow::StepAt(uint64_t step) {
  Step& s = steps_[step];
  if (s.slots.empty()) {
    for (uint32_t r : ranks_->ranks()) s.slots[r];
  }
  return s;
}

void BatchWindow::Free(Slot& slot) {
  if (!slot.batch) return;
  memory_ -= slot.batch->bytes();
  slot.batch->Discard();
  slot.batch.reset();
}

// ------------------------------------------------------------ clients
absl::Status BatchWindow::Admit(uint64_t step, uint32_t rank, bool* moved) {
  *moved = false;
  if (opts_.total_steps != 0 && step >= opts_.total_steps) {
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " is past the job's end (", opts_.total_steps, " steps)"));
  }
  // A step before the window, or beyond it, moves the window so that it
  // starts at the earliest of that step and every step in use, when all of
  // them then lie inside it (ranks resuming at different steps, in any
  // order; a job resumed from a checkpoint). Otherwise Acquire waits for that.
  if (!InWindow(step)) {
    *moved = MoveFor(step, rank, InUseSpan());
    return absl::OkStatus();
  }
  if (auto it = steps_.find(step); it != steps_.end()) {
    auto s = it->second.slots.find(rank);
    if (s != it->second.slots.end() && s->second.state == SlotState::kReleased) {
      return absl::OutOfRangeError(
          absl::StrCat("step ", step, " of rank ", rank,
                       " was already released, or given up when the rank asked for a later step; "
                       "batches are handed out once, in step order"));
    }
  }
  return absl::OkStatus();
}

void BatchWindow::Acquire(uint64_t step, uint32_t rank, uint32_t timeout_ms, absl::Time now,
                          Answer done, Callbacks* cbs) {
  clock_ = std::max(clock_, now);
  const uint32_t t = timeout_ms ? timeout_ms : opts_.default_acquire_timeout_ms;
  Waiter w{now + absl::Milliseconds(t), now, std::move(done)};
  if (!InWindow(step)) {
    seeks_.push_back(SeekWaiter{step, rank, std::move(w)});
    return;
  }
  AcquireSlot(step, rank, std::move(w), cbs);
}

void BatchWindow::AcquireSlot(uint64_t step, uint32_t rank, Waiter waiter, Callbacks* cbs) {
  SkipEarlier(step, rank);
  Slot& slot = StepAt(step).slots[rank];
  if (slot.state == SlotState::kReady) {
    slot.handed_out = true;
    slot.renewed = clock_;
    if (metrics_) metrics_->acquire_wait_seconds.Observe(0);
    cbs->push_back(
        [d = std::move(waiter.done), r = slot.batch->descriptor()]() mutable { d(std::move(r)); });
  } else if (slot.state == SlotState::kFailed) {
    cbs->push_back([d = std::move(waiter.done), e = slot.error] { d(e); });
  } else {
    slot.waiters.push_back(std::move(waiter));
  }
}

void BatchWindow::TrySeek(Callbacks* cbs) {
  if (seeks_.empty()) return;
  std::vector<std::pair<uint64_t, uint32_t>> asked;
  for (const SeekWaiter& s : seeks_) asked.emplace_back(s.step, s.rank);
  std::sort(asked.begin(), asked.end());
  const Uses uses = InUseSpan();
  for (const auto& [step, rank] : asked) {
    if (!InWindow(step) && MoveFor(step, rank, uses)) {
      moved_ = true;
      break;
    }
  }
  std::vector<SeekWaiter> waiting = std::move(seeks_);
  seeks_.clear();
  for (SeekWaiter& s : waiting) {
    if (InWindow(s.step)) {
      AcquireSlot(s.step, s.rank, std::move(s.waiter), cbs);
    } else {
      seeks_.push_back(std::move(s));  // too far from what is in use: later
    }
  }
}

BatchWindow::Uses BatchWindow::InUseSpan() const {
  Uses u;
  for (const auto& [step, st] : steps_) {
    for (const auto& [rank, slot] : st.slots) {
      if (Gone(rank) || !Used(slot)) continue;
      if (!u.any) u.lo = step;
      u.any = true;
      u.hi = step;
    }
  }
  return u;
}

bool BatchWindow::MoveFor(uint64_t step, uint32_t rank, const Uses& uses) {
  if (!uses.any) {
    Seek(step, rank);
    return true;
  }
  const uint64_t lo = std::min(step, uses.lo), hi = std::max(step, uses.hi);
  if (hi - lo >= Span()) return false;
  if (lo < base_) {
    MoveBack(lo, rank);
  } else {
    MoveForward(lo, rank);
  }
  return true;
}

void BatchWindow::MoveBack(uint64_t to, uint32_t rank) {
  kLog.Info("the window moves back to the step a rank asked for; what is in use stays",
            {{"rank", rank}, {"step", to}, {"from_step", base_}});
  // A rank seen at the window's steps (it holds, waits for or is done with
  // one) asks for no earlier step: its slots of the steps added are given up.
  std::set<uint32_t> past;
  for (const auto& [step, st] : steps_) {
    for (const auto& [r, slot] : st.slots) {
      if (r != rank && (slot.state == SlotState::kReleased || Used(slot))) past.insert(r);
    }
  }
  const uint64_t from = base_;
  base_ = to;
  for (uint64_t s = to; s < from; ++s) {
    Step& st = StepAt(s);
    for (uint32_t r : past) st.slots[r].state = SlotState::kReleased;
  }
  Advance();
}

void BatchWindow::MoveForward(uint64_t to, uint32_t rank) {
  kLog.Info("the window moves on to the step a rank asked for; what is in use stays",
            {{"rank", rank}, {"step", to}, {"from_step", base_}});
  // Nothing before `to` is in use (MoveFor): those steps go.
  for (auto it = steps_.begin(); it != steps_.end() && it->first < to;) {
    for (auto& [r, slot] : it->second.slots) Free(slot);
    it = steps_.erase(it);
  }
  base_ = to;
  Advance();
}

bool BatchWindow::TakeMoved(uint64_t* step) {
  if (!moved_) return false;
  moved_ = false;
  *step = base_;
  return true;
}

void BatchWindow::Heard(uint32_t rank, uint64_t incarnation, absl::Time now,
                        std::optional<bool> renews) {
  if (incarnation == 0) return;
  clock_ = std::max(clock_, now);
  Presence& p = presence_[rank];
  p.heard = std::max(p.heard, now);
  if (renews) p.renews = *renews;
  if (p.gone) {
    p.gone = false;
    kLog.Info("a rank taken as gone called again: it is served and waited for again",
              {{"job", opts_.job_id}, {"rank", rank}, {"incarnation", absl::Hex(incarnation)}});
  }
}

void BatchWindow::Renew(uint32_t rank, const std::vector<uint64_t>& steps, absl::Time now,
                        std::vector<uint64_t>* lost) {
  clock_ = std::max(clock_, now);
  for (uint64_t step : steps) {
    auto it = steps_.find(step);
    Slot* slot = nullptr;
    if (it != steps_.end()) {
      auto s = it->second.slots.find(rank);
      if (s != it->second.slots.end() && Held(s->second)) slot = &s->second;
    }
    if (slot == nullptr) {
      lost->push_back(step);
    } else {
      slot->renewed = std::max(slot->renewed, now);
    }
  }
}

bool BatchWindow::Gone(uint32_t rank) const {
  auto it = presence_.find(rank);
  return it != presence_.end() && it->second.gone;
}

bool BatchWindow::Renews(uint32_t rank) const {
  auto it = presence_.find(rank);
  return it != presence_.end() && it->second.renews;
}

void BatchWindow::NewProcess(uint32_t rank, uint64_t incarnation, Callbacks* cbs) {
  uint64_t& current = incarnation_[rank];
  kLog.Info("a new process for the rank: what an earlier one held or waited for is reclaimed",
            {{"job", opts_.job_id},
             {"rank", rank},
             {"old_incarnation", absl::Hex(current)},
             {"incarnation", absl::Hex(incarnation)}});
  current = incarnation;
  Reclaim(rank, cbs);
  presence_.erase(rank);  // the new process says whether it renews with its first call
  TrySeek(cbs);
}

void BatchWindow::Reclaim(uint32_t rank, Callbacks* cbs) {
  const absl::Status gone = absl::AbortedError(
      absl::StrCat("rank ", rank,
                   " restarted (a new process registered for it): this call of the old one is "
                   "void"));
  AnswerWaiters(rank, gone, cbs);
  for (auto& [step, s] : steps_) {
    auto it = s.slots.find(rank);
    if (it == s.slots.end()) continue;
    Slot& slot = it->second;
    // Held by the old process, or released by it: the new one may ask for
    // the step again (a job resumed at an earlier step), so it is built anew.
    if ((slot.handed_out && slot.state != SlotState::kFailed) ||
        slot.state == SlotState::kReleased) {
      Free(slot);
      slot.state = s.plan ? SlotState::kWaitShards : SlotState::kWaitPlan;
    }
    slot.handed_out = false;
  }
  shards_changed_ = true;
}

void BatchWindow::AnswerWaiters(uint32_t rank, const absl::Status& status, Callbacks* cbs) {
  for (auto& [step, s] : steps_) {
    auto it = s.slots.find(rank);
    if (it == s.slots.end()) continue;
    for (auto& w : it->second.waiters) {
      cbs->push_back([d = std::move(w.done), status] { d(status); });
    }
    it->second.waiters.clear();
  }
  for (auto seek = seeks_.begin(); seek != seeks_.end();) {
    if (seek->rank != rank) {
      ++seek;
      continue;
    }
    cbs->push_back([d = std::move(seek->waiter.done), status] { d(status); });
    seek = seeks_.erase(seek);
  }
}

void BatchWindow::Release(uint64_t step, uint32_t rank, Callbacks* cbs) {
  if (step < base_) return;
  Slot& slot = StepAt(step).slots[rank];
  Free(slot);
  slot.state = SlotState::kReleased;
  for (auto& w : slot.waiters) {
    cbs->push_back([d = std::move(w.done), step, rank] {
      d(absl::OutOfRangeError(
          absl::StrCat("step ", step, " of rank ", rank, " was released while waited for")));
    });
  }
  slot.waiters.clear();
  Advance();
  TrySeek(cbs);
}

std::string BatchWindow::InUse() const {
  for (const auto& [step, st] : steps_) {
    for (const auto& [rank, slot] : st.slots) {
      if (!Gone(rank) && Used(slot)) return UseOf(step, rank, slot);
    }
  }
  return "";
}

std::string BatchWindow::UseOf(uint64_t step, uint32_t rank, const Slot& slot) {
  return absl::StrCat("rank ", rank, slot.waiters.empty() ? " holds step " : " waits for step ",
                      step);
}

std::string BatchWindow::FarthestUse(uint64_t step) const {
  std::string far;
  uint64_t distance = 0;
  for (const auto& [s, st] : steps_) {
    for (const auto& [rank, slot] : st.slots) {
      if (Gone(rank) || !Used(slot)) continue;
      const uint64_t d = s > step ? s - step : step - s;
      if (far.empty() || d > distance) {
        far = UseOf(s, rank, slot);
        distance = d;
      }
    }
  }
  return far;
}

std::string BatchWindow::BaseHeldBy() const {
  auto it = steps_.find(base_);
  if (it == steps_.end()) return absl::StrCat("no rank has asked for step ", base_, " yet");
  std::vector<std::string> who;
  for (const auto& [rank, slot] : it->second.slots) {
    if (Gone(rank) || slot.state == SlotState::kReleased) continue;
    who.push_back(Used(slot) ? UseOf(base_, rank, slot)
                             : absl::StrCat("rank ", rank, " has not asked for step ", base_));
  }
  return absl::StrJoin(who, ", ");
}

void BatchWindow::Seek(uint64_t step, uint32_t rank) {
  kLog.Info("nothing is in use, so the window moves to the step a rank asked for",
            {{"rank", rank}, {"step", step}, {"from_step", base_}});
  for (auto& [s, st] : steps_) {
    for (auto& [r, slot] : st.slots) Free(slot);
  }
  steps_.clear();
  base_ = step;
  Advance();
}

void BatchWindow::SkipEarlier(uint64_t step, uint32_t rank) {
  // A job resumed at a step inside the window (or a rank that skips steps)
  // never takes the earlier ones; batches handed out or waited for stay.
  bool changed = false;
  for (uint64_t s = base_; s < step; ++s) {
    Slot& slot = StepAt(s).slots[rank];
    if (slot.state == SlotState::kReleased || slot.handed_out || !slot.waiters.empty()) continue;
    Free(slot);
    slot.state = SlotState::kReleased;
    changed = true;
  }
  if (changed) Advance();
}

void BatchWindow::Advance() {
  while (true) {
    auto it = steps_.find(base_);
    if (it == steps_.end()) break;
    // Every rank released the step, a rank taken as gone aside (as long as
    // one rank is not gone: nothing moves for no one).
    bool all = true, anyone = false;
    for (const auto& [r, slot] : it->second.slots) {
      if (Gone(r)) continue;
      anyone = true;
      all &= slot.state == SlotState::kReleased;
    }
    if (!all || !anyone) break;
    for (auto& [r, slot] : it->second.slots) Free(slot);  // a gone rank's build may hold memory
    steps_.erase(it);
    ++base_;
  }
  shards_changed_ = true;
}

bool BatchWindow::TakeShardSets(std::set<std::string>* pinned, std::set<std::string>* open) {
  if (!shards_changed_) return false;
  shards_changed_ = false;
  pinned->clear();
  open->clear();
  for (const auto& [step, s] : steps_) {
    if (!s.plan) continue;
    for (const v1::ShardRef* ref : s.stage) pinned->insert(ref->name());
    if (step < base_ + opts_.window) {
      for (const auto& ref : s.plan->shards()) open->insert(ref.name());
      for (const auto& ref : s.plan->held_shards()) open->insert(ref.name());  // peers read them
    }
  }
  return true;
}

// ------------------------------------------------------------ plans
void BatchWindow::AddPlan(std::shared_ptr<const v1::StepPlan> plan,
                          std::vector<const v1::ShardRef*> stage, const absl::Status& bad,
                          absl::Time now) {
  const uint64_t step = plan->step();
  Step& s = StepAt(step);
  s.plan = std::move(plan);
  s.plan_at = now;
  s.stage = std::move(stage);
  for (auto& [rank, slot] : s.slots) {
    if (slot.state != SlotState::kWaitPlan) continue;
    bool found = false;
    for (const auto& rp : s.plan->ranks()) found |= rp.rank() == rank;
    if (!bad.ok()) {
      slot.state = SlotState::kFailed;
      slot.error = bad;
    } else if (!found) {
      slot.state = SlotState::kFailed;
      slot.error = absl::InvalidArgumentError(absl::StrCat(
          "the packer's plan for step ", step, " has no RankPlan for rank ", rank, " (node ",
          ranks_->node(), "); the packer and this stager disagree on the ranks"));
    } else {
      slot.state = SlotState::kWaitShards;
    }
  }
  Advance();
}

// ------------------------------------------------------------ building
bool BatchWindow::ShardsReady(const Step& s, absl::Time now,
                              const ShardStateOf& shard_state) const {
  if (now - s.plan_at >= opts_.stage_wait) return true;
  for (const v1::ShardRef* ref : s.stage) {
    const ShardState st = shard_state(ref->name());
    if (st != ShardState::kStaged && st != ShardState::kFailed) return false;
  }
  return true;
}

bool BatchWindow::StartSlot(uint64_t step, Step& s, uint32_t rank, Slot& slot,
                            const MakeBatch& make, absl::Time now, Callbacks* cbs) {
  int index = -1;
  for (int i = 0; i < s.plan->ranks_size(); ++i) {
    if (s.plan->ranks(i).rank() == rank) index = i;
  }
  absl::StatusOr<std::shared_ptr<WindowBatch>> batch = make(s.plan, index);
  absl::Status st = batch.status();
  if (st.ok() && (*batch)->bytes() > opts_.memory_budget_bytes) {
    st = absl::ResourceExhaustedError(
        absl::StrCat("the batch for step ", step, " rank ", rank, " needs ", (*batch)->bytes(),
                     " bytes of shared memory, more than the whole budget (",
                     opts_.memory_budget_bytes, "); raise --memory_budget"));
  }
  if (st.ok() && memory_ > 0 && memory_ + (*batch)->bytes() > opts_.memory_budget_bytes) {
    return false;  // waits until batches are released
  }
  if (st.ok()) st = (*batch)->Start();
  if (!st.ok()) {
    slot.state = SlotState::kFailed;
    slot.error = st;
    Finish(slot, now, cbs);
    return true;
  }
  memory_ += (*batch)->bytes();
  slot.batch = std::move(*batch);
  slot.state = SlotState::kBuilding;
  return true;
}

void BatchWindow::StartBuilds(absl::Time now, const ShardStateOf& shard_state,
                              const MakeBatch& make, Callbacks* cbs) {
  for (auto& [step, s] : steps_) {
    if (step >= base_ + opts_.window) break;
    if (!s.plan || !ShardsReady(s, now, shard_state)) continue;
    for (auto& [rank, slot] : s.slots) {
      if (slot.state != SlotState::kWaitShards || Gone(rank)) continue;
      if (!StartSlot(step, s, rank, slot, make, now, cbs)) return;
    }
  }
}

bool BatchWindow::Ready(const std::shared_ptr<WindowBatch>& batch, absl::Time now, Callbacks* cbs) {
  auto it = steps_.find(batch->step());
  if (it == steps_.end()) return false;
  auto s = it->second.slots.find(batch->rank());
  if (s == it->second.slots.end() || s->second.batch != batch) return false;
  Slot& slot = s->second;
  clock_ = std::max(clock_, now);
  if (Gone(batch->rank())) {  // no one to hand it to: built again if the rank comes back
    Free(slot);
    slot.state = SlotState::kWaitShards;
    return true;
  }
  slot.state = SlotState::kReady;
  if (metrics_) {
    metrics_->batches_built.Increment();
    metrics_->batch_build_seconds.Observe(absl::ToDoubleSeconds(now - batch->started()));
  }
  Finish(slot, now, cbs);
  return true;
}

void BatchWindow::Finish(Slot& slot, absl::Time now, Callbacks* cbs) {
  for (auto& w : slot.waiters) {
    absl::StatusOr<v1::BatchDescriptor> r =
        slot.state == SlotState::kReady
            ? absl::StatusOr<v1::BatchDescriptor>(slot.batch->descriptor())
            : absl::StatusOr<v1::BatchDescriptor>(slot.error);
    if (metrics_) metrics_->acquire_wait_seconds.Observe(absl::ToDoubleSeconds(now - w.since));
    if (r.ok()) {
      slot.handed_out = true;
      slot.renewed = now;
    }
    cbs->push_back([d = std::move(w.done), r = std::move(r)]() mutable { d(std::move(r)); });
  }
  slot.waiters.clear();
}

// ------------------------------------------------------------ deadlines
std::string BatchWindow::Pending(uint64_t step, const Slot& slot, const PlanIntake& intake,
                                 const ShardStateOf& shard_state) const {
  switch (slot.state) {
    case SlotState::kWaitPlan:
      return absl::StrCat("no plan for step ", step, " from the packer yet (", intake.Received(),
                          ")");
    case SlotState::kWaitShards: {
      if (step >= base_ + opts_.window) {
        return absl::StrCat("step ", step, " is beyond the steps being built (", base_, "..",
                            base_ + opts_.window - 1,
                            "), which move on once every rank of this node is done with step ",
                            base_, ", but ", BaseHeldBy());
      }
      std::vector<std::string> shards;
      for (const v1::ShardRef* ref : steps_.at(step).stage) {
        const ShardState st = shard_state(ref->name());
        if (st != ShardState::kStaged) {
          shards.push_back(absl::StrCat(ref->name(), " (", ShardStateName(st), ")"));
        }
      }
      return absl::StrCat("waiting for shards ", absl::StrJoin(shards, ", "),
                          " or for the memory budget (", memory_, " of ", opts_.memory_budget_bytes,
                          " bytes used)");
    }
    case SlotState::kBuilding:
      return absl::StrCat("still reading/decoding: ", slot.batch->PendingSummary());
    default:
      return "nothing";
  }
}

void BatchWindow::TimeOutWaiters(uint64_t step, uint32_t rank, Slot& slot, absl::Time now,
                                 const PlanIntake& intake, const ShardStateOf& shard_state,
                                 Callbacks* cbs) {
  for (auto w = slot.waiters.begin(); w != slot.waiters.end();) {
    if (w->deadline > now) {
      ++w;
      continue;
    }
    absl::Status err = absl::DeadlineExceededError(
        absl::StrCat("the batch for step ", step, " rank ", rank, " was not ready within ",
                     absl::FormatDuration(w->deadline - w->since), ": ",
                     Pending(step, slot, intake, shard_state)));
    if (metrics_) metrics_->acquire_wait_seconds.Observe(absl::ToDoubleSeconds(now - w->since));
    cbs->push_back([d = std::move(w->done), err] { d(err); });
    w = slot.waiters.erase(w);
  }
}

void BatchWindow::Tick(absl::Time now, const PlanIntake& intake, const ShardStateOf& shard_state,
                       Callbacks* cbs) {
  clock_ = std::max(clock_, now);
  ExpireLeases(now, cbs);
  std::map<uint32_t, int> ahead;  // per local rank: ready, not handed out
  for (uint32_t r : ranks_->ranks()) ahead[r] = 0;
  int building = 0;
  for (auto& [step, s] : steps_) {
    for (auto& [rank, slot] : s.slots) {
      ahead[rank] += slot.state == SlotState::kReady && !slot.handed_out;
      building += slot.state == SlotState::kBuilding;
      if (slot.state == SlotState::kBuilding && now > slot.batch->deadline() + absl::Seconds(1)) {
        slot.batch->Expire();
      }
      if (slot.state == SlotState::kWaitPlan && intake.Covers(step)) {
        slot.state = SlotState::kFailed;
        slot.error = intake.SlotError(step);
        Finish(slot, now, cbs);
      }
      TimeOutWaiters(step, rank, slot, now, intake, shard_state, cbs);
    }
  }
  TrySeek(cbs);
  for (auto seek = seeks_.begin(); seek != seeks_.end();) {
    if (seek->waiter.deadline > now) {
      ++seek;
      continue;
    }
    absl::Status err = absl::DeadlineExceededError(absl::StrCat(
        "the batch for step ", seek->step, " rank ", seek->rank, " was not ready within ",
        absl::FormatDuration(seek->waiter.deadline - seek->waiter.since), ": step ", seek->step,
        " lies outside the window (steps ", base_, "..", base_ + Span() - 1,
        "), which moves to it once every step in use lies within ", Span(), " steps of it, but ",
        FarthestUse(seek->step),
        " (ranks resuming more than that apart: check the steps they resume at; what a rank "
        "whose process died held is reclaimed when it restarts, or once its lease lapses)"));
    if (metrics_) {
      metrics_->acquire_wait_seconds.Observe(absl::ToDoubleSeconds(now - seek->waiter.since));
    }
    cbs->push_back([d = std::move(seek->waiter.done), err] { d(err); });
    seek = seeks_.erase(seek);
  }
  if (metrics_) {
    for (const auto& [rank, n] : ahead) metrics_->WindowBatches(rank).Set(n);
    metrics_->window_building.Set(building);
    metrics_->batch_memory.Set(static_cast<double>(memory_));
  }
}

// ------------------------------------------------------------ leases
void BatchWindow::ExpireLeases(absl::Time now, Callbacks* cbs) {
  // The scheduler calls this every few milliseconds. A gap of an eighth of
  // the lease means this daemon itself stalled (no renewal could be taken
  // meanwhile): every lease is credited with the gap rather than ended for it.
  if (last_expire_ != absl::InfinitePast() && now - last_expire_ > opts_.lease / 8) {
    const absl::Duration gap = now - last_expire_;
    for (auto& [rank, p] : presence_) p.heard += gap;
    for (auto& [step, s] : steps_) {
      for (auto& [rank, slot] : s.slots) {
        if (Held(slot)) slot.renewed += gap;
      }
    }
  }
  last_expire_ = now;
  bool changed = false;
  for (auto& [rank, p] : presence_) {
    if (!p.renews || p.gone || now - p.heard <= opts_.lease) continue;
    p.gone = true;
    changed = true;
    kLog.Warning(
        "a rank's process was not heard from within its lease: it is taken as gone, what it "
        "held is freed and the window no longer waits for it (until it calls again)",
        {{"job", opts_.job_id},
         {"rank", rank},
         {"incarnation", absl::Hex(incarnation_[rank])},
         {"silent_for", absl::FormatDuration(now - p.heard)},
         {"lease", absl::FormatDuration(opts_.lease)}});
    if (metrics_) metrics_->ranks_lapsed.Increment();
    GiveUp(rank, now, cbs);
  }
  for (auto& [step, s] : steps_) {
    for (auto& [rank, slot] : s.slots) {
      if (!Held(slot) || !Renews(rank) || now - slot.renewed <= opts_.lease) continue;
      EndLease(step, rank, slot, now, "its process no longer renews it");
      changed = true;
    }
  }
  if (changed) {
    Advance();
    TrySeek(cbs);
  }
}

void BatchWindow::GiveUp(uint32_t rank, absl::Time now, Callbacks* cbs) {
  const absl::Status gone = absl::UnavailableError(absl::StrCat(
      "rank ", rank, "'s process was not heard from within its lease (",
      absl::FormatDuration(opts_.lease), "), so it was taken as gone; retry to be served again"));
  AnswerWaiters(rank, gone, cbs);
  for (auto& [step, s] : steps_) {
    auto it = s.slots.find(rank);
    if (it == s.slots.end()) continue;
    Slot& slot = it->second;
    if (Held(slot)) {
      EndLease(step, rank, slot, now, "its rank was taken as gone");
    } else if (slot.state == SlotState::kReady) {  // built ahead: the memory goes to the others
      Free(slot);
      slot.state = SlotState::kWaitShards;
    }
  }
  shards_changed_ = true;
}

void BatchWindow::EndLease(uint64_t step, uint32_t rank, Slot& slot, absl::Time now,
                           const char* why) {
  kLog.Warning(absl::StrCat("the lease of a batch lapsed (", why, "): it is freed"),
               {{"job", opts_.job_id},
                {"rank", rank},
                {"step", step},
                {"not_renewed_for", absl::FormatDuration(now - slot.renewed)}});
  if (metrics_) metrics_->leases_expired.Increment();
  Free(slot);
  slot.state = SlotState::kReleased;
  slot.handed_out = false;
}

// ------------------------------------------------------------ shutdown
void BatchWindow::FailWaiters(const absl::Status& status, Callbacks* cbs) {
  for (SeekWaiter& seek : seeks_)
    cbs->push_back([d = std::move(seek.waiter.done), status] { d(status); });
  seeks_.clear();
  for (auto& [step, s] : steps_) {
    for (auto& [rank, slot] : s.slots) {
      for (auto& w : slot.waiters) cbs->push_back([d = std::move(w.done), status] { d(status); });
      slot.waiters.clear();
    }
  }
}

void BatchWindow::Clear() {
  for (auto& [step, s] : steps_) {
    for (auto& [rank, slot] : s.slots) {
      if (slot.batch) slot.batch->Discard();
    }
  }
  steps_.clear();
}

}  // namespace tutti::stager
