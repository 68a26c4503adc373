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
    auto t = MakeTransport(Chunked(max_count));
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

// How one side of an item-wise exchange holds its items.
enum class Memory {
  kFlat,     // back to back in plan order
  kApart,    // every third item 16 bytes after the one before it
  kMissing,  // some items without memory (sends zeros, drops what arrives)
};

// Whether `item` has no memory on a side held as `mem`: the sends and the
// receives leave out different items.
bool Missing(Memory mem, bool receive, const v1::TransferItem& item) {
  return mem == Memory::kMissing && item.sample_id() % 3 == (receive ? 1u : 0u);
}

uint64_t BytesOf(const Transfers& list) {
  uint64_t n = 0;
  for (const v1::Transfer& t : list) n += t.bytes();
  return n;
}

// One side's memory: `buf`, 0xAB where no item lies, and each item's place.
struct ItemSide {
  std::vector<uint8_t> buf;
  std::vector<ItemBuffer> items;
};

// Lays `list`'s items out as `mem` says and writes `flat` (the items back to
// back) into the items that have memory.
ItemSide Hold(const Transfers& list, Memory mem, bool receive, const std::vector<uint8_t>& flat) {
  std::vector<int64_t> at;
  uint64_t size = 0;
  for (const v1::Transfer& t : list) {
    for (const v1::TransferItem& item : t.items()) {
      if (Missing(mem, receive, item)) {
        at.push_back(-1);
        continue;
      }
      if (mem == Memory::kApart && at.size() % 3 == 0) size += 16;
      at.push_back(static_cast<int64_t>(size));
      size += item.bytes();
    }
  }
  ItemSide s;
  s.buf.assign(size, 0xAB);
  uint64_t from = 0;
  size_t k = 0;
  for (const v1::Transfer& t : list) {
    for (const v1::TransferItem& item : t.items()) {
      uint8_t* d = at[k] < 0 ? nullptr : s.buf.data() + at[k];
      if (d != nullptr && item.bytes() > 0) std::memcpy(d, flat.data() + from, item.bytes());
      s.items.push_back({d, item.bytes()});
      from += item.bytes();
      ++k;
    }
  }
  return s;
}

// The messages a rank posts to its peers for `list`: one per run (per item
// without runs) in chunks of max_count, nothing for itself.
uint64_t MessagesFor(const Transfers& list, uint32_t rank, uint64_t max_count) {
  uint64_t messages = 0;
  for (const v1::Transfer& t : list) {
    if (t.peer() == rank) continue;
    std::vector<uint32_t> runs(t.runs().begin(), t.runs().end());
    if (runs.empty()) runs.assign(t.items_size(), 1);
    int k = 0;
    for (uint32_t n : runs) {
      uint64_t bytes = 0;
      for (uint32_t i = 0; i < n; ++i) bytes += t.items(k++).bytes();
      messages += (bytes + max_count - 1) / max_count;
    }
  }
  return messages;
}

// The item-wise exchange of `plan` in `dir`, the sends held as `send_mem` and
// the receives as `recv_mem`: every byte of the receive side checked (the
// pattern, zeros for items the sender has no memory for, 0xAB between
// items), and the messages this rank posted counted.
absl::Status HeldAndVerify(MpiTransport& t, const v1::RankPlan& plan, ExchangeDirection dir,
                           Memory send_mem, Memory recv_mem, const ExchangeContext& ctx,
                           uint64_t max_count) {
  const bool fwd = dir == ExchangeDirection::kForward;
  const Transfers& sends = fwd ? plan.exchange().sends() : plan.exchange().recvs();
  const Transfers& recvs = fwd ? plan.exchange().recvs() : plan.exchange().sends();
  const uint64_t salt = fwd ? kForwardSalt : kBackwardSalt;
  std::vector<uint8_t> flat(BytesOf(sends));
  RETURN_IF_ERROR(FillPattern(sends, salt, flat.data(), flat.size()));
  const ItemSide out = Hold(sends, send_mem, false, flat);
  flat.assign(BytesOf(recvs), 0xAB);
  ItemSide in = Hold(recvs, recv_mem, true, flat);
  RETURN_IF_ERROR(t.ExchangeItems(plan, dir, out.items, in.items, ctx));
  RETURN_IF_ERROR(FillPattern(recvs, salt, flat.data(), flat.size()));
  uint64_t at = 0;
  for (const v1::Transfer& tr : recvs) {
    for (const v1::TransferItem& item : tr.items()) {
      if (Missing(send_mem, false, item)) std::memset(flat.data() + at, 0, item.bytes());
      at += item.bytes();
    }
  }
  const ItemSide want = Hold(recvs, recv_mem, true, flat);
  for (size_t k = 0; k < want.buf.size(); ++k) {
    if (in.buf[k] != want.buf[k]) {
      return absl::DataLossError(absl::StrCat("byte ", k, " of the receive memory is ", in.buf[k],
                                              ", expected ", want.buf[k]));
    }
  }
  const uint64_t expected = MessagesFor(sends, t.rank(), max_count);
  if (t.messages_sent() != expected) {
    return absl::InternalError(absl::StrCat("posted ", t.messages_sent(), " messages, expected ",
                                            expected, " (one per run and chunk)"));
  }
  return absl::OkStatus();
}

