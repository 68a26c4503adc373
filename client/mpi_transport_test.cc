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
  EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects " +
                                std::to_string(plans[0].exchange().sends(2).bytes()) +
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
    EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects the " +
                                  std::to_string(plans[0].exchange().sends(2).bytes()) +
                                  " bytes from rank 0 in other items than rank 0's plan"));
    ExpectSameOnEveryRank(s, items ? "item-wise" : "contiguous");
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

// The item-wise forward and backward exchange of `plan`, every byte checked.
absl::Status ItemsAndVerify(Transport& t, const v1::RankPlan& plan, const ExchangeContext& ctx) {
  const v1::Exchange& ex = plan.exchange();
  std::vector<uint8_t> send(ex.send_bytes()), recv(ex.recv_bytes(), 0xAB);
  RETURN_IF_ERROR(FillPattern(ex.sends(), kForwardSalt, send.data(), send.size()));
  RETURN_IF_ERROR(t.ExchangeItems(plan, ExchangeDirection::kForward,
                                  ItemsOf(ex.sends(), send.data()),
                                  ItemsOf(ex.recvs(), recv.data()), ctx));
  const absl::Status forward = VerifyPattern(ex.recvs(), kForwardSalt, recv.data(), recv.size());
  std::vector<uint8_t> back(ex.send_bytes(), 0xAB);
  RETURN_IF_ERROR(FillPattern(ex.recvs(), kBackwardSalt, recv.data(), recv.size()));
  RETURN_IF_ERROR(t.ExchangeItems(plan, ExchangeDirection::kBackward,
                                  ItemsOf(ex.recvs(), recv.data()),
                                  ItemsOf(ex.sends(), back.data()), ctx));
  RETURN_IF_ERROR(forward);
  return VerifyPattern(ex.sends(), kBackwardSalt, back.data(), back.size());
}

// Receives posted with the sends (scratch receive memory) move every byte,
// contiguous and item by item, in chunks too.
TEST(MpiTransport, ScratchReceivesMoveEveryByte) {
  for (const uint64_t max_count : {uint64_t{INT_MAX}, uint64_t{1000}}) {
    MpiTransportOptions opts = TestOptions();
    opts.max_count = max_count;
    auto t = MakeTransport(opts);
    for (uint64_t seed = 200; seed < 220; ++seed) {
      RandomExchangeOptions o;
      o.world_size = t->world_size();
      o.seed = seed;
      o.max_item_bytes = seed % 4 == 0 ? 200000 : 3000;
      const auto plans = RandomExchangePlans(o);
      const ExchangeContext ctx = ScratchContext(seed, o.world_size);
      absl::Status s = ExchangeAndVerify(*t, plans[t->rank()], ctx, nullptr);
      ASSERT_TRUE(s.ok()) << "seed " << seed << ", contiguous: " << s;
      s = ItemsAndVerify(*t, plans[t->rank()], ctx);
      ASSERT_TRUE(s.ok()) << "seed " << seed << ", item-wise: " << s;
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
    MpiTransportOptions opts = TestOptions();
    opts.max_count = max_count;
    auto t = MakeTransport(opts);
    const auto plans = LargePlans(t->world_size(), 21);
    enum Case { kRefuses, kSendsMore, kSplits, kOtherStep, kCases };
    for (int items = 0; items < 2; ++items) {
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
        absl::Status s;
        if (items) {
          std::vector<ItemBuffer> recv = ItemsOf(plan.exchange().recvs(), b.recv.data());
          if (c == kRefuses && t->rank() == 1) --recv.back().bytes;
          s = t->ExchangeItems(plan, ExchangeDirection::kForward,
                               ItemsOf(plan.exchange().sends(), b.send.data()), recv, ctx);
        } else {
          s = t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), recv_size, ctx);
        }
        const std::string what = absl::StrCat(items ? "item-wise" : "contiguous", ", case ", c,
                                              ", max_count ", max_count);
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
        absl::Status next = items ? ItemsAndVerify(*t, plans[t->rank()], again)
                                  : ExchangeAndVerify(*t, plans[t->rank()], again, nullptr);
        ASSERT_TRUE(next.ok()) << "after " << what << ": " << next;
      }
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
