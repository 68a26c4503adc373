// The MPI transport on a real communicator: run under mpirun (see
// client/CMakeLists.txt, test client_mpi_transport). Every test is collective:
// all ranks run the same tests in the same order.
#include "client/mpi_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/examples/rank_step.h"
#include "client/exchange_pattern.h"
#include "client/mpi_test_support.h"
#include "client/testing/random_exchange.h"
#include "common/status.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

using testing::WorldRank;
using testing::WorldSize;

// Short enough that a broken test fails instead of hanging the suite.
MpiTransportOptions TestOptions() {
  MpiTransportOptions o;
  o.join_timeout = absl::Seconds(30);
  return o;
}

// TestOptions() with messages of at most `max_count` bytes.
MpiTransportOptions Chunked(uint64_t max_count) {
  MpiTransportOptions o = TestOptions();
  o.max_count = max_count;
  return o;
}

std::unique_ptr<MpiTransport> MakeTransport(MpiTransportOptions o = TestOptions()) {
  auto t = MpiTransport::Create(MPI_COMM_WORLD, o);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Every rank's status as "CODE: message", gathered onto every rank (the
// tests' own MPI_COMM_WORLD collectives, after the transport's exchange).
std::vector<std::string> EveryRanks(const absl::Status& s) {
  const std::string mine = absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
  const int n = static_cast<int>(mine.size());
  std::vector<int> sizes(WorldSize()), offsets(WorldSize());
  MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (uint32_t r = 0; r < WorldSize(); ++r) {
    offsets[r] = total;
    total += sizes[r];
  }
  std::string all(total, '\0');
  MPI_Allgatherv(mine.data(), n, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                 MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (uint32_t r = 0; r < WorldSize(); ++r) out.push_back(all.substr(offsets[r], sizes[r]));
  return out;
}

// A failed agreement reads the same on every rank: code and message.
void ExpectSameOnEveryRank(const absl::Status& s, const std::string& what = "") {
  const std::vector<std::string> all = EveryRanks(s);
  for (uint32_t r = 1; r < all.size(); ++r) {
    EXPECT_EQ(all[r], all[0]) << "rank " << r << " vs rank 0 " << what;
  }
}

TEST(MpiTransport, RanksMatchTheWorld) {
  auto t = MakeTransport();
  EXPECT_EQ(t->rank(), WorldRank());
  EXPECT_EQ(t->world_size(), WorldSize());
  EXPECT_EQ(t->name(), "mpi");
}

TEST(MpiTransport, RandomPlansMoveEveryByteForwardAndBackward) {
  auto t = MakeTransport();
  for (uint64_t seed = 1; seed <= 25; ++seed) {
    RandomExchangeOptions o;
    o.world_size = t->world_size();
    o.seed = seed;
    o.max_item_bytes = seed % 5 == 0 ? 200000 : 3000;
    const auto plans = RandomExchangePlans(o);
    double seconds = -1;
    absl::Status s =
        ExchangeAndVerify(*t, plans[t->rank()], ExchangeContext{seed, o.world_size}, &seconds);
    ASSERT_TRUE(s.ok()) << "seed " << seed << ": " << s;
    EXPECT_GE(seconds, 0);
  }
  EXPECT_EQ(t->large_exchanges(), 0u);
  EXPECT_EQ(t->exchanges(), 50u);
}

TEST(MpiTransport, TransfersAboveTheIntLimitGoInChunks) {
  MpiTransportOptions opts = TestOptions();
  opts.max_count = 1000;  // stands in for INT_MAX: transfers and offsets above it
  auto t = MakeTransport(opts);
  for (uint64_t seed = 100; seed < 110; ++seed) {
    RandomExchangeOptions o;
    o.world_size = t->world_size();
    o.seed = seed;
    o.max_item_bytes = 5000;
    const auto plans = RandomExchangePlans(o);
    absl::Status s =
        ExchangeAndVerify(*t, plans[t->rank()], ExchangeContext{seed, o.world_size}, nullptr);
    ASSERT_TRUE(s.ok()) << "seed " << seed << ": " << s;
  }
  EXPECT_GT(t->large_exchanges(), 0u);
}

TEST(MpiTransport, EmptyExchange) {
  auto t = MakeTransport();
  v1::RankPlan plan;
  plan.set_rank(t->rank());
  plan.set_plan_version(kMinExchangePlanVersion);
  EXPECT_TRUE(t->Exchange(plan, nullptr, 0, nullptr, 0).ok());
  EXPECT_TRUE(t->ExchangeBackward(plan, nullptr, 0, nullptr, 0).ok());
}

// Buffers for rank r's forward exchange, the receive side poisoned.
struct Buffers {
  std::vector<uint8_t> send, recv;
  explicit Buffers(const v1::RankPlan& p)
      : send(p.exchange().send_bytes()), recv(p.exchange().recv_bytes(), 0xAB) {
    EXPECT_TRUE(FillPattern(p.exchange().sends(), kForwardSalt, send.data(), send.size()).ok());
  }
  bool RecvUntouched() const {
    for (uint8_t b : recv) {
      if (b != 0xAB) return false;
    }
    return true;
  }
};

std::vector<v1::RankPlan> Plans(uint32_t world, uint64_t seed) {
  RandomExchangeOptions o;
  o.world_size = world;
  o.seed = seed;
  o.empty_pair_fraction = 0;  // every pair exchanges something
  o.max_item_bytes = 512;
  return RandomExchangePlans(o);
}

// Makes `plan` send `extra` more bytes to rank 2 (its third transfer) in its first item there.
void SendRank2More(v1::RankPlan* plan, uint64_t extra) {
  v1::Transfer* to2 = plan->mutable_exchange()->mutable_sends(2);
  ASSERT_EQ(to2->peer(), 2u);
  to2->mutable_items(0)->set_bytes(to2->items(0).bytes() + extra);
  to2->set_bytes(to2->bytes() + extra);
  plan->mutable_exchange()->set_send_bytes(plan->exchange().send_bytes() + extra);
}

TEST(MpiTransport, SendBufferSizeMismatchOnEveryRank) {
  auto t = MakeTransport();
  const auto plans = Plans(t->world_size(), 7);
  const v1::RankPlan& plan = plans[t->rank()];
  Buffers b(plan);
  b.send.push_back(0);  // one byte too many
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ExchangeContext{7, t->world_size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Every rank refused; each reports rank 0's reason and names the others.
  EXPECT_THAT(Msg(s), HasSubstr("rank 0 refused the exchange: step 7, rank 0"));
  EXPECT_THAT(Msg(s), HasSubstr("send buffer size mismatch"));
  EXPECT_THAT(Msg(s),
              HasSubstr("expected " + std::to_string(plans[0].exchange().send_bytes()) + " bytes"));
  EXPECT_THAT(Msg(s), HasSubstr("given " + std::to_string(plans[0].exchange().send_bytes() + 1)));
  if (t->world_size() > 1) {
    EXPECT_THAT(Msg(s), HasSubstr("refused too"));
  }
  ExpectSameOnEveryRank(s);
  EXPECT_TRUE(b.RecvUntouched());
}

TEST(MpiTransport, ReceiveBufferMismatchOnOneRankFailsEveryRankAndNothingMoves) {
  auto t = MakeTransport();
  const auto plans = Plans(t->world_size(), 8);
  const v1::RankPlan& plan = plans[t->rank()];
  Buffers b(plan);
  const uint32_t bad = 1 % t->world_size();
  const size_t recv_size = t->rank() == bad ? b.recv.size() - 1 : b.recv.size();
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), recv_size,
                               ExchangeContext{8, t->world_size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr("step 8, forward exchange #"));
  EXPECT_THAT(Msg(s), HasSubstr("rank " + std::to_string(bad) + " refused the exchange"));
  EXPECT_THAT(Msg(s), HasSubstr("receive buffer size mismatch"));
  ExpectSameOnEveryRank(s);
  EXPECT_TRUE(b.RecvUntouched());
  // The transport is still usable.
  EXPECT_TRUE(ExchangeAndVerify(*t, plan, ExchangeContext{8, t->world_size()}, nullptr).ok());
}

TEST(MpiTransport, PlanForAnotherWorldSizeIsRefusedOnEveryRank) {
  auto t = MakeTransport();
  const uint32_t planned = t->world_size() - 1;
  auto plans = Plans(planned, 9);
  v1::RankPlan plan;
  if (t->rank() < planned) {
    plan = plans[t->rank()];
  } else {
    plan.set_rank(t->rank());  // a rank the plan does not know
  }
  Buffers b(plan);
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ExchangeContext{9, planned});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s),
              HasSubstr("the plan is for " + std::to_string(planned) +
                        " ranks but the communicator has " + std::to_string(t->world_size())));
  EXPECT_TRUE(b.RecvUntouched());
}

