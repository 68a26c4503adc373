// What the batch window's tests share: a batch the test builds when it says
// so, and a window of node 1 (ranks 2 and 3) whose clock, plans and shard
// states the test controls.
#ifndef TUTTI_SERVICES_STAGER_WINDOW_BATCH_WINDOW_TEST_RIG_H_
#define TUTTI_SERVICES_STAGER_WINDOW_BATCH_WINDOW_TEST_RIG_H_

#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/stager/window/batch_window.h"

namespace tutti::stager::window_test {

// A batch that is "built" when the test says so.
class TestBatch final : public WindowBatch {
 public:
  TestBatch(uint64_t step, uint32_t rank, uint64_t bytes)
      : step_(step), rank_(rank), bytes_(bytes) {
    descriptor_.set_step(step);
    descriptor_.set_rank(rank);
  }
  uint64_t step() const override { return step_; }
  uint32_t rank() const override { return rank_; }
  uint64_t bytes() const override { return bytes_; }
  absl::Status Start() override {
    started_ = true;
    return absl::OkStatus();
  }
  absl::Time started() const override { return absl::UnixEpoch(); }
  absl::Time deadline() const override { return absl::UnixEpoch() + absl::Seconds(5); }
  void Expire() override { expired_ = true; }
  void Discard() override { discarded_ = true; }
  const v1::BatchDescriptor& descriptor() const override { return descriptor_; }
  std::string PendingSummary() const override { return "1 member read"; }

  bool started_ = false, expired_ = false, discarded_ = false, built_ = false;

 private:
  uint64_t step_;
  uint32_t rank_;
  uint64_t bytes_;
  v1::BatchDescriptor descriptor_;
};

inline const absl::Time kT0 = absl::UnixEpoch() + absl::Hours(1);

// A window of node 1 (ranks 2 and 3), with a clock, plans and shard states
// the test controls.
struct Rig {
  NodeRanks ranks = *NodeRanks::Make(1, 2, 4);
  PlanIntake intake{4, 0, ""};
  StagerMetrics metrics{std::make_shared<prometheus::Registry>()};
  BatchWindow window;
  std::map<std::string, ShardState> shards;
  std::map<std::pair<uint64_t, uint32_t>, std::shared_ptr<TestBatch>> batches;
  uint64_t batch_bytes = 100;
  absl::Time now = kT0;

  explicit Rig(BatchWindowOptions o = Options()) : window(o, &ranks, &metrics) {}
  static BatchWindowOptions Options() {
    BatchWindowOptions o;
    o.window = 2;
    o.memory_budget_bytes = 1000;
    o.stage_wait = absl::Seconds(10);
    o.default_acquire_timeout_ms = 5000;
    return o;
  }

  // Step `step`'s plan for ranks 2 and 3, staging shard "s<step>.tar".
  void Plan(uint64_t step, std::vector<uint32_t> ranks = {2, 3}, absl::Status bad = {}) {
    auto plan = std::make_shared<v1::StepPlan>();
    plan->set_step(step);
    plan->add_shards()->set_name(absl::StrCat("s", step, ".tar"));
    for (uint32_t r : ranks) plan->add_ranks()->set_rank(r);
    shards.emplace(plan->shards(0).name(), ShardState::kPending);
    std::vector<const v1::ShardRef*> stage = {&plan->shards(0)};
    window.AddPlan(std::move(plan), std::move(stage), bad, now);
  }
  BatchWindow::ShardStateOf State() {
    return
        [this](const std::string& s) { return shards.count(s) ? shards[s] : ShardState::kUnknown; };
  }
  // One scheduler round: start builds, then deadlines.
  void Round(BatchWindow::Callbacks* cbs) {
    window.StartBuilds(
        now, State(),
        [this](const std::shared_ptr<const v1::StepPlan>& plan,
               int index) -> absl::StatusOr<std::shared_ptr<WindowBatch>> {
          auto b =
              std::make_shared<TestBatch>(plan->step(), plan->ranks(index).rank(), batch_bytes);
          batches[{plan->step(), b->rank()}] = b;
          return std::shared_ptr<WindowBatch>(b);
        },
        cbs);
    window.Tick(now, intake, State(), cbs);
  }
  size_t Started() const {
    size_t n = 0;
    for (const auto& [key, b] : batches) n += b->started_;
    return n;
  }
  void Built(uint64_t step, uint32_t rank, BatchWindow::Callbacks* cbs) {
    ASSERT_TRUE(window.Ready(batches.at({step, rank}), now, cbs));
  }

