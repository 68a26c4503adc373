// The batch window's moves: ranks that come back at different steps (a job
// resumed from a checkpoint, a stager restarted under a running job), in any
// order, each served while every step in use lies within the window.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/stager/window/batch_window.h"
#include "services/stager/window/batch_window_test_rig.h"

namespace tutti::stager {
namespace {

using window_test::Answer;
using window_test::Rig;
using window_test::RunAnswers;

// A rank's process taking its steps one after another: it releases each
// before it asks for the next or, like a loader that prefetches, only once
// it has the next.
struct Runner {
  uint32_t rank;
  uint64_t next;  // the step it asks for next
  bool prefetch = false;
  Answer answer;  // the answer to its request in flight
  bool asked = false;
  std::optional<uint64_t> held;  // with prefetch: the step it still holds
  std::vector<uint64_t> got;     // the steps it was handed, in order
  absl::Status error;
};

// What the stager's plan intake does: plans for every step the window may
// hand out, their shards staged.
void FollowWindow(Rig& rig) {
  uint64_t to = 0;
  rig.window.TakeMoved(&to);
  const uint64_t base = rig.window.base();
  for (uint64_t s = base; s < base + 2 * uint64_t{rig.window.options().window}; ++s) {
    rig.Plan(s);
    rig.shards[absl::StrCat("s", s, ".tar")] = ShardState::kStaged;
  }
}

void Round(Rig& rig, BatchWindow::Callbacks* cbs) {
  FollowWindow(rig);
  rig.Round(cbs);
  rig.BuildAll(cbs);
  RunAnswers(*cbs);
}

void Ask(Rig& rig, Runner& r, BatchWindow::Callbacks* cbs) {
  bool moved = false;
  if (absl::Status s = rig.window.Admit(r.next, r.rank, &moved); !s.ok()) {
    r.error = s;
    return;
  }
  r.answer = Answer{};
  rig.window.Acquire(r.next, r.rank, 0, rig.now, r.answer.Callback(), cbs);
  r.asked = true;
  RunAnswers(*cbs);
}

// Scheduler rounds (no time passes) until every runner took its steps up to
// `end` (exclusive), or failed, or 100 rounds passed.
void RunTo(Rig& rig, const std::vector<Runner*>& runners, uint64_t end,
           BatchWindow::Callbacks* cbs) {
  for (int round = 0; round < 100; ++round) {
    bool done = true;
    for (Runner* r : runners) {
      if (!r->error.ok()) continue;
      if (r->asked && r->answer.got.has_value()) {
        r->asked = false;
        if (!r->answer.got->ok()) {
          r->error = r->answer.got->status();
          continue;
        }
        r->got.push_back(r->next);
        if (r->held) rig.window.Release(*r->held, r->rank, cbs);
        r->held = r->next;
        if (!r->prefetch || r->next + 1 == end) {
          rig.window.Release(r->next, r->rank, cbs);
          r->held.reset();
        }
        RunAnswers(*cbs);
        ++r->next;
      }
      if (!r->asked && r->next < end) Ask(rig, *r, cbs);
      done &= r->next >= end;
    }
    if (done) return;
    Round(rig, cbs);
  }
}

// Steps [from, end).
std::vector<uint64_t> Steps(uint64_t from, uint64_t end) {
  std::vector<uint64_t> v;
  for (uint64_t s = from; s < end; ++s) v.push_back(s);
  return v;
}

// Rank 2 comes back to a fresh window asking for step `a`; a second later
// rank 3 asks for step `b`. Both are served, and then each takes its next
// steps.
void ComeBack(uint64_t a, uint64_t b, bool prefetch, uint32_t window = 2) {
  SCOPED_TRACE(absl::StrCat("window ", window, ": rank 2 asks for step ", a,
                            ", then rank 3 for step ", b,
                            prefetch ? ", each asking for its next step before releasing" : ""));
  BatchWindowOptions o = Rig::Options();
  o.window = window;
  Rig rig(o);
  BatchWindow::Callbacks cbs;
  Runner r2{2, a, prefetch}, r3{3, b, prefetch};
  Ask(rig, r2, &cbs);
  Round(rig, &cbs);
  rig.now += absl::Seconds(1);
  Ask(rig, r3, &cbs);
  const uint64_t end = std::max(a, b) + 6;
  RunTo(rig, {&r2, &r3}, end, &cbs);
  EXPECT_TRUE(r2.error.ok()) << r2.error;
  EXPECT_TRUE(r3.error.ok()) << r3.error;
  EXPECT_EQ(r2.got, Steps(a, end)) << rig.window.InUse();
  EXPECT_EQ(r3.got, Steps(b, end)) << rig.window.InUse();
}

TEST(BatchWindowMoveTest, TwoRanksOneStepApartAreBothServedInEitherOrder) {
  for (bool prefetch : {false, true}) {
    ComeBack(20, 19, prefetch);  // the later step first: the window moves back for the earlier
    ComeBack(19, 20, prefetch);
    ComeBack(8, 7, prefetch);
    ComeBack(7, 8, prefetch);
    ComeBack(4, 3, prefetch);  // one inside the first window, one beyond it
    ComeBack(3, 4, prefetch);
  }
}

TEST(BatchWindowMoveTest, RanksAnyNumberOfStepsApartInsideTheWindowAreServed) {
  for (uint32_t window : {2u, 4u}) {
    for (bool prefetch : {false, true}) {
      for (uint64_t skew = 1; skew < window; ++skew) {
        ComeBack(30 + skew, 30, prefetch, window);
        ComeBack(30, 30 + skew, prefetch, window);
        ComeBack(skew, 0, prefetch, window);
        ComeBack(0, skew, prefetch, window);
      }
    }
  }
  // Steps handed out lie within base .. base + 2 x window - 1: a rank that
  // releases each batch before asking for the next may be up to 2 x window -
  // 1 steps from another.
  for (uint64_t skew = 2; skew < 4; ++skew) {
    ComeBack(30 + skew, 30, false);
    ComeBack(30, 30 + skew, false);
  }
}

TEST(BatchWindowMoveTest, AWaitingRankDoesNotKeepTheWindowFromTheStepAnotherNeeds) {
  // Rank 2 waits for step 20 (no plan for it yet) when rank 3 asks for step 18.
  Rig rig;
  BatchWindow::Callbacks cbs;
  Runner r2{2, 20}, r3{3, 18};
  Ask(rig, r2, &cbs);
  EXPECT_EQ(rig.window.base(), 20u);
  bool moved = false;
  ASSERT_TRUE(rig.window.Admit(18, 3, &moved).ok());
  EXPECT_TRUE(moved);  // plan intake restarts at the window's first step
  EXPECT_EQ(rig.window.base(), 18u);
  Ask(rig, r3, &cbs);
  RunTo(rig, {&r2, &r3}, 24, &cbs);
  EXPECT_EQ(r2.got, Steps(20, 24));
  EXPECT_EQ(r3.got, Steps(18, 24));
}

TEST(BatchWindowMoveTest, RanksTooFarApartWaitAndAreToldWhy) {
  Rig rig;
  BatchWindow::Callbacks cbs;
  // Rank 2 holds step 10; rank 3 asks for step 14, four steps on: the
  // window (10..13) cannot hand out both.
  Runner r2{2, 10}, r3{3, 14};
  Ask(rig, r2, &cbs);
  for (int i = 0; i < 3 && !r2.answer.got; ++i) Round(rig, &cbs);
  ASSERT_TRUE(r2.answer.got.has_value() && r2.answer.got->ok());
  Ask(rig, r3, &cbs);
  rig.now += absl::Seconds(6);  // past the default acquire timeout (5 s)
  Round(rig, &cbs);
  ASSERT_TRUE(r3.answer.got.has_value());
  const absl::Status far = r3.answer.got->status();
  EXPECT_EQ(far.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(far.message().find("was not ready within"), std::string::npos) << far;
  EXPECT_NE(far.message().find("rank 2 holds step 10"), std::string::npos) << far;
  // Rank 3 at step 12, inside the window but beyond the steps being built
  // (10..11), waits for rank 2 to release step 10; the message says so.
  Runner r3b{3, 12};
  Ask(rig, r3b, &cbs);
  rig.now += absl::Seconds(6);
  Round(rig, &cbs);
  ASSERT_TRUE(r3b.answer.got.has_value());
  const absl::Status ahead = r3b.answer.got->status();
  EXPECT_EQ(ahead.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(ahead.message().find("rank 2 holds step 10"), std::string::npos) << ahead;
  EXPECT_EQ(ahead.message().find("shards"), std::string::npos) << ahead;
  // Once rank 2 moves on, rank 3 is served.
  rig.window.Release(10, 2, &cbs);
  Runner r2b{2, 11}, r3c{3, 12};
  RunTo(rig, {&r2b, &r3c}, 15, &cbs);
  EXPECT_EQ(r2b.got, Steps(11, 15));
  EXPECT_EQ(r3c.got, Steps(12, 15));
}

}  // namespace
}  // namespace tutti::stager
