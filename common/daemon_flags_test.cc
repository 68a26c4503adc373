#include "common/daemon_flags.h"

#include <cstdio>
#include <cstdlib>

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
        // The help text is not wanted here. (GoogleTest's CaptureStdout would leave its
        // file in /tmp: the child exits before the capture is read back.)
        if (std::freopen("/dev/null", "w", stdout) == nullptr) std::exit(3);
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

TEST(DaemonFlagsTest, AddressesAreCheckedNamingTheFlagAndTheForms) {
  for (const char* ok : {"127.0.0.1:0", "0.0.0.0:9470", "[::]:7070", "[::1]:1", "node-3:65535",
                         "unix:///run/tutti/stager.sock", "unix:relative.sock"}) {
    EXPECT_TRUE(CheckAddressFlag("listen", ok, AddressUse::kServe, true).ok()) << ok;
  }
  struct Bad {
    const char* text;
    AddressUse use;
    bool unix_socket;
    const char* why;
  };
  for (const Bad& b : {
           Bad{"nonsense", AddressUse::kServe, false, "'nonsense' has no port"},
           Bad{"127.0.0.1:99999", AddressUse::kServe, false, "has a port out of range"},
           Bad{"127.0.0.1:0", AddressUse::kConnect, true, "has a port out of range"},
           Bad{"127.0.0.1:http", AddressUse::kServe, false, "has no numeric port"},
           Bad{"127.0.0.1:", AddressUse::kServe, false, "has no numeric port"},
           Bad{":9470", AddressUse::kServe, false, "has no host"},
           Bad{"", AddressUse::kConnect, true, "has no port"},
           Bad{"::1:80", AddressUse::kServe, false, "needs brackets"},
           Bad{"[::1:80", AddressUse::kServe, false, "unclosed ["},
           Bad{"unix:", AddressUse::kServe, true, "names no socket path"},
           Bad{"unix:///", AddressUse::kServe, true, "names no socket path"},
           Bad{"unix:///x.sock", AddressUse::kServe, false, "cannot be a Unix socket"},
       }) {
    const absl::Status s = CheckAddressFlag("metrics", b.text, b.use, b.unix_socket);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.text;
    EXPECT_NE(s.message().find(b.why), std::string::npos) << b.text << ": " << s.message();
    EXPECT_EQ(s.message().rfind("--metrics '", 0), 0u) << s.message();
    EXPECT_NE(s.message().find(b.use == AddressUse::kServe ? "PORT 0..65535 (0 = any free port)"
                                                           : "PORT 1..65535"),
              std::string::npos)
        << s.message();
  }
}

}  // namespace
}  // namespace tutti
