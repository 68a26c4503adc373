// The serialized plans the packer keeps (the packer's use of them and its
// per-connection state over rounds of plan streams: packer_test.cc).
#include "services/packer/served_plans.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

ServedPlans::Bytes Bytes(size_t n) { return std::make_shared<const std::string>(n, 'x'); }

TEST(ServedPlansTest, KeysAreSortedWithoutDuplicates) {
  EXPECT_EQ(ServedPlans::Key(std::vector<uint32_t>{3, 1, 3, 2}), (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_TRUE(ServedPlans::Key({}).empty());
}

TEST(ServedPlansTest, TheFirstBytesKeptAreServedAgain) {
  ServedPlans p({.max_bytes = 1000, .keep_behind = 4});
  EXPECT_EQ(p.Find(1, {0}), nullptr);
  auto a = Bytes(10);
  EXPECT_EQ(p.Insert(1, {0}, a), a);
  EXPECT_EQ(p.Insert(1, {0}, Bytes(10)), a);  // built twice at once: one is kept
  EXPECT_EQ(p.Find(1, {0}), a);
  EXPECT_EQ(p.Find(1, {1}), nullptr);
  EXPECT_EQ(p.Find(2, {0}), nullptr);
  EXPECT_EQ(p.bytes(), 10u);
  EXPECT_EQ(p.entries(), 1u);
}

TEST(ServedPlansTest, StepsBehindTheWindowAndBytesOverTheBudgetAreDropped) {
  ServedPlans p({.max_bytes = 100, .keep_behind = 2});
  for (uint64_t s = 0; s < 3; ++s) p.Insert(s, {0}, Bytes(10));
  EXPECT_EQ(p.steps(), 3u);
  p.Insert(5, {0}, Bytes(10));  // steps 0..2 are more than 2 behind 5
  EXPECT_EQ(p.steps(), 1u);
  EXPECT_EQ(p.bytes(), 10u);
  EXPECT_EQ(p.Find(2, {0}), nullptr);
  auto late = Bytes(10);
  EXPECT_EQ(p.Insert(1, {0}, late), late);  // served, not kept
  EXPECT_EQ(p.Find(1, {0}), nullptr);
  // Over the budget: the lowest step goes first, the one being added last.
  for (uint32_t r = 1; r < 5; ++r) p.Insert(4, {r}, Bytes(10));
  EXPECT_EQ(p.bytes(), 50u);
  p.Insert(5, {1}, Bytes(60));
  EXPECT_EQ(p.Find(4, {1}), nullptr);
  EXPECT_NE(p.Find(5, {1}), nullptr);
  EXPECT_EQ(p.bytes(), 70u);
  // A step alone over the budget: what does not fit is served, not kept.
  EXPECT_EQ(p.Insert(5, {2}, Bytes(40))->size(), 40u);
  EXPECT_EQ(p.Find(5, {2}), nullptr);
  EXPECT_LE(p.bytes(), 100u);
  EXPECT_EQ(p.Insert(6, {0}, Bytes(101))->size(), 101u);
  EXPECT_EQ(p.Find(6, {0}), nullptr);
}

// The first request of a (step, rank set) builds it; requests for the same
// bytes meanwhile wait for that build (they do not build again) and all get
// the same bytes; a request for other bytes is not held up.
TEST(ServedPlansTest, RequestsDuringABuildWaitForItInsteadOfBuildingAgain) {
  ServedPlans p({.max_bytes = 1000, .keep_behind = 4});
  std::vector<ServedPlans::Bytes> got;
  auto collect = [&got](absl::StatusOr<ServedPlans::Bytes> b) {
    ASSERT_TRUE(b.ok());
    got.push_back(*b);
  };
  bool build = false;
  ServedPlans::Done d = collect;
  EXPECT_EQ(p.Serve(2, {0, 1}, &d, &build), nullptr);
  EXPECT_TRUE(build);
  for (int i = 0; i < 3; ++i) {
    ServedPlans::Done again = collect;
    EXPECT_EQ(p.Serve(2, {0, 1}, &again, &build), nullptr);
    EXPECT_FALSE(build) << "request " << i << " would build the same bytes again";
  }
  absl::Status other_status;
  ServedPlans::Done other = [&other_status](absl::StatusOr<ServedPlans::Bytes> b) {
    other_status = b.status();
  };
  EXPECT_EQ(p.Serve(2, {1}, &other, &build), nullptr);
  EXPECT_TRUE(build);  // another rank set is built by its own request
  EXPECT_EQ(p.building(), 2u);
  EXPECT_TRUE(got.empty());
  auto bytes = Bytes(10);
  p.Complete(2, {0, 1}, bytes, /*precomputed=*/false).Run();
  ASSERT_EQ(got.size(), 4u);
  for (const auto& b : got) EXPECT_EQ(b, bytes);
  ServedPlans::Done later = collect;
  EXPECT_EQ(p.Serve(2, {0, 1}, &later, &build), bytes);  // kept: served at once
  EXPECT_TRUE(later != nullptr);                          // and not queued
  // A failed build reaches its waiters and keeps nothing.
  p.Complete(2, {1}, absl::UnavailableError("stopping"), /*precomputed=*/false).Run();
  EXPECT_EQ(other_status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(p.building(), 0u);
  EXPECT_EQ(p.Find(2, {1}), nullptr);
}

// Precomputed bytes are kept only while they fit (they never drop what
// requests built), are not built twice, and not for steps behind the window.
TEST(ServedPlansTest, PrecomputedBytesAreKeptOnlyWhileTheyFit) {
  ServedPlans p({.max_bytes = 100, .keep_behind = 2});
  ASSERT_EQ(p.Insert(5, {9}, Bytes(30)) != nullptr, true);
  EXPECT_EQ(p.ClaimPrecompute(1, {0}), ServedPlans::Claim::kSkip);  // behind 5 by more than 2
  EXPECT_EQ(p.ClaimPrecompute(5, {9}), ServedPlans::Claim::kSkip);  // kept
  ASSERT_EQ(p.ClaimPrecompute(6, {0}), ServedPlans::Claim::kClaimed);
  EXPECT_EQ(p.ClaimPrecompute(6, {0}), ServedPlans::Claim::kSkip);  // being built
  bool build = true;
  std::vector<ServedPlans::Bytes> got;
  ServedPlans::Done d = [&got](absl::StatusOr<ServedPlans::Bytes> b) { got.push_back(*b); };
  EXPECT_EQ(p.Serve(6, {0}, &d, &build), nullptr);
  EXPECT_FALSE(build);  // the request waits for the precompute
  auto b = Bytes(30);
  p.Complete(6, {0}, b, /*precomputed=*/true).Run();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], b);
  EXPECT_EQ(p.Find(6, {0}), b);
  ASSERT_EQ(p.ClaimPrecompute(6, {1}), ServedPlans::Claim::kClaimed);
  p.Complete(6, {1}, Bytes(30), true).Run();
  EXPECT_EQ(p.bytes(), 90u);
  // Another 30 would not fit: the budget is full for precomputing.
  EXPECT_EQ(p.ClaimPrecompute(6, {2}), ServedPlans::Claim::kFull);
  // A precompute claimed before the budget filled is served, not kept.
  ServedPlans q({.max_bytes = 50, .keep_behind = 2});
  ASSERT_EQ(q.ClaimPrecompute(0, {0}), ServedPlans::Claim::kClaimed);
  ASSERT_EQ(q.ClaimPrecompute(0, {1}), ServedPlans::Claim::kClaimed);
  q.Complete(0, {0}, Bytes(30), true).Run();
  q.Complete(0, {1}, Bytes(30), true).Run();
  EXPECT_EQ(q.bytes(), 30u);
  EXPECT_EQ(q.Find(0, {1}), nullptr);
  EXPECT_NE(q.Find(0, {0}), nullptr);
}

// Requests that are all served from kept bytes still move the newest step:
// steps behind the window are dropped without a build.
TEST(ServedPlansTest, HitsMoveTheWindowToo) {
  ServedPlans p({.max_bytes = 1000, .keep_behind = 1});
  for (uint64_t s = 0; s < 4; ++s) {
    ASSERT_EQ(p.ClaimPrecompute(s, {0}), ServedPlans::Claim::kClaimed);
    p.Complete(s, {0}, Bytes(10), true).Run();
  }
  EXPECT_EQ(p.steps(), 4u);
  bool build = false;
  ServedPlans::Done d = [](absl::StatusOr<ServedPlans::Bytes>) {};
  EXPECT_NE(p.Serve(3, {0}, &d, &build), nullptr);
  EXPECT_EQ(p.steps(), 2u);  // 2 and 3
  EXPECT_EQ(p.Find(1, {0}), nullptr);
}

}  // namespace
}  // namespace tutti::packer
