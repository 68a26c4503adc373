#include "services/stager/plan_intake.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"

namespace tutti::stager {

uint64_t PlanIntake::Limit(uint64_t base) const {
  uint64_t limit = base + ahead_;
  if (total_steps_ != 0) limit = std::min(limit, total_steps_);
  return limit;
}

bool PlanIntake::Blocked(uint64_t base) const {
  return (failure_ && failure_->first <= next_) || next_ >= Limit(base);
}

std::string PlanIntake::Received() const {
  return absl::StrCat("plans received up to step ",
                      next_ == 0 ? std::string("none") : absl::StrCat(next_ - 1));
}

void PlanIntake::Restart(uint64_t step) {
  next_ = step;
  ++generation_;
  failure_.reset();
}

PlanIntake::Verdict PlanIntake::Classify(uint64_t step, uint64_t generation, uint64_t base) const {
  if (generation != generation_) return Verdict::kStale;
  if (step < next_ || step < base) return Verdict::kHaveIt;
  return Verdict::kTake;
}

absl::Status PlanIntake::Take(const v1::StepPlan& plan) {
  next_ = plan.step() + 1;
  if (!fingerprint_.empty() && !plan.config_fingerprint().empty() &&
      plan.config_fingerprint() != fingerprint_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan for step ", plan.step(), " has config fingerprint ", plan.config_fingerprint(),
        " but the job has ", fingerprint_,
        ": the packer restarted with another config; restart this stager"));
  }
  return absl::OkStatus();
}

void PlanIntake::Failed(uint64_t step, const absl::Status& status, uint64_t generation) {
  if (generation != generation_) return;
  if (!failure_ || failure_->first > step) failure_ = std::make_pair(step, status);
}

absl::Status PlanIntake::ErrorFor(uint64_t step) const {
  if (!Covers(step)) return absl::OkStatus();
  const auto& [first, status] = *failure_;
  return absl::Status(
      status.code(),
      absl::StrCat("the packer cannot serve step ", first,
                   step == first ? "" : absl::StrCat(" (asked for step ", step, ")"), ": ",
                   status.message()));
}

absl::Status PlanIntake::SlotError(uint64_t step) const {
  if (!Covers(step)) return absl::OkStatus();
  return absl::Status(failure_->second.code(),
                      absl::StrCat("the packer cannot serve step ", step, ": ",
                                   failure_->second.message()));
}

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
  std::set<std::string> names;
  for (int i = 0; i < plan.shards_size(); ++i) {
    if (needed.count(static_cast<uint32_t>(i))) {
      out.push_back(&plan.shards(i));
      names.insert(plan.shards(i).name());
    }
  }
  for (const v1::ShardRef& ref : plan.held_shards()) {
    if (names.insert(ref.name()).second) out.push_back(&ref);
  }
  return out;
}

}  // namespace tutti::stager
