#include "services/stager/window/node_ranks.h"

#include "gtest/gtest.h"

namespace tutti::stager {
namespace {

TEST(NodeRanksTest, AFixedNodeServesItsBlockOfRanks) {
  auto r = NodeRanks::Make(1, 4, 12);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->known());
  EXPECT_EQ(r->ranks(), (std::vector<uint32_t>{4, 5, 6, 7}));
  EXPECT_TRUE(r->IsLocal(7));
  EXPECT_FALSE(r->IsLocal(8));
  absl::Status s = r->CheckLocal(9);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 9 belongs to node 2 but this tutti-stagerd serves node 1 "
                             "(ranks 4..7); ask the stager of node 2"),
            std::string::npos)
      << s;
}

TEST(NodeRanksTest, ANodeOutsideTheJobIsRefusedNamingTheRange) {
  auto r = NodeRanks::Make(3, 4, 12);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--node 3 does not exist: the job has 3 nodes"),
            std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("--node 0..2 or --node=auto"), std::string::npos);
  EXPECT_FALSE(NodeRanks::Make(0, 4, 10).ok());  // not a whole number of nodes
}

TEST(NodeRanksTest, AutoLearnsTheNodeFromTheFirstRankOnce) {
  auto r = NodeRanks::Make(std::nullopt, 2, 8);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->known());
  EXPECT_TRUE(r->ranks().empty());
  EXPECT_FALSE(r->IsLocal(0));
  EXPECT_EQ(r->Learn(8).code(), absl::StatusCode::kInvalidArgument);  // not in the job
  EXPECT_FALSE(r->known());
  ASSERT_TRUE(r->Learn(5).ok());
  EXPECT_EQ(r->node(), 2u);
  EXPECT_EQ(r->ranks(), (std::vector<uint32_t>{4, 5}));
  ASSERT_TRUE(r->Learn(0).ok());  // already known: unchanged
  EXPECT_EQ(r->node(), 2u);
  absl::Status s = r->CheckLocal(1);
  EXPECT_NE(s.message().find("learned from rank 5's first call under --node=auto"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace tutti::stager
