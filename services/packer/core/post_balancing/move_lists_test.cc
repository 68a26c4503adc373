#include "services/packer/core/post_balancing/move_lists.h"

#include <gtest/gtest.h>

#include "services/packer/core/post_balancing/plan_check.h"

namespace tutti::dispatch {
namespace {

Move M(uint32_t src, uint32_t dst, uint32_t sample, uint64_t bytes) {
  return Move{src, dst,
              ExchangeItem{sample, EncoderKind::kVision, Payload::kEncoderOutput, 0, bytes}};
}

TEST(ExchangeTest, GroupsByPeerInOrderAndKeepsItemOrder) {
  const ClusterShape c{4, 2};
  // Rank 1 sends samples 5 and 3 (in that order) to rank 2, one to itself, one to rank 0.
  const std::vector<Move> moves = {M(1, 2, 5, 10), M(1, 1, 7, 1), M(1, 0, 9, 4), M(1, 2, 3, 20),
                                   M(3, 2, 8, 2)};
  const auto x = BuildExchange(c, moves);
  ASSERT_EQ(x[1].sends.size(), 3u);
  EXPECT_EQ(x[1].sends[0].peer, 0u);
  EXPECT_EQ(x[1].sends[1].peer, 1u);  // self included
  EXPECT_EQ(x[1].sends[2].peer, 2u);
  ASSERT_EQ(x[1].sends[2].items.size(), 2u);
  EXPECT_EQ(x[1].sends[2].items[0].sample, 5u);
  EXPECT_EQ(x[1].sends[2].items[1].sample, 3u);
  EXPECT_EQ(x[1].sends[2].bytes, 30u);
  EXPECT_EQ(x[1].send_bytes, 35u);
  // Node 0 = {0,1}, node 1 = {2,3}: rank 1 -> 2 crosses nodes, 3 -> 2 does not.
  EXPECT_EQ(x[1].inter_node_send_bytes, 30u);
  EXPECT_EQ(x[3].inter_node_send_bytes, 0u);
  ASSERT_EQ(x[2].recvs.size(), 2u);
  EXPECT_EQ(x[2].recvs[0].peer, 1u);
  EXPECT_EQ(x[2].recvs[1].peer, 3u);
  EXPECT_EQ(x[2].recvs[0].items[0].sample, 5u);
  EXPECT_EQ(x[2].recv_bytes, 32u);
  EXPECT_TRUE(x[0].sends.empty());
  EXPECT_TRUE(CheckExchangeSymmetry(x).ok());
  const ExchangeTotals t = SumExchange(c, x);
  EXPECT_EQ(t.self, 1u);
  EXPECT_EQ(t.intra_node, 6u);
  EXPECT_EQ(t.inter_node, 30u);
}

TEST(ExchangeTest, BackwardIsTheExactInverse) {
  const ClusterShape c{4, 2};
  const std::vector<Move> moves = {M(0, 3, 1, 5), M(0, 3, 2, 6), M(2, 0, 3, 7), M(3, 3, 4, 8)};
  const auto fwd = BuildExchange(c, moves);
  const auto back = InverseExchange(c, fwd);
  ASSERT_TRUE(CheckExchangeSymmetry(back).ok());
  for (uint32_t r = 0; r < 4; ++r) {
    ASSERT_EQ(back[r].sends.size(), fwd[r].recvs.size());
    ASSERT_EQ(back[r].recvs.size(), fwd[r].sends.size());
    EXPECT_EQ(back[r].send_bytes, fwd[r].recv_bytes);
    EXPECT_EQ(back[r].recv_bytes, fwd[r].send_bytes);
    for (size_t k = 0; k < back[r].sends.size(); ++k) {
      EXPECT_EQ(back[r].sends[k].peer, fwd[r].recvs[k].peer);
      ASSERT_EQ(back[r].sends[k].items.size(), fwd[r].recvs[k].items.size());
      for (size_t i = 0; i < back[r].sends[k].items.size(); ++i) {
        EXPECT_EQ(back[r].sends[k].items[i].sample, fwd[r].recvs[k].items[i].sample);
      }
    }
  }
  EXPECT_EQ(SumExchange(c, back).inter_node, SumExchange(c, fwd).inter_node);
  // Inverting twice gives the forward lists back.
  const auto again = InverseExchange(c, back);
  for (uint32_t r = 0; r < 4; ++r) {
    EXPECT_EQ(again[r].inter_node_send_bytes, fwd[r].inter_node_send_bytes);
    EXPECT_EQ(again[r].sends.size(), fwd[r].sends.size());
  }
}

TEST(ExchangeTest, SymmetryCheckCatchesMismatch) {
  const ClusterShape c{2, 1};
  auto x = BuildExchange(c, {M(0, 1, 1, 5), M(0, 1, 2, 6)});
  ASSERT_TRUE(CheckExchangeSymmetry(x).ok());
  std::swap(x[1].recvs[0].items[0], x[1].recvs[0].items[1]);  // order differs
  EXPECT_FALSE(CheckExchangeSymmetry(x).ok());
  auto y = BuildExchange(c, {M(0, 1, 1, 5)});
  y[1].recvs.clear();
  y[1].recv_bytes = 0;
  EXPECT_FALSE(CheckExchangeSymmetry(y).ok());
}

TEST(ExchangeTest, Empty) {
  const auto x = BuildExchange({8, 8}, {});
  ASSERT_EQ(x.size(), 8u);
  for (const auto& r : x) EXPECT_TRUE(r.sends.empty() && r.recvs.empty());
}

}  // namespace
}  // namespace tutti::dispatch