  // ---- leases
  // Plans for steps [from, to) whose shards are staged.
  void Staged(uint64_t from, uint64_t to) {
    for (uint64_t s = from; s < to; ++s) {
      Plan(s);
      shards[absl::StrCat("s", s, ".tar")] = ShardState::kStaged;
    }
  }
  // Every batch started and not yet built is built.
  void BuildAll(BatchWindow::Callbacks* cbs) {
    for (auto& [key, b] : batches) {
      if (b->started_ && !b->built_) {
        b->built_ = true;
        window.Ready(b, now, cbs);
      }
    }
  }
  // Rank `rank`'s process (incarnation 0xA0 + rank), a client that renews its
  // leases, calls.
  void Hello(uint32_t rank, BatchWindow::Callbacks* cbs) {
    window.NewProcess(rank, 0xA0 + rank, cbs);
    window.Heard(rank, 0xA0 + rank, now, true);
  }
  // Ranks 2 and 3 (renewing clients) with staged plans for steps [0, to),
  // both holding step 0.
  void BothHoldStepZero(uint64_t to, BatchWindow::Callbacks* cbs) {
    Hello(2, cbs);
    Hello(3, cbs);
    Staged(0, to);
    for (uint32_t r : {2u, 3u}) ASSERT_TRUE(Take(0, r, cbs).ok());
  }
  // Its renewal of the holds of `steps`: the steps it lost.
  std::vector<uint64_t> Renew(uint32_t rank, std::vector<uint64_t> steps) {
    window.Heard(rank, 0xA0 + rank, now, true);
    std::vector<uint64_t> lost;
    window.Renew(rank, steps, now, &lost);
    return lost;
  }
  // Rank `rank` asks for `step`; the answer once built (after a scheduler round).
  absl::StatusOr<v1::BatchDescriptor> Take(uint64_t step, uint32_t rank,
                                           BatchWindow::Callbacks* cbs) {
    bool moved = false;
    if (absl::Status s = window.Admit(step, rank, &moved); !s.ok()) return s;
    std::optional<absl::StatusOr<v1::BatchDescriptor>> got;
    window.Acquire(
        step, rank, 0, now, [&](absl::StatusOr<v1::BatchDescriptor> r) { got = r; }, cbs);
    Round(cbs);
    BuildAll(cbs);
    for (auto& cb : *cbs) cb();
    cbs->clear();
    if (!got) return absl::UnavailableError(absl::StrCat("step ", step, " still waits"));
    return *got;
  }
  // `d` passes in scheduler rounds of one second, `each` running before each.
  void Pass(absl::Duration d, BatchWindow::Callbacks* cbs,
            const std::function<void()>& each = nullptr) {
    for (const absl::Time end = now + d; now < end;) {
      now += absl::Seconds(1);
      if (each) each();
      Round(cbs);
      BuildAll(cbs);
    }
  }
  double Expired() { return metrics.leases_expired.Value(); }
  double Lapsed() { return metrics.ranks_lapsed.Value(); }
};

// The answer a client got, once its callbacks ran.
struct Answer {
  std::optional<absl::StatusOr<v1::BatchDescriptor>> got;
  BatchWindow::Answer Callback() {
    return [this](absl::StatusOr<v1::BatchDescriptor> r) { got = std::move(r); };
  }
};

inline void RunAnswers(BatchWindow::Callbacks& cbs) {
  for (auto& cb : cbs) cb();
  cbs.clear();
}

}  // namespace tutti::stager::window_test

#endif  // TUTTI_SERVICES_STAGER_WINDOW_BATCH_WINDOW_TEST_RIG_H_
