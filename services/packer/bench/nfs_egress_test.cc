#include "services/packer/bench/nfs_egress.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

TEST(LruShardCacheTest, EvictsTheLeastRecentlyUsedAndKeepsNothingLargerThanItself) {
  LruShardCache c(2);
  EXPECT_FALSE(c.Touch(0, 1));  // [0]
  EXPECT_FALSE(c.Touch(1, 1));  // [1 0]
  EXPECT_TRUE(c.Touch(0, 1));   // [0 1]
  EXPECT_FALSE(c.Touch(2, 1));  // [2 0]: 1 evicted
  EXPECT_FALSE(c.Touch(1, 1));  // [1 2]: 0 evicted
  EXPECT_TRUE(c.Touch(2, 1));
  EXPECT_FALSE(c.Touch(0, 1));
  EXPECT_EQ(c.reads(), 5u);
  EXPECT_EQ(c.read_bytes(), 5u);
  EXPECT_FALSE(c.Touch(9, 3));  // larger than the cache: read, not kept
  EXPECT_EQ(c.held_bytes(), 2u);
  EXPECT_TRUE(c.Touch(0, 1));
  EXPECT_EQ(c.read_bytes(), 8u);
}

PlannedSample Sample(uint32_t shard, uint32_t rank) {
  PlannedSample s;
  s.shard = shard;
  s.rank = rank;
  return s;
}

// Two nodes of one rank, shards 0..3 of 10, 20, 30 and 40 bytes, three
// steps; the reads each node's stager makes, counted by hand.
TEST(EgressCounterTest, CountsEachNodesCacheOverThePlansByHand) {
  std::vector<StepPlanData> steps(3);
  for (uint64_t i = 0; i < steps.size(); ++i) steps[i].step = i;
  // Step 0: samples on shards 0, 1, 2 (ranks 0, 1, 0); an image of the
  // shard-1 sample encoded on rank 0, and one of the shard-0 sample
  // encoded on rank 1 but loaded remotely from rank 0 (its holder).
  steps[0].samples = {Sample(0, 0), Sample(1, 1), Sample(2, 0)};
  PlannedImage local, remote;
  local.owner = 1;
  local.enc_rank = 0;
  remote.owner = 0;
  remote.enc_rank = 1;
  remote.remote_load = true;
  remote.load_source = 0;
  steps[0].images = {local, remote};
  steps[1].samples = {Sample(3, 0), Sample(0, 1), Sample(1, 0)};
  steps[2].samples = {Sample(0, 0), Sample(1, 1)};

  // In plan order, each shard once a step: node 0 reads 1, 0, 2 | 3, 1 | 0;
  // node 1 reads 1 | 0 | 1.
  std::vector<std::vector<uint32_t>> reads;
  ASSERT_TRUE(StepShardReads(steps[0], 1, 2, &reads).ok());
  EXPECT_EQ(reads, (std::vector<std::vector<uint32_t>>{{1, 0, 2}, {1}}));

  EgressCounter counter({10, 20, 30, 40}, 2, 1, {30, 1000});
  for (const StepPlanData& d : steps) ASSERT_TRUE(counter.AddStep(d).ok());
  EXPECT_EQ(counter.steps(), 3u);
  // A cache of 1000 bytes reads each distinct shard once: node 0 shards
  // 0..3 (100 bytes), node 1 shards 0 and 1 (30).
  // A cache of 30 bytes: node 0 reads 1 (20), 0 (10; holds both), 2 (30;
  // evicts both), 3 (40; larger than the cache, not kept), 1 (20; evicts 2),
  // 0 (10; holds 0 and 1): 130. Node 1 reads 1 (20), 0 (10), then 1 hits: 30.
  EXPECT_EQ(counter.source_bytes(), (std::vector<uint64_t>{160, 130}));
  // 6 reads on node 0 and 3 on node 1 over 3 steps and 2 nodes.
  EXPECT_DOUBLE_EQ(counter.shards_per_node_step(), 1.5);

  // A load on a rank outside the nodes counted is an error, not a miscount.
  StepPlanData bad;
  bad.samples = {Sample(0, 5)};
  EXPECT_EQ(counter.AddStep(bad).code(), absl::StatusCode::kInternal);
}

TEST(ParseCacheSizesTest, FractionsAndSizesAndWhatIsRefused) {
  const uint64_t tb = 1'000'000'000'000;
  auto f = ParseCacheSizes("1/32, 0.125,1", tb);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, (std::vector<double>{1.0 / 32, 0.125, 1.0}));
  f = ParseCacheSizes("256G", tb);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_DOUBLE_EQ(f->at(0), 256.0 * (1ull << 30) / tb);
  for (const char* bad : {"0", "nan", "-1/8", "2", "1/0", "abc", "", "0G"}) {
    auto r = ParseCacheSizes(bad, tb);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto big = ParseCacheSizes("2T", tb);
  EXPECT_NE(big.status().message().find("larger than the dataset"), std::string::npos)
      << big.status();
  auto two = ParseCacheSizes("2", tb);
  EXPECT_NE(two.status().message().find("is not a fraction of the dataset in (0, 1]"),
            std::string::npos)
      << two.status();
}

// A small cluster over an epoch: with homes every node's cache holds its
// homes, so each shard is read at most r times; today every node reads
// what its ranks name, more with a smaller cache.
TEST(CountEgressTest, HomesReadAtMostRTimesTheDatasetAndTodayMore) {
  EgressOptions o;
  o.world_size = 16;
  o.workload.ranks_per_node = 4;
  o.dataset_bytes = 64'000'000'000;  // 64 shards of 1 GB
  o.replication = 1;
  o.cache_fractions = {1.0 / 2, 1.0};  // a node's homes: a quarter
  o.count_steps = 40;
  auto setup = MakeEgressSetup(o);
  ASSERT_TRUE(setup.ok()) << setup.status();
  auto r = CountEgress(*setup, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->nodes, 4u);
  EXPECT_EQ(r->counted_steps, 40u);
  ASSERT_EQ(r->rows.size(), 2u);
  const double d = 64e9;
  for (const EgressRow& row : r->rows) {
    EXPECT_TRUE(row.error.empty()) << row.error;
    EXPECT_LE(row.nfs_locality_bytes, d * 1.0001);
    EXPECT_GT(row.nfs_locality_bytes, 0.9 * d);
    EXPECT_LE(row.nfs_today_bytes, 40 * 4 * d);
  }
  // A whole dataset's cache reads each shard at most once a node.
  EXPECT_LE(r->rows[1].nfs_today_bytes, 4 * d * 1.0001);
  EXPECT_GT(r->rows[0].nfs_today_bytes, r->rows[1].nfs_today_bytes);
  EXPECT_NE(FormatEgressTable(*r).find("counted over 40 planned steps"), std::string::npos);

  o.world_size = 0;
  EXPECT_EQ(MakeEgressSetup(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.world_size = 16;
  o.cache_fractions = {std::nan("")};
  EXPECT_EQ(MakeEgressSetup(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.cache_fractions = {1.0};
  o.replication = 5;
  EXPECT_NE(MakeEgressSetup(o).status().message().find("replication 5 is not in 1..4"),
            std::string::npos);
}

}  // namespace
}  // namespace tutti::packer
