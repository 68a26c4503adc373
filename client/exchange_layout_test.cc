#include "client/exchange_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/testing/random_exchange.h"

namespace tutti {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::RankPlan Plan(uint32_t rank) {
  // rank sends 10 bytes to 0 and 20 to 2 (2 items), receives 5 from 1 and 10 from itself... made
  // consistent for rank 0 below.
  v1::RankPlan p;
  p.set_rank(rank);
  auto* ex = p.mutable_exchange();
  auto add = [](auto* list, uint32_t peer, std::vector<uint64_t> items) {
    auto* t = list->Add();
    t->set_peer(peer);
    uint64_t sum = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      auto* it = t->add_items();
      it->set_sample_id(100 + peer * 10 + i);
      it->set_bytes(items[i]);
      sum += items[i];
    }
    t->set_bytes(sum);
  };
  add(ex->mutable_sends(), 0, {10});
  add(ex->mutable_sends(), 2, {12, 8});
  add(ex->mutable_recvs(), 0, {10});
  add(ex->mutable_recvs(), 1, {5});
  ex->set_send_bytes(30);
  ex->set_recv_bytes(15);
  return p;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ExchangeLayout, ForwardFollowsTheTransfers) {
  auto l = BuildExchangeLayout(Plan(0), ExchangeDirection::kForward, 0, 3, {4, 3});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->send_counts, ElementsAre(10, 0, 20));
  EXPECT_THAT(l->send_offsets, ElementsAre(0, 0, 10));
  EXPECT_THAT(l->recv_counts, ElementsAre(10, 5, 0));
  EXPECT_THAT(l->recv_offsets, ElementsAre(0, 10, 0));
  EXPECT_EQ(l->send_bytes, 30u);
  EXPECT_EQ(l->recv_bytes, 15u);
  EXPECT_EQ(l->step, 4u);
}

TEST(ExchangeLayout, BackwardIsTheInverse) {
  auto l = BuildExchangeLayout(Plan(0), ExchangeDirection::kBackward, 0, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->send_counts, ElementsAre(10, 5, 0));
  EXPECT_THAT(l->send_offsets, ElementsAre(0, 10, 0));
  EXPECT_THAT(l->recv_counts, ElementsAre(10, 0, 20));
  EXPECT_EQ(l->send_bytes, 15u);
  EXPECT_EQ(l->recv_bytes, 30u);
}

TEST(ExchangeLayout, RandomPlansAreConsistentAcrossRanks) {
  for (uint64_t seed = 1; seed < 20; ++seed) {
    RandomExchangeOptions o;
    o.world_size = 5;
    o.seed = seed;
    auto plans = RandomExchangePlans(o);
    std::vector<ExchangeLayout> layouts;
    for (uint32_t r = 0; r < 5; ++r) {
      auto l = BuildExchangeLayout(plans[r], ExchangeDirection::kForward, r, 5, {seed, 5});
      ASSERT_TRUE(l.ok()) << l.status();
      layouts.push_back(*l);
    }
    for (uint32_t a = 0; a < 5; ++a) {
      for (uint32_t b = 0; b < 5; ++b)
        EXPECT_EQ(layouts[a].send_counts[b], layouts[b].recv_counts[a]);
    }
  }
}

TEST(ExchangeLayout, WorldSizeMismatchNamesBothSizesAndTheFix) {
  auto l = BuildExchangeLayout(Plan(0), ExchangeDirection::kForward, 0, 4, {7, 3});
  EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(l.status()), HasSubstr("step 7, rank 0"));
  EXPECT_THAT(Msg(l.status()), HasSubstr("the plan is for 3 ranks but the communicator has 4"));
  EXPECT_THAT(Msg(l.status()), HasSubstr("mpirun -np 3"));
}

TEST(ExchangeLayout, AnotherRanksPlan) {
  auto l = BuildExchangeLayout(Plan(1), ExchangeDirection::kForward, 0, 3);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(l.status()),
              HasSubstr("this process is rank 0 of the communicator but was given rank 1's plan"));
}