TEST(MpiTransport, PlanNamingAPeerOutsideTheCommunicatorIsRefused) {
  auto t = MakeTransport();
  auto plans = Plans(t->world_size() + 1, 10);  // world size unknown to the transport
  v1::RankPlan plan = plans[t->rank()];
  Buffers b(plan);
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr("names peer rank " + std::to_string(t->world_size())));
  EXPECT_TRUE(b.RecvUntouched());
}

TEST(MpiTransport, AnotherRanksPlanIsRefused) {
  auto t = MakeTransport();
  auto plans = Plans(t->world_size(), 11);
  const v1::RankPlan& plan = plans[(t->rank() + 1) % t->world_size()];
  Buffers b(plan);
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("was given rank"));
}

TEST(MpiTransport, PlansThatDisagreeAreRefusedOnEveryRank) {
  auto t = MakeTransport();
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  auto plans = Plans(t->world_size(), 12);
  // Rank 0 believes it sends 8 more bytes to rank 2 than rank 2 expects.
  v1::RankPlan plan = plans[t->rank()];
  if (t->rank() == 0) {
    ASSERT_NO_FATAL_FAILURE(SendRank2More(&plan, 8));
  }
  Buffers b(plan);
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ExchangeContext{12, t->world_size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // Ranks 0 and 2 each see the disagreement; every rank reports rank 0's view.
  EXPECT_THAT(Msg(s), HasSubstr("step 12, forward exchange #"));
  EXPECT_THAT(Msg(s),
              HasSubstr("rank 2 expects " + std::to_string(plans[0].exchange().sends(2).bytes()) +
                        " bytes from rank 0 but rank 0's plan sends it " +
                        std::to_string(plans[0].exchange().sends(2).bytes() + 8)));
  ExpectSameOnEveryRank(s);
  EXPECT_TRUE(b.RecvUntouched());
}

// Makes `plan` send its bytes to rank 2 in other items (same total): the
// first two items merged, or the first one split in two.
void SplitRank2Differently(v1::RankPlan* plan) {
  v1::Transfer* to2 = plan->mutable_exchange()->mutable_sends(2);
  ASSERT_EQ(to2->peer(), 2u);
  if (to2->items_size() >= 2) {
    to2->mutable_items(0)->set_bytes(to2->items(0).bytes() + to2->items(1).bytes());
    to2->mutable_items()->DeleteSubrange(1, 1);
  } else {
    ASSERT_GE(to2->items(0).bytes(), 2u);
    const uint64_t half = to2->items(0).bytes() / 2;
    to2->mutable_items(0)->set_bytes(to2->items(0).bytes() - half);
    *to2->add_items() = to2->items(0);
    to2->mutable_items(1)->set_bytes(half);
  }
}

// Two ends that split a pair's bytes into different items (equal totals)
// fail every rank alike instead of one rank failing with a truncated message
// while another waits for a receive that never comes; nothing is received
// and the next exchange moves every byte.
TEST(MpiTransport, PlansThatSplitAPairsBytesDifferentlyAreRefusedOnEveryRank) {
  auto t = MakeTransport();
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const auto plans = Plans(t->world_size(), 17);
  v1::RankPlan plan = plans[t->rank()];
  if (t->rank() == 0) {
    ASSERT_NO_FATAL_FAILURE(SplitRank2Differently(&plan));
  }
  Buffers b(plan);
  const ExchangeContext ctx{17, t->world_size()};
  absl::Status s =
      t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects the " +
                                std::to_string(plans[0].exchange().sends(2).bytes()) +
                                " bytes from rank 0 in other items than rank 0's plan"));
  ExpectSameOnEveryRank(s);
  EXPECT_TRUE(b.RecvUntouched());
  absl::Status next = ExchangeAndVerify(*t, plans[t->rank()], ctx, nullptr);
  ASSERT_TRUE(next.ok()) << next;
}

