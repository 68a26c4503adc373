#include "client/exchange_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "client/testing/random_exchange.h"
#include "tutti/v1/plan.pb.h"

namespace tutti {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::RankPlan Plan(uint32_t rank) {
  // rank sends 10 bytes to 0 and 20 to 2 (2 items), receives 5 from 1 and 10 from itself... made
  // consistent for rank 0 below.
  v1::RankPlan p;
  p.set_rank(rank);
  p.set_plan_version(kMinExchangePlanVersion);
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

TEST(ExchangeLayout, APlanOlderThanTheContiguousLayoutIsRefusedNamingBothVersions) {
  for (uint32_t version : {0u, 2u, 3u}) {
    v1::RankPlan p = Plan(0);
    p.set_plan_version(version);
    for (ExchangeDirection dir :
         {ExchangeDirection::kForward, ExchangeDirection::kBackward, ExchangeDirection::kLoad}) {
      auto l = BuildExchangeLayout(p, dir, 0, 3, {5, 3});
      EXPECT_EQ(l.status().code(), absl::StatusCode::kFailedPrecondition) << l.status();
      EXPECT_THAT(Msg(l.status()),
                  HasSubstr(absl::StrCat("step 5, rank 0, ", ExchangeDirectionName(dir),
                                         " exchange: the plan is plan_version ", version,
                                         " but this client's exchange needs plan_version 4 or "
                                         "later")));
    }
  }
}

// Rank 0 of 3 with two encoders: to rank 1 an image of 6 bytes and an audio
// clip of 4, to itself an image of 3 and two clips of 2 and 5; from rank 2
// an image of 7. Its encoder phases list the images and clips in the order
// of its sends.
v1::RankPlan TwoEncoderPlan() {
  v1::RankPlan p;
  p.set_plan_version(kMinExchangePlanVersion);
  auto* vision = p.add_encoders();
  vision->set_encoder(v1::ENCODER_VISION);
  auto* audio = p.add_encoders();
  audio->set_encoder(v1::ENCODER_AUDIO);
  auto* ex = p.mutable_exchange();
  auto item = [](v1::Transfer* t, v1::Encoder e, uint64_t sample, uint64_t bytes) {
    auto* it = t->add_items();
    it->set_sample_id(sample);
    it->set_encoder(e);
    it->set_bytes(bytes);
    t->set_bytes(t->bytes() + bytes);
  };
  auto* self = ex->add_sends();
  self->set_peer(0);
  item(self, v1::ENCODER_VISION, 10, 3);
  item(self, v1::ENCODER_AUDIO, 11, 2);
  item(self, v1::ENCODER_AUDIO, 12, 5);
  auto* to1 = ex->add_sends();
  to1->set_peer(1);
  item(to1, v1::ENCODER_VISION, 13, 6);
  item(to1, v1::ENCODER_AUDIO, 14, 4);
  *ex->add_recvs() = *self;
  auto* from2 = ex->add_recvs();
  from2->set_peer(2);
  item(from2, v1::ENCODER_VISION, 20, 7);
  ex->set_send_bytes(20);
  ex->set_recv_bytes(17);
  for (const auto& t : ex->sends()) {
    for (const auto& it : t.items()) {
      if (it.encoder() == v1::ENCODER_VISION) {
        vision->add_images()->set_sample_id(it.sample_id());
      } else {
        audio->add_audio()->set_sample_id(it.sample_id());
      }
    }
  }
  return p;
}

TEST(ExchangeLayout, OneEncodersItemsLayOutThatEncodersOutputAsItStands) {
  const v1::RankPlan p = TwoEncoderPlan();
  ExchangeContext all{1, 3}, vision{1, 3}, audio{1, 3};
  vision.encoder = v1::ENCODER_VISION;
  audio.encoder = v1::ENCODER_AUDIO;
  auto a = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3, all);
  auto v = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3, vision);
  auto u = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3, audio);
  ASSERT_TRUE(a.ok() && v.ok() && u.ok()) << a.status() << v.status() << u.status();
  // Every item: one contiguous block per peer.
  EXPECT_THAT(a->send_counts, ElementsAre(10, 10, 0));
  EXPECT_THAT(a->send_offsets, ElementsAre(0, 10, 0));
  EXPECT_THAT(a->recv_counts, ElementsAre(10, 0, 7));
  // The vision encoder's output [img 10 | img 13] is its send buffer; the
  // audio encoder's [clip 11, clip 12 | clip 14] is its.
  EXPECT_THAT(v->send_counts, ElementsAre(3, 6, 0));
  EXPECT_THAT(v->send_offsets, ElementsAre(0, 3, 0));
  EXPECT_THAT(v->recv_counts, ElementsAre(3, 0, 7));
  EXPECT_THAT(v->recv_offsets, ElementsAre(0, 0, 3));
  EXPECT_EQ(v->send_bytes, 9u);
  EXPECT_EQ(v->recv_bytes, 10u);
  EXPECT_THAT(u->send_counts, ElementsAre(7, 4, 0));
  EXPECT_THAT(u->send_offsets, ElementsAre(0, 7, 0));
  EXPECT_THAT(u->recv_counts, ElementsAre(7, 0, 0));
  EXPECT_EQ(u->send_bytes, 11u);
  EXPECT_EQ(u->recv_bytes, 7u);
  // Backward: the inverse, of the same encoder.
  auto vb = BuildExchangeLayout(p, ExchangeDirection::kBackward, 0, 3, vision);
  ASSERT_TRUE(vb.ok()) << vb.status();
  EXPECT_THAT(vb->send_counts, ElementsAre(3, 0, 7));
  EXPECT_THAT(vb->recv_counts, ElementsAre(3, 6, 0));
  // The agreement tells the encoders apart: the same sizes hash apart.
  EXPECT_NE(v->send_item_hashes[1], a->send_item_hashes[1]);
  EXPECT_NE(v->send_item_hashes[1], 0u);
  EXPECT_EQ(u->recv_item_hashes[2], 0u);  // nothing of the audio encoder's from rank 2
  EXPECT_EQ(v->encoder, v1::ENCODER_VISION);
}

TEST(ExchangeLayout, OneEncodersItemsOutOfItsOutputsOrderAreRefused) {
  v1::RankPlan p = TwoEncoderPlan();
  ExchangeContext vision{1, 3};
  vision.encoder = v1::ENCODER_VISION;
  p.mutable_encoders(0)->mutable_images()->SwapElements(0, 1);
  auto l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3, vision);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l.status();
  EXPECT_THAT(Msg(l.status()), HasSubstr("the plan sends item (sample 10, index 0) to rank 0 as "
                                         "row 0 of the encoder's output, but its encoder phase "
                                         "lists (sample 13, index 0) there"));
  EXPECT_THAT(Msg(l.status()), HasSubstr("not grouped by destination"));
  // The backward exchange receives into that output: refused alike.
  l = BuildExchangeLayout(p, ExchangeDirection::kBackward, 0, 3, vision);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << l.status();
  // An encoder phase with an item the sends lack.
  p = TwoEncoderPlan();
  p.mutable_encoders(1)->add_audio()->set_sample_id(99);
  ExchangeContext audio{1, 3};
  audio.encoder = v1::ENCODER_AUDIO;
  l = BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3, audio);
  EXPECT_THAT(Msg(l.status()), HasSubstr("encoder phase lists 4 items but its sends 3"));
  // Every item at once does not read the encoder phases.
  EXPECT_TRUE(BuildExchangeLayout(p, ExchangeDirection::kForward, 0, 3, {1, 3}).ok());
}

}  // namespace
}  // namespace tutti
