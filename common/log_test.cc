#include "common/log.h"

#include "absl/time/civil_time.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

absl::Time Noon() {
  return absl::FromCivil(absl::CivilSecond(2026, 12, 1, 12, 0, 0), absl::UTCTimeZone()) +
         absl::Microseconds(250);
}

TEST(Log, TextLineHasTimestampLevelComponentAndFields) {
  EXPECT_EQ(FormatLogLine(Noon(), LogLevel::kWarning, "stager.staging", "staging failed",
                          {{"shard", "a.tar"}, {"bytes", 4096}, {"cause", "no space left"}},
                          LogFormat::kText),
            "2026-12-01T12:00:00.000250Z WARN  stager.staging staging failed shard=a.tar "
            "bytes=4096 cause=\"no space left\"\n");
}

TEST(Log, JsonLineIsOneEscapedObject) {
  EXPECT_EQ(FormatLogLine(Noon(), LogLevel::kError, "packer", "bad \"name\"\n",
                          {{"member", "x\ty"}}, LogFormat::kJson),
            "{\"ts\":\"2026-12-01T12:00:00.000250Z\",\"level\":\"error\",\"component\":"
            "\"packer\",\"msg\":\"bad \\\"name\\\"\\n\",\"member\":\"x\\ty\"}\n");
}

TEST(Log, TextValuesThatCouldBreakTheLineAreQuoted) {
  const std::string line =
      FormatLogLine(Noon(), LogLevel::kInfo, "c", "m", {{"a", ""}, {"b", "k=v"}, {"c", "x\ny"}},
                    LogFormat::kText);
  EXPECT_NE(line.find("a=\"\" b=\"k=v\" c=\"x\\ny\"\n"), std::string::npos) << line;
}

TEST(Log, ParsesLevelsAndFormatsAndNamesBadValues) {
  EXPECT_EQ(*ParseLogLevel("WARN"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  const auto bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'loud'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("debug, info, warning, error"), std::string::npos);
  EXPECT_FALSE(ParseLogFormat("xml").ok());
}

TEST(Log, RateLimitLetsABurstThroughThenCountsTheRest) {
  LogRateLimit limit(absl::Hours(1), 3);
  uint64_t suppressed = 99;
  int allowed = 0;
  for (int i = 0; i < 10; ++i) allowed += limit.Allow(&suppressed) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  LogRateLimit quick(absl::ZeroDuration(), 1);
  EXPECT_TRUE(quick.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);
}

TEST(Log, RateLimitReportsHowManyWereHeldBack) {
  LogRateLimit limit(absl::Milliseconds(50), 1);
  uint64_t suppressed = 0;
  ASSERT_TRUE(limit.Allow(&suppressed));
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(limit.Allow(&suppressed));
  absl::SleepFor(absl::Milliseconds(60));
  ASSERT_TRUE(limit.Allow(&suppressed));
  EXPECT_EQ(suppressed, 4u);
}

}  // namespace
}  // namespace tutti
