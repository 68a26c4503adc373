#include "client/lease_keeper.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

// Records what each renewal named; answers with `lease` and `lost`.
struct Stager {
  absl::Mutex mu;
  std::vector<std::vector<uint64_t>> calls ABSL_GUARDED_BY(mu);
  std::vector<uint64_t> lost ABSL_GUARDED_BY(mu);
  absl::Status answer ABSL_GUARDED_BY(mu);

  LeaseKeeper::Renew Renew() {
    return [this](const std::vector<uint64_t>& steps, absl::Duration,
                  std::vector<uint64_t>* out) -> absl::StatusOr<absl::Duration> {
      absl::MutexLock l(&mu);
      calls.push_back(steps);
      if (!answer.ok()) return answer;
      *out = lost;
      return absl::Milliseconds(200);
    };
  }
  // Waits (up to a generous deadline) for a renewal after `after` calls that
  // names exactly `steps`.
  bool AwaitCall(size_t after, const std::vector<uint64_t>& steps) {
    absl::MutexLock l(&mu);
    auto seen = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      for (size_t i = after; i < calls.size(); ++i) {
        if (calls[i] == steps) return true;
      }
      return false;
    };
    const absl::Time end = absl::Now() + absl::Seconds(60);
    while (!seen() && absl::Now() < end)
      mu.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(1));
    return seen();
  }
  size_t Calls() {
    absl::MutexLock l(&mu);
    return calls.size();
  }
};

TEST(LeaseKeeperTest, RenewalsNameEveryStepHeldAndNoneDropped) {
  Stager stager;
  LeaseKeeper keeper(stager.Renew(), absl::Milliseconds(200));
  EXPECT_TRUE(stager.AwaitCall(0, {}));  // nothing held: still says the process lives
  keeper.Hold(3);
  keeper.Hold(4);
  EXPECT_TRUE(stager.AwaitCall(stager.Calls(), {3, 4}));
  keeper.Drop(3);
  EXPECT_TRUE(stager.AwaitCall(stager.Calls(), {4}));
  keeper.Hold(4);  // held twice: one Drop keeps it
  keeper.Drop(4);
  EXPECT_EQ(keeper.Held(), std::vector<uint64_t>{4});
  keeper.Drop(4);
  EXPECT_TRUE(keeper.Held().empty());
  EXPECT_GT(keeper.renewals(), 0u);
}

TEST(LeaseKeeperTest, AFailedRenewalIsTriedAgainAtTheNextInterval) {
  Stager stager;
  {
    absl::MutexLock l(&stager.mu);
    stager.answer = absl::UnavailableError("restarting");
  }
  auto keeper = std::make_unique<LeaseKeeper>(stager.Renew(), absl::Milliseconds(200));
  keeper->Hold(1);
  EXPECT_TRUE(stager.AwaitCall(0, {1}));
  EXPECT_TRUE(stager.AwaitCall(stager.Calls(), {1}));  // tried again
  EXPECT_EQ(keeper->renewals(), 0u);
  {
    absl::MutexLock l(&stager.mu);
    stager.answer = absl::OkStatus();
    stager.lost = {1};
  }
  EXPECT_TRUE(stager.AwaitCall(stager.Calls(), {1}));
  keeper.reset();  // stops its thread
}

// The release of step 5 reaches the stager while a renewal naming step 5 is
// on its way; the stager answers that renewal that it no longer holds step
// 5, and the answer arrives before the release's own: not a loss.
TEST(LeaseKeeperTest, ARenewalCrossingAReleaseReportsNothingLost) {
  absl::Mutex mu;
  bool renewal_sent = false, released = false;
  LeaseKeeper keeper(
      [&](const std::vector<uint64_t>& steps, absl::Duration,
          std::vector<uint64_t>* lost) -> absl::StatusOr<absl::Duration> {
        absl::MutexLock l(&mu);
        if (steps != std::vector<uint64_t>{5} || renewal_sent) return absl::Milliseconds(200);
        renewal_sent = true;
        mu.Await(absl::Condition(&released));
        lost->push_back(5);  // released at the stager before this renewal
        return absl::Milliseconds(200);
      },
      absl::Milliseconds(200));
  keeper.Hold(5);
  {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(&renewal_sent));
  }
  const uint64_t before = keeper.renewals();
  absl::Status s = keeper.Release(5, [&] {
    {
      absl::MutexLock l(&mu);
      released = true;
    }
    // The renewal's answer arrives first.
    while (keeper.renewals() == before) absl::SleepFor(absl::Milliseconds(1));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(keeper.lost_reported(), 0u);
  EXPECT_TRUE(keeper.Held().empty());
}

TEST(LeaseKeeperTest, AStepStillHeldThatTheStagerLostIsReportedOnce) {
  Stager stager;
  {
    absl::MutexLock l(&stager.mu);
    stager.lost = {7};
  }
  LeaseKeeper keeper(stager.Renew(), absl::Milliseconds(200));
  keeper.Hold(7);
  EXPECT_TRUE(stager.AwaitCall(0, {7}));
  EXPECT_TRUE(stager.AwaitCall(stager.Calls(), {7}));  // the first one's answer is in
  EXPECT_EQ(keeper.lost_reported(), 1u);
}

TEST(LeaseKeeperTest, TheIntervalIsAQuarterOfTheLease) {
  EXPECT_EQ(LeaseKeeper::IntervalFor(absl::Seconds(60)), absl::Seconds(15));
  EXPECT_EQ(LeaseKeeper::IntervalFor(absl::Milliseconds(100)), absl::Milliseconds(50));
}

}  // namespace
}  // namespace tutti
