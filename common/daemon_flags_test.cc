#include "common/daemon_flags.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(uint32_t, test_threads, 4, "threads for the test");
ABSL_FLAG(bool, test_fast, false, "go fast");

namespace tutti {
namespace {

void Parse(std::vector<std::string> args) {
  std::vector<char*> argv;
  args.insert(args.begin(), "tutti-test");
  for (auto& a : args) argv.push_back(a.data());
  ParseDaemonFlags(static_cast<int>(argv.size()), argv.data(), "usage: tutti-test",
                   {"common/daemon_flags_test.cc"});
}

TEST(DaemonFlagsTest, ParsesEveryFormAFlagTakes) {
  Parse({"--test_threads=7", "--test_fast"});
  EXPECT_EQ(absl::GetFlag(FLAGS_test_threads), 7u);
  EXPECT_TRUE(absl::GetFlag(FLAGS_test_fast));
  Parse({"--test_threads", "9", "--notest_fast"});
  EXPECT_EQ(absl::GetFlag(FLAGS_test_threads), 9u);
  EXPECT_FALSE(absl::GetFlag(FLAGS_test_fast));
  Parse({"-test_threads=3", "--"});
  EXPECT_EQ(absl::GetFlag(FLAGS_test_threads), 3u);
}

TEST(DaemonFlagsTest, BadUsageExitsTwoNamingWhatIsWrong) {
  EXPECT_EXIT(Parse({"--no_such_flag=1"}), ::testing::ExitedWithCode(2),
              "tutti-test: unknown flag --no_such_flag \\(see --help\\)");
  EXPECT_EXIT(Parse({"--test_threads=lots"}), ::testing::ExitedWithCode(2),
              "--test_threads 'lots' is not valid");
  EXPECT_EXIT(Parse({"--test_threads"}), ::testing::ExitedWithCode(2),
              "--test_threads needs a value");
  EXPECT_EXIT(Parse({"stray"}), ::testing::ExitedWithCode(2), "unexpected argument 'stray'");
  EXPECT_EXIT(Parse({"--test_threads=-1"}), ::testing::ExitedWithCode(2), "test_threads");
}

TEST(DaemonFlagsTest, HelpListsOnlyTheDaemonsFlagsAndExitsZero) {
  EXPECT_EXIT(
      {
        ::testing::internal::CaptureStdout();
        Parse({"--help"});
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(Parse({"--version"}), ::testing::ExitedWithCode(0), "");
}

TEST(DaemonFlagsTest, RangesAreCheckedNamingTheFlagAndTheRange) {
  EXPECT_TRUE(CheckFlagRange("window", 4, 1, 256).ok());
  absl::Status s = CheckFlagRange("decode_threads", 100000, 0, 1024, "0 = one per CPU");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--decode_threads 100000 is out of range: use 0..1024 (0 = one per CPU)");
  EXPECT_EQ(*ByteSizeFlag("memory_budget", "8G", 16 << 20, uint64_t{1} << 50), 8ull << 30);
  auto small = ByteSizeFlag("memory_budget", "1K", 16 << 20, uint64_t{1} << 50);
  EXPECT_EQ(small.status().message(),
            "--memory_budget 1K is out of range: use 16.0 MiB to 1.0 PiB");
  EXPECT_EQ(*ByteSizeFlag("cache_capacity", "0", 64 << 20, uint64_t{1} << 50, "unlimited"), 0u);
  auto tiny = ByteSizeFlag("cache_capacity", "1K", 64 << 20, uint64_t{1} << 50, "unlimited");
  EXPECT_NE(tiny.status().message().find("or 0 = unlimited"), std::string::npos) << tiny.status();
  auto junk = ByteSizeFlag("block_size", "lots", 4096, 64 << 20);
  EXPECT_NE(junk.status().message().find("is not a size like 64K"), std::string::npos);
}

}  // namespace
}  // namespace tutti
