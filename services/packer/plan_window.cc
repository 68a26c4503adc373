#include "services/packer/plan_window.h"

#include <chrono>

#include "absl/synchronization/notification.h"

namespace tutti::packer {

PlanWindow::PlanWindow(std::shared_ptr<const Planner> planner, PlanWindowOptions options,
                       PackerMetrics* metrics)
    : planner_(std::move(planner)), options_(options), metrics_(metrics) {
  const uint32_t n = std::max<uint32_t>(1, options_.threads);
  for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { Worker(); });
}

PlanWindow::~PlanWindow() { Stop(); }

uint64_t PlanWindow::head() const {
  absl::MutexLock lock(&mu_);
  return head_;
}

void PlanWindow::Get(uint64_t step, Done done) {
  absl::StatusOr<PlanPtr> ready;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      ready = absl::UnavailableError("the packer is shutting down; retry against its successor");
    } else {
      if (!any_request_ || step > head_) {
        head_ = step;
        any_request_ = true;
        if (metrics_) metrics_->client_step.Set(static_cast<double>(step));
      }
      Entry& e = entries_[step];
      work_.SignalAll();  // a new step to plan, or the window moved
      if (e.state != State::kDone) {
        e.waiters.push_back(std::move(done));
        UpdateDepth();
        return;
      }
      if (e.status.ok()) {
        ready = e.plan;
      } else {
        ready = e.status;
      }
      UpdateDepth();
    }
  }
  done(std::move(ready));
}

absl::StatusOr<PlanPtr> PlanWindow::GetBlocking(uint64_t step) {
  absl::Notification n;
  absl::StatusOr<PlanPtr> out;
  Get(step, [&](absl::StatusOr<PlanPtr> r) {
    out = std::move(r);
    n.Notify();
  });
  n.WaitForNotification();
  return out;
}

PlanPtr PlanWindow::Peek(uint64_t step) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(step);
  if (it == entries_.end() || it->second.state != State::kDone) return nullptr;
  return it->second.plan;
}

bool PlanWindow::NextStep(uint64_t* step) {
  for (auto& [s, e] : entries_) {
    if (e.state == State::kQueued) {
      *step = s;
      return true;
    }
  }
  if (!any_request_) return false;
  for (uint64_t s = head_; s < head_ + options_.window; ++s) {
    if (entries_.count(s)) continue;
    if (!planner_->job().CheckStep(s).ok()) return false;  // past the dataset's end
    entries_[s];
    *step = s;
    return true;
  }
  return false;
}

void PlanWindow::Evict() {
  while (!entries_.empty()) {
    auto it = entries_.begin();
    if (it->first + options_.window >= head_ || it->second.state != State::kDone) break;
    entries_.erase(it);
  }
}

void PlanWindow::UpdateDepth() {
  if (metrics_ == nullptr) return;
  uint32_t depth = 0;
  for (auto it = entries_.lower_bound(head_);
       it != entries_.end() && it->first < head_ + options_.window; ++it) {
    if (it->second.state == State::kDone && it->second.status.ok()) ++depth;
  }
  metrics_->window_depth.Set(depth);
}

void PlanWindow::CountSources(const StepPlanData& d) {
  const Job& job = planner_->job();
  const uint32_t S = job.num_sources();
  std::vector<uint32_t> samples(S, 0);
  for (const PlannedSample& ps : d.samples) samples[ps.source] += ps.piece == 0;
  // Epochs drawn through the step: each source's samples drawn so far over
  // its source-epoch (both streams' parts together).
  std::vector<double> epochs(S, 0);
  const auto& b = job.config().batch();
  const uint64_t next = d.step + 1;
  if (const Mixture* m = job.mixture()) {
    for (uint32_t i = 0; i < S; ++i) {
      double drawn = 0, epoch = 0;
      for (const bool vl : {false, true}) {
        const SourcePart& part = m->source(i).part[vl];
        if (part.slot < 0) continue;
        drawn += static_cast<double>(m->Before(vl, i, next));
        epoch += static_cast<double>(part.epoch_size);
      }
      epochs[i] = epoch > 0 ? drawn / epoch : 0;
    }
  } else {
    const double n[2] = {static_cast<double>(job.text_samples().size()),
                         static_cast<double>(job.vl_samples().size())};
    const double per[2] = {double(b.text_samples_per_step()), double(b.vl_samples_per_step())};
    for (uint32_t i = 0; i < 2; ++i) epochs[i] = n[i] > 0 ? next * per[i] / n[i] : 0;
  }
  metrics_->SourcesPlanned(d.step, samples, epochs);
}

