#include "services/packer/served_plans.h"

#include <algorithm>

namespace tutti::packer {

std::vector<uint32_t> ServedPlans::Key(absl::Span<const uint32_t> ranks) {
  std::vector<uint32_t> key(ranks.begin(), ranks.end());
  if (!std::is_sorted(key.begin(), key.end())) std::sort(key.begin(), key.end());
  key.erase(std::unique(key.begin(), key.end()), key.end());
  return key;
}

ServedPlans::Bytes ServedPlans::FindLocked(uint64_t step, const std::vector<uint32_t>& key) const {
  auto s = by_step_.find(step);
  if (s == by_step_.end()) return nullptr;
  auto it = s->second.find(key);
  return it == s->second.end() ? nullptr : it->second;
}

ServedPlans::Bytes ServedPlans::Find(uint64_t step, const std::vector<uint32_t>& key) const {
  absl::MutexLock l(&mu_);
  return FindLocked(step, key);
}

ServedPlans::Bytes ServedPlans::Serve(uint64_t step, const std::vector<uint32_t>& key, Done* done,
                                      bool* build) {
  absl::MutexLock l(&mu_);
  if (step > newest_) {
    newest_ = step;
    Trim(step);
  }
  if (Bytes kept = FindLocked(step, key)) return kept;
  auto [it, first] = pending_.try_emplace(PendingKey(step, key));
  it->second.push_back(std::move(*done));
  *build = first;
  return nullptr;
}

ServedPlans::Claim ServedPlans::ClaimPrecompute(uint64_t step, const std::vector<uint32_t>& key) {
  absl::MutexLock l(&mu_);
  if (step + options_.keep_behind < newest_) return Claim::kSkip;
  if (bytes_ + std::max<uint64_t>(last_precomputed_, 1) > options_.max_bytes) return Claim::kFull;
  if (FindLocked(step, key) != nullptr) return Claim::kSkip;
  return pending_.try_emplace(PendingKey(step, key)).second ? Claim::kClaimed : Claim::kSkip;
}

ServedPlans::Completed ServedPlans::Complete(uint64_t step, const std::vector<uint32_t>& key,
                                             absl::StatusOr<Bytes> result, bool precomputed) {
  Completed done;
  absl::MutexLock l(&mu_);
  if (result.ok()) {
    if (precomputed && *result != nullptr) last_precomputed_ = (*result)->size();
    result = InsertLocked(step, key, *std::move(result), precomputed);
  }
  done.served = std::move(result);
  auto it = pending_.find(PendingKey(step, key));
  if (it != pending_.end()) {
    done.waiters = std::move(it->second);
    pending_.erase(it);
  }
  return done;
}

ServedPlans::Bytes ServedPlans::Insert(uint64_t step, std::vector<uint32_t> key, Bytes bytes) {
  absl::MutexLock l(&mu_);
  return InsertLocked(step, std::move(key), std::move(bytes), /*only_if_room=*/false);
}

ServedPlans::Bytes ServedPlans::InsertLocked(uint64_t step, std::vector<uint32_t> key, Bytes bytes,
                                             bool only_if_room) {
  if (bytes == nullptr || bytes->size() > options_.max_bytes) return bytes;
  if (only_if_room) {
    if (step + options_.keep_behind < newest_) return bytes;
    if (bytes_ + bytes->size() > options_.max_bytes) return bytes;
  } else {
    newest_ = std::max(newest_, step);
    if (step + options_.keep_behind < newest_) return bytes;  // already dropped
  }
  StepPlans& plans = by_step_[step];
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  auto added = plans.emplace(std::move(key), bytes).first;
  bytes_ += bytes->size();
  ++entries_;
  if (only_if_room) return bytes;
  Trim(step);
  if (bytes_ > options_.max_bytes) {  // only this step is left, and it is full
    plans.erase(added);
    bytes_ -= bytes->size();
    --entries_;
    if (plans.empty()) by_step_.erase(step);
  }
  return bytes;
}

void ServedPlans::Drop(std::map<uint64_t, StepPlans>::iterator it) {
  for (const auto& [unused, b] : it->second) bytes_ -= b->size();
  entries_ -= it->second.size();
  by_step_.erase(it);
}

void ServedPlans::Trim(uint64_t keep) {
  while (!by_step_.empty() && by_step_.begin()->first + options_.keep_behind < newest_) {
    Drop(by_step_.begin());
  }
  // Over the byte budget: the lowest steps go first, the one being added last.
  while (bytes_ > options_.max_bytes && by_step_.size() > 1) {
    auto victim = by_step_.begin();
    if (victim->first == keep) ++victim;
    Drop(victim);
  }
}

uint64_t ServedPlans::bytes() const {
  absl::MutexLock l(&mu_);
  return bytes_;
}

uint64_t ServedPlans::entries() const {
  absl::MutexLock l(&mu_);
  return entries_;
}

uint64_t ServedPlans::steps() const {
  absl::MutexLock l(&mu_);
  return by_step_.size();
}

uint64_t ServedPlans::building() const {
  absl::MutexLock l(&mu_);
  return pending_.size();
}

}  // namespace tutti::packer
