// `tutti bench load` as a user runs it, small: a real tutti-packerd, every
// client's calls answered, one JSON object per round with the documented
// fields, and a failing run (nothing listening) reported as such.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/process_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

TEST(BenchLoad, EveryClientIsAnsweredAndEachRoundReportsLatencyCpuAndMemory) {
  const std::string dir = MakeTempDir("bench_load");
  RunResult r = RunCommand({TuttiCli(), "bench", "load", "--clients=48", "--rounds=3", "--calls=4",
                            "--stream_plans=2", "--steps=2", "--seq_len=4096", "--json",
                            "--dir=" + dir, std::string("--packerd=") + Packerd(),
                            "--max_rss_growth_mib=256"},
                           absl::Seconds(240));
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<std::string> rounds;
  for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
    if (absl::StartsWith(line, "{\"round\":")) rounds.emplace_back(line);
  }
  ASSERT_EQ(rounds.size(), 3u) << r.output;
  for (const std::string& line : rounds) {
    // 48 clients x 4 calls: 2 GetPlans and 2 streams each, none failed.
    EXPECT_THAT(line, HasSubstr("\"clients\":48,"));
    EXPECT_THAT(line, HasSubstr("\"get_plan_calls\":96,"));
    EXPECT_THAT(line, HasSubstr("\"streams\":96,"));
    EXPECT_THAT(line, HasSubstr("\"errors\":0,"));
    for (const char* key :
         {"\"p50_ms\":", "\"p99_ms\":", "\"packer_cpu_cores\":", "\"packer_rss_bytes\":",
          "\"packer_rss_growth_bytes\":", "\"late_p99_ms\":", "\"packer_cpu_us_per_plan\":",
          "\"driver_cpu_cores\":", "\"packer_heap_in_use_bytes\":",
          "\"packer_heap_growth_bytes\":"}) {
      EXPECT_THAT(line, HasSubstr(key));
    }
    // The packer's heap in use, read from its /metrics (-1 if it could not be).
    const std::string heap_key = "\"packer_heap_in_use_bytes\":";
    const size_t at = line.find(heap_key);
    ASSERT_NE(at, std::string::npos);
    double heap = 0;
    ASSERT_TRUE(absl::SimpleAtod(
        line.substr(at + heap_key.size(), line.find(',', at) - at - heap_key.size()), &heap))
        << line;
    if (kHeapMetricsExported) {
      EXPECT_GT(heap, 1 << 20) << line;
    } else {
      EXPECT_EQ(heap, -1) << line;  // unknown: a sanitizer build exports no heap metric
    }
  }
  // The growth from the end of round 2 to the end of the last, checked
  // against the limit.
  EXPECT_THAT(rounds[1], HasSubstr("\"packer_rss_growth_bytes\":0,"));
  EXPECT_THAT(rounds[1], HasSubstr("\"packer_heap_growth_bytes\":0}"));
  EXPECT_THAT(r.output, HasSubstr("packer RSS from round 2 to round 3: "));
  EXPECT_THAT(r.output, HasSubstr("--max_rss_growth_mib 256.0): flat; heap in use "));
  if (!kHeapMetricsExported) {
    EXPECT_THAT(r.output, HasSubstr("heap in use unknown (the packer exports no "));
  }
  RemoveTree(dir);
}

// Without --dir the work directory is the benchmark's own: gone after a
// successful run, kept (and named) after a failed one.
TEST(BenchLoad, ItsOwnWorkDirectoryIsRemovedAfterASuccessfulRun) {
  const std::string tmp = MakeTempDir("bench_load_tmpdir");
  auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(tmp)) {
      names.push_back(e.path().filename().string());
    }
    return names;
  };
  RunResult r = RunCommand({TuttiCli(), "bench", "load", "--clients=4", "--rounds=1", "--calls=1",
                            "--stream_plans=1", "--steps=2", "--seq_len=4096",
                            std::string("--packerd=") + Packerd()},
                           absl::Seconds(120), {"TMPDIR=" + tmp});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(entries().empty()) << r.output;
  // A packer that cannot start: the directory stays, with the packer's log.
  r = RunCommand({TuttiCli(), "bench", "load", "--clients=4", "--rounds=1", "--steps=2",
                  "--seq_len=4096", "--packerd=/bin/false"},
                 absl::Seconds(120), {"TMPDIR=" + tmp});
  EXPECT_NE(r.status, 0) << r.output;
  const std::vector<std::string> kept = entries();
  ASSERT_EQ(kept.size(), 1u) << r.output;
  EXPECT_THAT(r.output, HasSubstr("kept " + tmp + "/" + kept[0]));
  RemoveTree(tmp);
}

TEST(BenchLoad, RefusesZeroClients) {
  RunResult r = RunCommand({TuttiCli(), "bench", "load", "--clients=0"}, absl::Seconds(30));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("must be positive"));
}

}  // namespace
}  // namespace tutti::e2e
