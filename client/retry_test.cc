#include "client/retry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tutti {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

struct FakeClock {
  absl::Time now = absl::FromUnixSeconds(1000);
  std::vector<absl::Duration> sleeps;
  RetryClock clock() {
    return RetryClock{[this] { return now; },
                      [this](absl::Duration d) {
                        sleeps.push_back(d);
                        now += d;
                      }};
  }
};

RetryPolicy Policy() {
  return RetryPolicy{absl::Seconds(10), absl::Milliseconds(100), absl::Seconds(1)};
}

TEST(RetryUnavailable, RetriesUntilTheDaemonIsBack) {
  FakeClock fc;
  int calls = 0, attempts = 0;
  absl::Status s = RetryUnavailable(
      Policy(), "AcquireBatch",
      [&] { return ++calls < 4 ? absl::UnavailableError("connection refused") : absl::OkStatus(); },
      fc.clock(), &attempts);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(attempts, 4);
  EXPECT_THAT(fc.sleeps, ElementsAre(absl::Milliseconds(100), absl::Milliseconds(200),
                                     absl::Milliseconds(400)));
}

TEST(RetryUnavailable, BackoffIsCappedAndTheBudgetEndsIt) {
  FakeClock fc;
  int attempts = 0;
  absl::Status s = RetryUnavailable(
      Policy(), "GetJob from tutti-packerd at x:1",
      [&] { return absl::UnavailableError("connection refused"); }, fc.clock(), &attempts);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("GetJob from tutti-packerd at x:1: gave up after"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("connection refused"));
  for (absl::Duration d : fc.sleeps) EXPECT_LE(d, absl::Seconds(1));
  EXPECT_LE(fc.now - absl::FromUnixSeconds(1000), absl::Seconds(10));
  EXPECT_GT(attempts, 10);  // 0.1+0.2+0.4+0.8, then 1 s steps up to 10 s
}

TEST(RetryUnavailable, OtherErrorsReturnAtOnce) {
  FakeClock fc;
  int attempts = 0;
  absl::Status s = RetryUnavailable(
      Policy(), "x", [] { return absl::OutOfRangeError("end"); }, fc.clock(), &attempts);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(attempts, 1);
  EXPECT_TRUE(fc.sleeps.empty());
}

}  // namespace
}  // namespace tutti