// A plan from before the contiguous layout (plan_version 3) on one rank
// fails every rank alike, naming both versions; nothing is received, and the
// next exchange moves every byte.
TEST(MpiTransport, AnOldLayoutPlanIsRefusedOnEveryRank) {
  auto t = MakeTransport();
  const auto plans = Plans(t->world_size(), 27);
  v1::RankPlan plan = plans[t->rank()];
  const uint32_t old_rank = t->world_size() > 1 ? 1 : 0;
  if (t->rank() == old_rank) plan.set_plan_version(3);
  Buffers b(plan);
  const ExchangeContext ctx{27, t->world_size()};
  absl::Status s =
      t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr(absl::StrCat("rank ", old_rank, " refused the exchange")));
  EXPECT_THAT(Msg(s), HasSubstr("the plan is plan_version 3 but this client's exchange needs "
                                "plan_version 4 or later"));
  ExpectSameOnEveryRank(s);
  EXPECT_TRUE(b.RecvUntouched());
  absl::Status next = ExchangeAndVerify(*t, plans[t->rank()], ctx, nullptr);
  ASSERT_TRUE(next.ok()) << next;
}

// `list` with only `encoder`'s items (a transfer keeps its peer; bytes
// recounted): the layout of one encoder's exchange, for the pattern helpers.
google::protobuf::RepeatedPtrField<v1::Transfer> OfEncoder(
    const google::protobuf::RepeatedPtrField<v1::Transfer>& list, v1::Encoder encoder) {
  google::protobuf::RepeatedPtrField<v1::Transfer> out;
  for (const v1::Transfer& t : list) {
    v1::Transfer* u = out.Add();
    u->set_peer(t.peer());
    for (const v1::TransferItem& item : t.items()) {
      if (item.encoder() != encoder) continue;
      *u->add_items() = item;
      u->set_bytes(u->bytes() + item.bytes());
    }
  }
  return out;
}