TEST(ExchangeLayout, RankOutsideTheCommunicatorIsRefused) {
  // Rank 3 of a communicator of 3 (a plan of rank 3 given to it): the
  // layout indexed its counts past their end (found by fuzz/plan_fuzzer).
  auto l = BuildExchangeLayout(Plan(3), ExchangeDirection::kForward, 3, 3);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l.status();
  EXPECT_THAT(Msg(l.status()), HasSubstr("rank 3 is outside a communicator of 3"));
}

TEST(ExchangeLayout, RefusesCorruptPlans) {
  struct Case {
    std::function<void(v1::RankPlan&)> mutate;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](auto& p) { p.mutable_exchange()->mutable_sends(1)->set_peer(3); },
       "names peer rank 3 but the communicator has 3"},
      {[](auto& p) { p.mutable_exchange()->mutable_sends(1)->set_peer(0); },
       "lists peer 0 after peer 0"},
      {[](auto& p) { p.mutable_exchange()->mutable_recvs(1)->set_bytes(6); },
       "declares 6 bytes but its items add up to 5"},
      {[](auto& p) { p.mutable_exchange()->set_send_bytes(31); },
       "declares 31 send bytes but its send transfers add up to 30"},
      {[](auto& p) {
         p.mutable_exchange()->mutable_recvs(0)->mutable_items(0)->set_bytes(9);
         p.mutable_exchange()->mutable_recvs(0)->set_bytes(9);
         p.mutable_exchange()->set_recv_bytes(14);
       },
       "sends 10 bytes to this rank itself but receives 9"},
  };
  for (const Case& c : cases) {
    v1::RankPlan p = Plan(0);
    c.mutate(p);
    auto l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument)
        << c.expect << ": " << l.status();
    EXPECT_THAT(Msg(l.status()), HasSubstr(c.expect));
  }
}

TEST(ExchangeLayout, BufferSizesNameExpectedAndGiven) {
  auto l = BuildExchangeLayout(Plan(0), ExchangeDirection::kForward, 0, 3, {2, 0});
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(CheckBufferSizes(*l, 30, 15).ok());
  absl::Status s = CheckBufferSizes(*l, 29, 15);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      Msg(s),
      HasSubstr("step 2, rank 0, forward exchange: send buffer size mismatch: expected 30 bytes"));
  EXPECT_THAT(Msg(s), HasSubstr("given 29"));
  s = CheckBufferSizes(*l, 30, 16);
  EXPECT_THAT(Msg(s), HasSubstr("receive buffer size mismatch: expected 15 bytes"));
}

TEST(ExchangeLayout, RunsFollowTheirTransfersAndSplitTheHash) {
  v1::RankPlan p = Plan(0);
  auto* to2 = p.mutable_exchange()->mutable_sends(1);
  auto l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  const uint64_t item_wise = l->send_item_hashes[2];
  EXPECT_TRUE(l->send_runs[2].empty());
  // Runs of one item are one message per item: the same split as no runs.
  to2->add_runs(1);
  to2->add_runs(1);
  l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->send_item_hashes[2], item_wise);
  to2->clear_runs();
  to2->add_runs(2);
  l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->send_runs[2], ElementsAre(2));
  EXPECT_NE(l->send_item_hashes[2], item_wise);
  // Backward: the forward sends' runs are the receives'.
  l = BuildExchangeLayout(p, ExchangeDirection::kBackward, 0, 3);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_THAT(l->recv_runs[2], ElementsAre(2));
  EXPECT_TRUE(l->send_runs[2].empty());
}

TEST(ExchangeLayout, RunsThatDoNotAddUpToTheItemsAreRefused) {
  v1::RankPlan p = Plan(0);
  auto* to2 = p.mutable_exchange()->mutable_sends(1);
  to2->add_runs(3);
  auto l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(Msg(l.status()), HasSubstr("has 2 items but its runs add up to 3"));
  to2->clear_runs();
  to2->add_runs(2);
  to2->add_runs(0);
  l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3);
  ASSERT_FALSE(l.ok());
  EXPECT_THAT(Msg(l.status()), HasSubstr("a run of no items"));
}

}  // namespace
}  // namespace tutti
