#include "services/packer/bench/locality_bench.h"

#include "gtest/gtest.h"

namespace tutti::packer {
namespace {

// A small cluster: 8 nodes of 4 ranks, 400 shards, two steps.
TEST(LocalityBenchTest, HomesReadTheDatasetRTimesAndTodayReadsMore) {
  LocalityBenchOptions o;
  o.world_size = 32;
  o.workload.ranks_per_node = 4;
  o.dataset_bytes = 400'000'000'000;  // 400 shards of 1 GB
  o.replication = 2;
  o.steps = 2;
  o.count_steps = 100;  // the caches over 100 steps (an epoch is ~1,000)
  // 2 copies on 8 nodes need a quarter of the dataset a node (and some room
  // besides: shards are placed greedily); 1/8 cannot.
  o.cache_fractions = {1.0 / 8, 1.0 / 3, 1.0 / 2, 1.0};
  auto r = RunLocalityBench(o);
  ASSERT_TRUE(r.ok()) << r.status();
  const EgressResult& e = r->egress;
  EXPECT_EQ(e.nodes, 8u);
  EXPECT_EQ(e.shards, 400u);
  EXPECT_EQ(r->off_home_local_loads, 0u);
  ASSERT_EQ(e.rows.size(), 4u);
  EXPECT_NE(e.rows[0].error.find("2 copies of the dataset need 800.0 GB but 8 nodes' caches of "
                                 "50.0 GB hold 400.0 GB; raise the cache"),
            std::string::npos);
  for (size_t i = 1; i < e.rows.size(); ++i) {
    const EgressRow& row = e.rows[i];
    EXPECT_TRUE(row.error.empty()) << row.error;
    // Counted over the steps: every home reads its shards once, at most.
    EXPECT_LE(row.nfs_locality_bytes, 2 * 400e9 * 1.0001);
    EXPECT_GT(row.nfs_locality_bytes, 0.9 * 2 * 400e9);
    EXPECT_DOUBLE_EQ(row.limit_bytes, 2 * 400e9);
    EXPECT_GT(row.nfs_today_bytes, row.nfs_locality_bytes);
  }
  // A smaller cache reads more today.
  EXPECT_GT(e.rows[1].nfs_today_bytes, e.rows[3].nfs_today_bytes);
  EXPECT_GT(e.shards_per_node_step, 0);
  EXPECT_GT(r->remote_share, 0);
  EXPECT_LT(r->remote_share, 1);
  EXPECT_GE(r->vit_over_bound, 1);
  EXPECT_FALSE(FormatLocalityTable(*r).empty());
  EXPECT_EQ(FormatLocalityJson(*r).front(), '{');
}

}  // namespace
}  // namespace tutti::packer