uint64_t Total(const google::protobuf::RepeatedPtrField<v1::Transfer>& list) {
  uint64_t n = 0;
  for (const v1::Transfer& t : list) n += t.bytes();
  return n;
}

// The messages this rank posted in its latest exchange are one per peer
// that `list` gives bytes (none to itself).
void ExpectOneMessagePerPeer(const MpiTransport& t,
                             const google::protobuf::RepeatedPtrField<v1::Transfer>& list,
                             const std::string& what) {
  std::vector<uint64_t> want(t.world_size(), 0);
  for (const v1::Transfer& tr : list) {
    if (tr.peer() != t.rank() && tr.bytes() > 0) want[tr.peer()] = 1;
  }
  EXPECT_EQ(t.messages_sent_to(), want) << what;
}

// Every pair is one message per direction, whatever its item count: over
// every item at once, and for each encoder on its own, whose send buffer is
// that encoder's output as its EncoderPhase lists it (the forward send
// layout of that encoder's items) and whose gradients come back the same
// way. Every byte checked.
TEST(MpiTransport, EveryPairIsOneMessagePerDirection) {
  auto t = MakeTransport();
  uint64_t items = 0, messages = 0;
  for (uint64_t seed = 300; seed < 312; ++seed) {
    RandomExchangeOptions o;
    o.world_size = t->world_size();
    o.seed = seed;
    o.max_items_per_pair = 6;
    o.max_item_bytes = seed % 3 == 0 ? 100000 : 2000;
    const auto plans = RandomExchangePlans(o);
    const v1::RankPlan& plan = plans[t->rank()];
    const v1::Exchange& ex = plan.exchange();
    ASSERT_TRUE(ExchangeAndVerify(*t, plan, ExchangeContext{seed, o.world_size}, nullptr).ok());
    ExpectOneMessagePerPeer(*t, ex.recvs(), absl::StrCat("seed ", seed, ", backward"));
    for (v1::Encoder e : {v1::ENCODER_VISION, v1::ENCODER_AUDIO}) {
      const auto sends = OfEncoder(ex.sends(), e), recvs = OfEncoder(ex.recvs(), e);
      ExchangeContext ctx{seed, o.world_size};
      ctx.encoder = e;
      const std::string what = absl::StrCat("seed ", seed, ", encoder ", e);
      std::vector<uint8_t> out(Total(sends)), in(Total(recvs), 0xAB);
      ASSERT_TRUE(FillPattern(sends, kForwardSalt, out.data(), out.size()).ok());
      absl::Status s = t->Exchange(plan, out.data(), out.size(), in.data(), in.size(), ctx);
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      EXPECT_TRUE(VerifyPattern(recvs, kForwardSalt, in.data(), in.size()).ok()) << what;
      ExpectOneMessagePerPeer(*t, sends, what + ", forward");
      ASSERT_TRUE(FillPattern(recvs, kBackwardSalt, in.data(), in.size()).ok());
      std::fill(out.begin(), out.end(), 0xAB);
      s = t->ExchangeBackward(plan, in.data(), in.size(), out.data(), out.size(), ctx);
      ASSERT_TRUE(s.ok()) << what << ": " << s;
      EXPECT_TRUE(VerifyPattern(sends, kBackwardSalt, out.data(), out.size()).ok()) << what;
      ExpectOneMessagePerPeer(*t, recvs, what + ", backward");
      for (const v1::Transfer& tr : sends) {
        if (tr.peer() == t->rank()) continue;
        items += tr.items_size();
        messages += t->messages_sent_to()[tr.peer()] > 0 ? 1 : 0;
      }
    }
  }
  if (t->world_size() > 1) {
    EXPECT_GT(items, messages) << "the plans should put several items in a pair";
  }
}

