// The MPI transport on a real communicator: run under mpirun (see
// client/CMakeLists.txt, test client_mpi_transport). Every test is collective:
// all ranks run the same tests in the same order.
#include "client/mpi_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "client/examples/rank_step.h"
#include "client/exchange_pattern.h"
#include "client/mpi_test_support.h"
#include "client/testing/random_exchange.h"

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

std::unique_ptr<MpiTransport> MakeTransport(MpiTransportOptions o = TestOptions()) {
  auto t = MpiTransport::Create(MPI_COMM_WORLD, o);
  EXPECT_TRUE(t.ok()) << t.status();
  return std::move(*t);
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

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
  EXPECT_THAT(Msg(s), HasSubstr("send buffer size mismatch"));
  EXPECT_THAT(Msg(s),
              HasSubstr("expected " + std::to_string(plan.exchange().send_bytes()) + " bytes"));
  EXPECT_THAT(Msg(s), HasSubstr("given " + std::to_string(plan.exchange().send_bytes() + 1)));
  EXPECT_THAT(Msg(s), HasSubstr("step 7, rank " + std::to_string(t->rank())));
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
  if (t->rank() == bad) {
    EXPECT_THAT(Msg(s), HasSubstr("receive buffer size mismatch"));
  } else {
    EXPECT_THAT(Msg(s), HasSubstr("rank " + std::to_string(bad) + " refused the exchange"));
    EXPECT_THAT(Msg(s), HasSubstr("receive buffer size mismatch"));
  }
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
  if (t->rank() == 0) ASSERT_NO_FATAL_FAILURE(SendRank2More(&plan, 8));
  Buffers b(plan);
  absl::Status s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(),
                               ExchangeContext{12, t->world_size()});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  if (t->rank() == 2) {
    EXPECT_THAT(Msg(s), HasSubstr("rank 0 sends " +
                                  std::to_string(plans[0].exchange().sends(2).bytes() + 8) +
                                  " bytes to rank 2 but rank 2's plan expects " +
                                  std::to_string(plans[0].exchange().sends(2).bytes())));
  } else if (t->rank() != 0) {
    EXPECT_THAT(Msg(s), HasSubstr("refused the exchange"));
  }
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

// Each item's memory within a flat buffer laid out over `list` (plan order).
std::vector<ItemBuffer> ItemsOf(const google::protobuf::RepeatedPtrField<v1::Transfer>& list,
                                uint8_t* base) {
  std::vector<ItemBuffer> items;
  uint64_t at = 0;
  for (const v1::Transfer& t : list) {
    for (const v1::TransferItem& item : t.items()) {
      items.push_back({base + at, item.bytes()});
      at += item.bytes();
    }
  }
  return items;
}

// Two ends that split a pair's bytes into different items (equal totals)
// fail every rank alike, item-wise and contiguous, instead of one rank
// failing with a truncated message while another waits for a receive that
// never comes; nothing is received and the next exchange moves every byte.
TEST(MpiTransport, PlansThatSplitAPairsBytesDifferentlyAreRefusedOnEveryRank) {
  auto t = MakeTransport();
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  const auto plans = Plans(t->world_size(), 17);
  for (int items = 1; items >= 0; --items) {
    v1::RankPlan plan = plans[t->rank()];
    if (t->rank() == 0) {
      ASSERT_NO_FATAL_FAILURE(SplitRank2Differently(&plan));
    }
    Buffers b(plan);
    const ExchangeContext ctx{17, t->world_size()};
    absl::Status s =
        items ? t->ExchangeItems(plan, ExchangeDirection::kForward,
                                 ItemsOf(plan.exchange().sends(), b.send.data()),
                                 ItemsOf(plan.exchange().recvs(), b.recv.data()), ctx)
              : t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(), ctx);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    if (t->rank() == 2) {
      EXPECT_THAT(Msg(s), HasSubstr("rank 0 splits the " +
                                    std::to_string(plans[0].exchange().sends(2).bytes()) +
                                    " bytes it sends to rank 2 into other items than rank 2's"));
    } else if (t->rank() == 0) {
      EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects the " +
                                    std::to_string(plans[0].exchange().sends(2).bytes()) +
                                    " bytes from rank 0 in other items than rank 0's plan"));
    } else {
      EXPECT_THAT(Msg(s), HasSubstr("refused the exchange"));
    }
    EXPECT_TRUE(b.RecvUntouched()) << (items ? "item-wise" : "contiguous");
    absl::Status next = ExchangeAndVerify(*t, plans[t->rank()], ctx, nullptr);
    ASSERT_TRUE(next.ok()) << next;
  }
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

// Sends go out before the agreement: when it fails, every message already
// posted (large ones too, still waiting for their receiver) is received and
// dropped, so none matches a later exchange and no receive buffer is written.
TEST(MpiTransport, SendsPostedBeforeAFailedAgreementAreWithdrawn) {
  auto t = MakeTransport();
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  RandomExchangeOptions o;
  o.world_size = t->world_size();
  o.seed = 15;
  o.empty_pair_fraction = 0;
  o.max_item_bytes = 300000;  // above every eager limit
  const auto plans = RandomExchangePlans(o);
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

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  return tutti::testing::RunAllTestsOnEveryRank();
}
