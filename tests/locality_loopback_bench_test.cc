// `tutti bench locality --loopback` as a user runs it, small: 4 real
// stagers as 4 nodes, 8 ranks, one epoch of a generated dataset, locality
// off and with one and two homes a shard. Read from the stagers' counters:
// without locality every node reads every shard its ranks name from the
// source (all of them here); with homes r x the dataset, what one stager
// sends another receives, no batch is short of a sample.
#include <regex>
#include <string>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_support.h"

namespace tutti::e2e {
namespace {

// The number after "key": in the run whose replication is `r`.
double Field(const std::string& json, int r, const std::string& key) {
  const std::regex run("\\{\"replication\":" + std::to_string(r) + ",[^}]*\\}");
  std::smatch m;
  if (!std::regex_search(json, m, run)) return -1;
  const std::string body = m.str();
  const std::regex field("\"" + key + "\":([-0-9.e+]+)");
  std::smatch f;
  double v = -1;
  if (!std::regex_search(body, f, field) || !absl::SimpleAtod(f[1].str(), &v)) return -1;
  return v;
}

TEST(LocalityLoopbackBench, SourceAndPeerBytesFromTheStagersCounters) {
  const std::string dir = MakeTempDir("loopback_bench");
  RunResult r =
      RunCommand({TuttiCli(), "bench", "locality", "--loopback", "--loopback-samples=96",
                  "--loopback-samples-per-shard=8", "--loopback-dir=" + dir + "/work", "--json"},
                 absl::Seconds(240));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string& out = r.output;
  for (int rep : {0, 1, 2}) {
    SCOPED_TRACE(rep);
    const double steps = Field(out, rep, "steps");
    ASSERT_GT(steps, 0) << out;
    EXPECT_EQ(Field(out, rep, "batches"), steps * 8);
    EXPECT_EQ(Field(out, rep, "skipped"), 0);
    EXPECT_GT(Field(out, rep, "dataset_bytes"), 0);
    EXPECT_EQ(Field(out, rep, "peer_sent_bytes"), Field(out, rep, "peer_received_bytes"));
    EXPECT_GE(Field(out, rep, "vit_over_bound_mean"), 1);
  }
  // Off: each of the 4 nodes reads the shards its ranks name, at most all.
  EXPECT_LE(Field(out, 0, "source_over_dataset"), 4.0001);
  EXPECT_GT(Field(out, 0, "source_over_dataset"), 2);
  EXPECT_EQ(Field(out, 0, "peer_received_bytes"), 0);
  // With homes: r x the dataset, each home copying its shards once (they are
  // staged ahead, and a member asked for before its holder's copy waits for
  // it), unless a member came from the source because its holder was late
  // (a fallback, on a loaded host); members moved.
  for (int rep : {1, 2}) {
    SCOPED_TRACE(rep);
    EXPECT_GE(Field(out, rep, "source_over_dataset"), 0.99 * rep);
    if (Field(out, rep, "peer_fallback_members") == 0) {
      EXPECT_EQ(Field(out, rep, "source_bytes"), rep * Field(out, rep, "dataset_bytes"));
    }
    EXPECT_LT(Field(out, rep, "source_over_dataset"), Field(out, 0, "source_over_dataset"));
    EXPECT_GT(Field(out, rep, "peer_received_members") + Field(out, rep, "peer_fallback_members"),
              0);
  }
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