// Ranks that run different encoders' exchanges fail alike, saying so.
TEST(MpiTransport, RanksExchangingDifferentEncodersAreRefused) {
  auto t = MakeTransport();
  if (t->world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const auto plans = Plans(t->world_size(), 29);
  const v1::RankPlan& plan = plans[t->rank()];
  ExchangeContext ctx{29, t->world_size()};
  ctx.encoder = t->rank() == 0 ? v1::ENCODER_AUDIO : v1::ENCODER_VISION;
  const auto sends = OfEncoder(plan.exchange().sends(), ctx.encoder);
  const auto recvs = OfEncoder(plan.exchange().recvs(), ctx.encoder);
  std::vector<uint8_t> out(Total(sends)), in(Total(recvs), 0xAB);
  absl::Status s = t->Exchange(plan, out.data(), out.size(), in.data(), in.size(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("rank 1 exchanges the vision encoder's items but rank 0 the audio "
                                "encoder's items"));
  ExpectSameOnEveryRank(s);
  for (uint8_t x : in) ASSERT_EQ(x, 0xAB);
}

TEST(MpiTransport, RanksOnDifferentStepsAreRefused) {
  auto t = MakeTransport();
  auto plans = Plans(t->world_size(), 13);
  const v1::RankPlan& plan = plans[t->rank()];
  Buffers b(plan);
  const uint64_t step = t->rank() == t->world_size() - 1 ? 8 : 7;
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ExchangeContext{step, t->world_size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(Msg(s), HasSubstr("step"));
  EXPECT_TRUE(b.RecvUntouched());
}

// Plans in which every pair exchanges items above every eager limit.
std::vector<v1::RankPlan> LargePlans(uint32_t world, uint64_t seed) {
  RandomExchangeOptions o;
  o.world_size = world;
  o.seed = seed;
  o.empty_pair_fraction = 0;
  o.max_item_bytes = 300000;
  return RandomExchangePlans(o);
}

// Sends go out before the agreement: when it fails, every message already
// posted (large ones too, still waiting for their receiver) is received and
// dropped, so none matches a later exchange and no receive buffer is written.
TEST(MpiTransport, SendsPostedBeforeAFailedAgreementAreWithdrawn) {
  auto t = MakeTransport();
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const auto plans = LargePlans(t->world_size(), 15);
  for (int round = 0; round < 2; ++round) {
    v1::RankPlan plan = plans[t->rank()];
    size_t recv_size = plan.exchange().recv_bytes();
    if (round == 0 && t->rank() == 1) --recv_size;  // rank 1 refuses its own input
    if (round == 1 && t->rank() == 0) {             // rank 0 sends rank 2 more than it expects
      ASSERT_NO_FATAL_FAILURE(SendRank2More(&plan, 4096));
    }
    Buffers b(plan);
    const uint64_t step = 15 + round;
    absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), recv_size,
                                 ExchangeContext{step, t->world_size()});
    EXPECT_EQ(s.code(), round == 0 ? absl::StatusCode::kInvalidArgument
                                   : absl::StatusCode::kFailedPrecondition)
        << s;
    EXPECT_TRUE(b.RecvUntouched()) << "round " << round;
    // Nothing of the failed exchange is left: the next one moves every byte.
    absl::Status next =
        ExchangeAndVerify(*t, plans[t->rank()], ExchangeContext{step, t->world_size()}, nullptr);
    ASSERT_TRUE(next.ok()) << "after round " << round << ": " << next;
  }
}

ExchangeContext ScratchContext(uint64_t step, uint32_t world) {
  ExchangeContext ctx{step, world};
  ctx.scratch_recv = true;
  return ctx;
}

// Receives posted with the sends (scratch receive memory) move every byte,
// in chunks too.
TEST(MpiTransport, ScratchReceivesMoveEveryByte) {
  for (const uint64_t max_count : {uint64_t{INT_MAX}, uint64_t{1000}}) {
    auto t = MakeTransport(Chunked(max_count));
    for (uint64_t seed = 200; seed < 220; ++seed) {
      RandomExchangeOptions o;
      o.world_size = t->world_size();
      o.seed = seed;
      o.max_item_bytes = seed % 4 == 0 ? 200000 : 3000;
      const auto plans = RandomExchangePlans(o);
      const ExchangeContext ctx = ScratchContext(seed, o.world_size);
      absl::Status s = ExchangeAndVerify(*t, plans[t->rank()], ctx, nullptr);
      ASSERT_TRUE(s.ok()) << "seed " << seed << ": " << s;
    }
    EXPECT_EQ(t->large_exchanges() > 0, max_count == 1000);
  }
}

// With scratch receive memory the data moves while the agreement waits: a
// pair's bytes land before the last rank has joined the exchange (it joins
// only once they have, or after 10 s).
TEST(MpiTransport, ScratchReceivesArePostedBeforeTheAgreement) {
  MpiTransportOptions opts = TestOptions();
  opts.join_timeout = absl::Seconds(60);
  auto t = MakeTransport(opts);
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const auto plans = Plans(t->world_size(), 19);
  const v1::RankPlan& plan = plans[t->rank()];
  char dir[512] = {};
  if (t->rank() == 0) {
    const std::string tmpl = ::testing::TempDir() + "/scratch_recv_XXXXXX";
    std::snprintf(dir, sizeof(dir), "%s", tmpl.c_str());
    ASSERT_NE(mkdtemp(dir), nullptr);
  }
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  const std::string flag = std::string(dir) + "/landed";
  const uint32_t late = t->world_size() - 1;
  Buffers b(plan);
  // What rank 1 receives from rank 0, and where.
  std::vector<uint8_t> expected(plan.exchange().recv_bytes());
  ASSERT_TRUE(
      FillPattern(plan.exchange().recvs(), kForwardSalt, expected.data(), expected.size()).ok());
  uint64_t from0 = 0, from0_bytes = 0;
  for (const v1::Transfer& tr : plan.exchange().recvs()) {
    if (tr.peer() == 0) {
      from0_bytes = tr.bytes();
      break;
    }
    from0 += tr.bytes();
  }
  std::atomic<bool> stop{false}, landed{false};
  std::thread watcher;
  if (t->rank() == 1) {
    ASSERT_GT(from0_bytes, 0u);
    watcher = std::thread([&] {
      while (!stop.load()) {
        bool all = true;
        for (uint64_t k = from0; k < from0 + from0_bytes && all; ++k) {
          all = std::atomic_ref<uint8_t>(b.recv[k]).load(std::memory_order_relaxed) == expected[k];
        }
        if (all) {
          std::ofstream(flag) << "1";
          landed.store(true);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
  }
  bool saw_flag = false;
  if (t->rank() == late) {
    for (int k = 0; k < 1000 && !saw_flag; ++k) {
      saw_flag = std::ifstream(flag).good();
      if (!saw_flag) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ScratchContext(19, t->world_size()));
  stop.store(true);
  if (watcher.joinable()) watcher.join();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(
      VerifyPattern(plan.exchange().recvs(), kForwardSalt, b.recv.data(), b.recv.size()).ok());
  if (t->rank() == late) {
    EXPECT_TRUE(saw_flag) << "rank 0's bytes had not reached rank 1 after 10 s before rank " << late
                          << " joined the exchange";
  }
  if (t->rank() == 1) {
    EXPECT_TRUE(landed.load());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (t->rank() == 0) {
    std::remove(flag.c_str());
    ::rmdir(dir);
  }
}

// A failed agreement with receives posted early: every rank fails alike,
// each posted receive is cancelled or, where a message already matched it,
// counted, and the rest of what peers sent is drained, so the next exchange
// (scratch too) moves every byte. Large messages (rendezvous) and chunks.
TEST(MpiTransport, ScratchReceivesOfAFailedAgreementAreWithdrawn) {
  if (WorldSize() < 3) GTEST_SKIP() << "needs 3 ranks";
  for (const uint64_t max_count : {uint64_t{INT_MAX}, uint64_t{70000}}) {
    auto t = MakeTransport(Chunked(max_count));
    const auto plans = LargePlans(t->world_size(), 21);
    enum Case { kRefuses, kSendsMore, kSplits, kOtherStep, kCases };
    for (int c = 0; c < kCases; ++c) {
      v1::RankPlan plan = plans[t->rank()];
      size_t recv_size = plan.exchange().recv_bytes();
      uint64_t step = 30 + c;
      if (c == kRefuses && t->rank() == 1) --recv_size;
      if (c == kSendsMore && t->rank() == 0) {
        ASSERT_NO_FATAL_FAILURE(SendRank2More(&plan, 4096));
      }
      if (c == kSplits && t->rank() == 0) {
        ASSERT_NO_FATAL_FAILURE(SplitRank2Differently(&plan));
      }
      if (c == kOtherStep && t->rank() == t->world_size() - 1) ++step;
      Buffers b(plan);
      const ExchangeContext ctx = ScratchContext(step, t->world_size());
      absl::Status s =
          t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), recv_size, ctx);
      const std::string what = absl::StrCat("case ", c, ", max_count ", max_count);
      EXPECT_EQ(s.code(), c == kRefuses ? absl::StatusCode::kInvalidArgument
                                        : absl::StatusCode::kFailedPrecondition)
          << what << ": " << s;
      if (c == kSendsMore) {
        EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects")) << what;
      } else if (c == kSplits) {
        EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects the")) << what;
      } else if (c == kRefuses) {
        EXPECT_THAT(Msg(s), HasSubstr("rank 1 refused the exchange")) << what;
      }
      ExpectSameOnEveryRank(s, what);
      // Nothing of the failed exchange is left: the next one moves every byte.
      const ExchangeContext again = ScratchContext(30 + c, t->world_size());
      absl::Status next = ExchangeAndVerify(*t, plans[t->rank()], again, nullptr);
      ASSERT_TRUE(next.ok()) << "after " << what << ": " << next;
    }
  }
}

// Leaves messages of an abandoned agreement behind on its communicator: keep last.
TEST(MpiTransport, ZZ_ARankThatNeverArrivesIsReportedNotAHang) {
  MpiTransportOptions opts = TestOptions();
  opts.join_timeout = absl::Seconds(2);
  auto t = MakeTransport(opts);
  auto plans = Plans(t->world_size(), 14);
  const v1::RankPlan& plan = plans[t->rank()];
  Buffers b(plan);
  const uint32_t late = t->world_size() - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (t->rank() == late) std::this_thread::sleep_for(std::chrono::seconds(4));
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ExchangeContext{14, t->world_size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  if (t->rank() != late) {
    EXPECT_THAT(Msg(s),
                HasSubstr("rank(s) " + std::to_string(late) + " did not join the exchange"));
    EXPECT_TRUE(b.RecvUntouched());
  } else {
    // Its agreement completed with the others' earlier contributions, but
    // nobody sends it data: it says so, and that its buffer is incomplete.
    EXPECT_THAT(Msg(s), HasSubstr("did not complete the exchange"));
    EXPECT_THAT(Msg(s), HasSubstr("the receive buffer is incomplete"));
  }
  absl::Status again =
      t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size());
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_THAT(Msg(again), HasSubstr("timed out"));
  MPI_Barrier(MPI_COMM_WORLD);
}

// With scratch receive memory, ranks that time out leave their receives to
// a late peer no longer cancelled blindly: the exchange's memory is kept for
// the process's life. Breaks its transport (a communicator of its own).
TEST(MpiTransport, ZZ_ScratchMemoryOutlivesATimeout) {
  MpiTransportOptions opts = TestOptions();
  opts.join_timeout = absl::Seconds(2);
  auto t = MakeTransport(opts);
  auto plans = Plans(t->world_size(), 23);
  const v1::RankPlan& plan = plans[t->rank()];
  auto b = std::make_shared<Buffers>(plan);
  const uint32_t late = t->world_size() - 1;
  ExchangeContext ctx = ScratchContext(23, t->world_size());
  ctx.keepalive = b;
  MPI_Barrier(MPI_COMM_WORLD);
  if (t->rank() == late) std::this_thread::sleep_for(std::chrono::seconds(4));
  absl::Status s =
      t->Exchange(plan, b->send.data(), b->send.size(), b->recv.data(), b->recv.size(), ctx);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  if (t->rank() != late) {
    EXPECT_THAT(Msg(s),
                HasSubstr("rank(s) " + std::to_string(late) + " did not join the exchange"));
  }
  ctx.keepalive.reset();
  EXPECT_GE(b.use_count(), 2) << "the transport let go of the exchange's memory after a timeout";
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  return tutti::testing::RunAllTestsOnEveryRank();
}
