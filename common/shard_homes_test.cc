#include "common/shard_homes.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

std::vector<ShardKey> Shards(uint32_t n, uint64_t bytes = 1 << 20) {
  std::vector<ShardKey> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back({absl::StrCat("train/shard-", i, ".tar"), bytes});
  return out;
}

ShardHomes MustAssign(absl::Span<const ShardKey> shards, uint32_t nodes, const ShardHomesOptions& o,
                      absl::Span<const uint32_t> excluded = {}) {
  auto h = ShardHomes::Assign(shards, nodes, o, excluded);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *std::move(h) : ShardHomes();
}

std::vector<uint32_t> AllHomes(const ShardHomes& h) {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < h.shards(); ++s) {
    for (uint32_t n : h.Homes(s)) out.push_back(n);
  }
  return out;
}

TEST(ShardHomesTest, DeterministicFromSeedNamesAndNodes) {
  const auto shards = Shards(500);
  ShardHomesOptions o{.replication = 2, .seed = 42};
  const ShardHomes a = MustAssign(shards, 16, o);
  const ShardHomes b = MustAssign(shards, 16, o);
  EXPECT_EQ(AllHomes(a), AllHomes(b));
  o.seed = 43;
  const ShardHomes c = MustAssign(shards, 16, o);
  EXPECT_NE(AllHomes(a), AllHomes(c));
  // The key is the name, not the position: a reordered index keeps each
  // shard's homes.
  std::vector<ShardKey> reversed(shards.rbegin(), shards.rend());
  o.seed = 42;
  const ShardHomes d = MustAssign(reversed, 16, o);
  for (uint32_t s = 0; s < 500; ++s) {
    EXPECT_EQ(std::vector<uint32_t>(a.Homes(s).begin(), a.Homes(s).end()),
              std::vector<uint32_t>(d.Homes(499 - s).begin(), d.Homes(499 - s).end()));
  }
  // Best first: the homes come in decreasing weight.
  for (uint32_t s = 0; s < 500; ++s) {
    EXPECT_GT(ShardHomeWeight(42, shards[s].name, a.Homes(s)[0]),
              ShardHomeWeight(42, shards[s].name, a.Homes(s)[1]));
  }
}

TEST(ShardHomesTest, ReplicationGivesDistinctNodesCappedAtLiveNodes) {
  const auto shards = Shards(300);
  for (uint32_t r : {1u, 2u, 3u, 8u}) {
    const ShardHomes h = MustAssign(shards, 8, {.replication = r, .seed = 7});
    ASSERT_EQ(h.replication(), r);
    for (uint32_t s = 0; s < 300; ++s) {
      std::set<uint32_t> nodes(h.Homes(s).begin(), h.Homes(s).end());
      EXPECT_EQ(nodes.size(), r);
      for (uint32_t n : nodes) {
        EXPECT_LT(n, 8u);
        EXPECT_TRUE(h.IsHome(s, n));
      }
    }
  }
  // More copies than live nodes: every live node is a home.
  const uint32_t dead[] = {1, 4};
  const ShardHomes h = MustAssign(shards, 5, {.replication = 9}, dead);
  EXPECT_EQ(h.replication(), 3u);
  for (uint32_t s = 0; s < 300; ++s) {
    std::set<uint32_t> nodes(h.Homes(s).begin(), h.Homes(s).end());
    EXPECT_EQ(nodes, (std::set<uint32_t>{0, 2, 3}));
  }
}

TEST(ShardHomesTest, BalancedAcrossNodes) {
  const uint32_t kShards = 10000, kNodes = 32;
  const auto shards = Shards(kShards);
  for (uint32_t r : {1u, 2u}) {
    const ShardHomes h = MustAssign(shards, kNodes, {.replication = r, .seed = 3});
    size_t total = 0, most = 0;
    for (uint32_t n = 0; n < kNodes; ++n) {
      const size_t k = h.ShardsOf(n).size();
      EXPECT_EQ(h.BytesOf(n), k * (1 << 20));
      total += k;
      most = std::max(most, k);
    }
    EXPECT_EQ(total, size_t{kShards} * r);
    const double mean = static_cast<double>(total) / kNodes;
    // Binomial spread: about mean + 2.2 sd for the largest of 32 nodes.
    EXPECT_LT(most / mean, 1.2) << "r=" << r;
  }
}

TEST(ShardHomesTest, AddingANodeMovesAboutItsShareAllOntoIt) {
  const uint32_t kShards = 4000;
  const auto shards = Shards(kShards);
  for (uint32_t n : {4u, 8u, 31u}) {
    const ShardHomes before = MustAssign(shards, n, {.seed = 11});
    const ShardHomes after = MustAssign(shards, n + 1, {.seed = 11});
    uint32_t moved = 0;
    for (uint32_t s = 0; s < kShards; ++s) {
      if (before.Homes(s)[0] == after.Homes(s)[0]) continue;
      ++moved;
      EXPECT_EQ(after.Homes(s)[0], n) << "shard " << s << " moved between old nodes";
    }
    const double expect = static_cast<double>(kShards) / (n + 1);
    EXPECT_GT(moved, 0.75 * expect) << n;
    EXPECT_LT(moved, 1.25 * expect) << n;
  }
}