// Whether `s` is OK on every rank (the tests' own MPI_COMM_WORLD collective).
bool OkOnEveryRank(const absl::Status& s) {
  int mine = s.ok() ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// Each of a pair's runs moves as one message (a message per item without
// runs): in place where its items lie back to back on this rank, staged where
// they do not (items apart, items without memory on either end), forward and
// backward, with scratch receives or not, in chunks too; every byte checked.
TEST(MpiTransport, RunsMoveAsOneMessageEach) {
  const std::pair<Memory, Memory> held[] = {
      {Memory::kFlat, Memory::kFlat},     {Memory::kFlat, Memory::kApart},
      {Memory::kMissing, Memory::kFlat},  {Memory::kMissing, Memory::kApart},
      {Memory::kApart, Memory::kMissing}, {Memory::kMissing, Memory::kMissing}};
  for (const uint64_t max_count : {uint64_t{INT_MAX}, uint64_t{1000}}) {
    auto t = MakeTransport(Chunked(max_count));
    for (uint64_t seed = 300; seed < 312; ++seed) {
      RandomExchangeOptions o;
      o.world_size = t->world_size();
      o.seed = seed;
      o.max_items_per_pair = 8;
      o.max_item_bytes = seed % 4 == 0 ? 100000 : 2000;
      o.runs = seed % 6 != 0;  // and some plans without runs
      const auto plans = RandomExchangePlans(o);
      const ExchangeContext ctx =
          seed % 2 ? ScratchContext(seed, o.world_size) : ExchangeContext{seed, o.world_size};
      for (const auto& [send_mem, recv_mem] : held) {
        for (const ExchangeDirection dir :
             {ExchangeDirection::kForward, ExchangeDirection::kBackward}) {
          absl::Status s =
              HeldAndVerify(*t, plans[t->rank()], dir, send_mem, recv_mem, ctx, max_count);
          EXPECT_TRUE(s.ok()) << "seed " << seed << ", " << ExchangeDirectionName(dir)
                              << ", memory " << static_cast<int>(send_mem) << "/"
                              << static_cast<int>(recv_mem) << ", max_count " << max_count << ": "
                              << s;
          if (!OkOnEveryRank(s)) return;  // all ranks stop together
        }
      }
    }
  }
}

// Items without memory on both sides of one rank, item by item: the zeros it
// sends are not the memory that drops what arrives for it (large messages,
// whose sends read their memory while other receives land).
TEST(MpiTransport, ItemsWithoutMemorySendZerosWhileOthersArrive) {
  auto t = MakeTransport();
  for (uint64_t seed = 320; seed < 324; ++seed) {
    RandomExchangeOptions o;
    o.world_size = t->world_size();
    o.seed = seed;
    o.max_items_per_pair = 6;
    o.max_item_bytes = 200000;
    const auto plans = RandomExchangePlans(o);
    for (const ExchangeDirection dir :
         {ExchangeDirection::kForward, ExchangeDirection::kBackward}) {
      absl::Status s = HeldAndVerify(*t, plans[t->rank()], dir, Memory::kMissing, Memory::kMissing,
                                     ExchangeContext{seed, o.world_size}, INT_MAX);
      EXPECT_TRUE(s.ok()) << "seed " << seed << ", " << ExchangeDirectionName(dir) << ": " << s;
      if (!OkOnEveryRank(s)) return;
    }
  }
}

// Two ends that split a pair's items into different runs fail every rank
// alike, item-wise and contiguous (their messages would not match), with the
// message of other items; nothing is received and the next exchange moves
// every byte.
TEST(MpiTransport, PlansWhoseEndsDisagreeOnRunsAreRefusedOnEveryRank) {
  auto t = MakeTransport();
  if (t->world_size() < 3) GTEST_SKIP() << "needs 3 ranks";
  RandomExchangeOptions o;
  o.world_size = t->world_size();
  o.empty_pair_fraction = 0;
  o.max_items_per_pair = 4;
  o.max_item_bytes = 512;
  o.runs = true;
  std::vector<v1::RankPlan> plans;
  for (o.seed = 41; plans.empty() || plans[0].exchange().sends(2).items_size() < 2; ++o.seed) {
    plans = RandomExchangePlans(o);
  }
  for (int c = 0; c < 4; ++c) {
    const bool items = c < 2, scratch = c % 2;
    v1::RankPlan plan = plans[t->rank()];
    v1::Transfer* to2 = plan.mutable_exchange()->mutable_sends(2);
    ASSERT_EQ(to2->peer(), 2u);
    if (t->rank() == 0) {  // rank 0 groups its items to rank 2 otherwise than rank 2 does
      const int n = to2->items_size();
      const bool one_run = to2->runs_size() == 1;
      to2->clear_runs();
      to2->add_runs(one_run ? 1 : n);
      if (one_run) to2->add_runs(n - 1);
    }
    Buffers b(plan);
    const ExchangeContext ctx =
        scratch ? ScratchContext(43, t->world_size()) : ExchangeContext{43, t->world_size()};
    absl::Status s =
        items ? t->ExchangeItems(plan, ExchangeDirection::kForward,
                                 ItemsOf(plan.exchange().sends(), b.send.data()),
                                 ItemsOf(plan.exchange().recvs(), b.recv.data()), ctx)
              : t->Exchange(plan, b.send.data(), b.send.size(), b.recv.data(), b.recv.size(), ctx);
    const std::string what =
        absl::StrCat(items ? "item-wise" : "contiguous", scratch ? ", scratch receives" : "");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << what << ": " << s;
    EXPECT_THAT(Msg(s), HasSubstr("rank 2 expects the " +
                                  std::to_string(plans[0].exchange().sends(2).bytes()) +
                                  " bytes from rank 0 in other items than rank 0's plan"))
        << what;
    ExpectSameOnEveryRank(s, what);
    if (!scratch) {
      EXPECT_TRUE(b.RecvUntouched()) << what;
    }
    absl::Status next = ItemsAndVerify(*t, plans[t->rank()], ctx);
    ASSERT_TRUE(next.ok()) << "after " << what << ": " << next;
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