void PlanWindow::Worker() {
  while (true) {
    uint64_t step = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && !NextStep(&step)) work_.Wait(&mu_);
      if (stopping_) return;
      entries_[step].state = State::kRunning;
    }
    auto data = std::make_shared<StepPlanData>();
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status status = planner_->Plan(step, data.get());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    data->plan_seconds = seconds;
    if (metrics_) {
      if (status.ok()) {
        metrics_->plan_seconds.Observe(seconds);
        metrics_->steps_planned.Increment();
        metrics_->samples_planned.Increment(static_cast<double>(data->samples.size()));
        metrics_->imbalance_vit.Set(data->vit.imbalance);
        metrics_->imbalance_llm.Set(data->llm.imbalance);
        metrics_->imbalance_before_vit.Set(data->vit.imbalance_before);
        metrics_->imbalance_before_llm.Set(data->llm.imbalance_before);
        if (data->has_audio) {
          metrics_->imbalance_audio.Set(data->audio_phase.imbalance);
          metrics_->imbalance_before_audio.Set(data->audio_phase.imbalance_before);
        }
        metrics_->inter_node_bytes.Observe(static_cast<double>(data->inter_node_bytes));
        metrics_->intra_node_bytes.Observe(static_cast<double>(data->intra_node_bytes));
        metrics_->remote_load_bytes.Observe(static_cast<double>(data->remote_load_bytes));
        const OverflowCounts& o = data->overflow;
        if (o.deferred_out) metrics_->overflow_deferred.Increment(o.deferred_out);
        if (o.split_documents) metrics_->overflow_split.Increment(o.split_documents);
        if (o.truncated) metrics_->overflow_truncated.Increment(o.truncated);
        if (o.skipped) metrics_->overflow_skipped.Increment(o.skipped);
        if (o.fallback_packing) metrics_->overflow_fallback_steps.Increment();
        metrics_->deferred_samples.Set(static_cast<double>(o.deferred_out));
        if (data->rearrangement == "fast") {
          metrics_->rearrangement_fast.Increment();
        } else if (data->rearrangement == "ilp optimal") {
          metrics_->rearrangement_ilp_optimal.Increment();
        } else if (!data->rearrangement.empty()) {
          metrics_->rearrangement_ilp_fast_kept.Increment();
        }
        CountSources(*data);
        if (planner_->job().homes() != nullptr) {
          const StepLocality l = MeasureStepLocality(planner_->job().index(), *data);
          metrics_->locality_local_items.Increment(static_cast<double>(l.items - l.remote_items));
          metrics_->locality_remote_items.Increment(static_cast<double>(l.remote_items));
          metrics_->locality_remote_member_bytes.Observe(
              static_cast<double>(l.remote_member_bytes));
          if (data->vit.lower_bound > 0) {
            metrics_->locality_vit_over_lower_bound.Set(data->vit.max / data->vit.lower_bound);
          }
        }
      } else {
        metrics_->plan_failures.Increment();
      }
    }
    std::vector<Done> waiters;
    absl::StatusOr<PlanPtr> result =
        status.ok() ? absl::StatusOr<PlanPtr>(std::move(data)) : absl::StatusOr<PlanPtr>(status);
    {
      absl::MutexLock lock(&mu_);
      Entry& e = entries_[step];
      e.state = State::kDone;
      e.status = status;
      if (status.ok()) e.plan = *result;
      waiters.swap(e.waiters);
      Evict();
      UpdateDepth();
      work_.SignalAll();
    }
    for (Done& w : waiters) w(result);
    if (!status.ok()) continue;
    Planned planned;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || !on_planned_) continue;
      planned = on_planned_;
      ++planned_calls_;
    }
    planned(step, *result);
    absl::MutexLock lock(&mu_);
    --planned_calls_;
  }
}

void PlanWindow::SetOnPlanned(Planned planned) {
  absl::MutexLock lock(&mu_);
  on_planned_ = std::move(planned);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return planned_calls_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

bool PlanWindow::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

void PlanWindow::Stop() {
  std::vector<Done> failed;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    work_.SignalAll();
    for (auto& [s, e] : entries_) {
      for (Done& w : e.waiters) failed.push_back(std::move(w));
      e.waiters.clear();
    }
  }
  for (Done& w : failed) w(absl::UnavailableError("the packer is shutting down; retry"));
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

}  // namespace tutti::packer