TEST(ShardHomesTest, RemovingANodeMovesOnlyItsShards) {
  const uint32_t kShards = 3000, kNodes = 12, kGone = 5;
  const auto shards = Shards(kShards);
  for (uint32_t r : {1u, 3u}) {
    const ShardHomesOptions o{.replication = r, .seed = 5};
    const ShardHomes before = MustAssign(shards, kNodes, o);
    const uint32_t gone[] = {kGone};
    const ShardHomes after = MustAssign(shards, kNodes, o, gone);
    EXPECT_TRUE(after.ShardsOf(kGone).empty());
    EXPECT_EQ(after.BytesOf(kGone), 0u);
    for (uint32_t s = 0; s < kShards; ++s) {
      std::set<uint32_t> b(before.Homes(s).begin(), before.Homes(s).end());
      std::set<uint32_t> a(after.Homes(s).begin(), after.Homes(s).end());
      if (!b.count(kGone)) {
        EXPECT_EQ(a, b) << "shard " << s;
        continue;
      }
      // Its other homes stay; one new node replaces the removed one.
      b.erase(kGone);
      for (uint32_t n : b) EXPECT_TRUE(a.count(n)) << "shard " << s;
      EXPECT_EQ(a.size(), r);
    }
  }
  // Dropping the highest node id is the same as excluding it.
  const uint32_t last[] = {kNodes - 1};
  EXPECT_EQ(AllHomes(MustAssign(shards, kNodes, {.seed = 5}, last)),
            AllHomes(MustAssign(shards, kNodes - 1, {.seed = 5})));
}

TEST(ShardHomesTest, CapacityRespected) {
  const uint32_t kShards = 1000, kNodes = 10;
  const uint64_t kBytes = 1 << 20;
  const auto shards = Shards(kShards, kBytes);
  // Room for 2 x 1000 shards plus 5%: every node ends close to full.
  const uint64_t cap = kBytes * 210;
  const ShardHomes h = MustAssign(shards, kNodes, {.replication = 2, .node_capacity_bytes = cap});
  uint64_t total = 0;
  for (uint32_t n = 0; n < kNodes; ++n) {
    EXPECT_LE(h.BytesOf(n), cap);
    EXPECT_EQ(h.BytesOf(n), h.ShardsOf(n).size() * kBytes);
    total += h.BytesOf(n);
  }
  EXPECT_EQ(total, 2 * kShards * kBytes);
  for (uint32_t s = 0; s < kShards; ++s) EXPECT_NE(h.Homes(s)[0], h.Homes(s)[1]);
  // Unbounded, some node would hold more than the cap: the cap did the work.
  const ShardHomes free = MustAssign(shards, kNodes, {.replication = 2});
  uint64_t most = 0;
  for (uint32_t n = 0; n < kNodes; ++n) most = std::max(most, free.BytesOf(n));
  EXPECT_GT(most, cap);
}

TEST(ShardHomesTest, EachNodesOwnCapacityRespected) {
  const uint32_t kShards = 400, kNodes = 8;
  const uint64_t kBytes = 1 << 20;
  const auto shards = Shards(kShards, kBytes);
  const ShardHomes free = MustAssign(shards, kNodes, {});
  // Node 3 holds a third of its share; the others are unbounded.
  ShardHomesOptions o;
  o.node_capacities.assign(kNodes, 0);
  o.node_capacities[3] = free.BytesOf(3) / 3;
  const ShardHomes h = MustAssign(shards, kNodes, o);
  EXPECT_LE(h.BytesOf(3), o.node_capacities[3]);
  EXPECT_GT(h.BytesOf(3), 0u);
  // Only shards node 3 held moved, and only those it gave up.
  for (uint32_t s = 0; s < kShards; ++s) {
    if (free.Homes(s)[0] != 3) EXPECT_EQ(h.Homes(s)[0], free.Homes(s)[0]) << s;
  }
  // A node's own capacity replaces the common one; 0 keeps it.
  o.node_capacity_bytes = kBytes * 60;
  o.node_capacities[3] = kBytes * 10;
  const ShardHomes both = MustAssign(shards, kNodes, o);
  for (uint32_t n = 0; n < kNodes; ++n)
    EXPECT_LE(both.BytesOf(n), n == 3 ? kBytes * 10 : kBytes * 60);
  // What the nodes' own capacities cannot hold is refused.
  o.node_capacity_bytes = kBytes * 40;
  auto refused = ShardHomes::Assign(shards, kNodes, o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(ShardHomesTest, RefusesWhatTheClusterCannotHold) {
  const auto shards = Shards(100, 1 << 20);
  // 2 x 100 MiB on 4 nodes of 40 MiB.
  auto h = ShardHomes::Assign(shards, 4, {.replication = 2, .node_capacity_bytes = 40 << 20});
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(h.status().message(), HasSubstr("raise the per-node cache capacity"));
  EXPECT_THAT(h.status().message(), HasSubstr("4 live nodes"));
  // Enough in total, but one shard does not fit in any node.
  auto big = Shards(3, 1 << 20);
  big[1].bytes = 8 << 20;
  h = ShardHomes::Assign(big, 4, {.node_capacity_bytes = 4 << 20});
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(h.status().message(), HasSubstr("train/shard-1.tar"));
  // A dead node's capacity does not count.
  const uint32_t dead[] = {0, 1};
  EXPECT_TRUE(ShardHomes::Assign(shards, 4, {.node_capacity_bytes = 30 << 20}).ok());
  h = ShardHomes::Assign(shards, 4, {.node_capacity_bytes = 30 << 20}, dead);
  EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted);
  // No live node, no replication.
  const uint32_t all[] = {0, 1, 2, 3};
  EXPECT_EQ(ShardHomes::Assign(shards, 4, {}, all).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShardHomes::Assign(shards, 4, {.replication = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tutti
