#include "services/packer/core/post_balancing/sequence_state.h"

#include <gtest/gtest.h>

#include <random>

namespace tutti::dispatch {
namespace {

SlotLayout Layout() {
  SlotLayout s;
  s.seq_len = 1000;
  s.text_micro_batches = 2;
  s.text_micro_batch = 2;  // text sequences 0,1 | 2,3
  s.vl_micro_batches = 1;
  s.vl_micro_batch = 1;  // VL sequence 4
  return s;
}

TEST(SlotLayoutTest, SequencesAndMicroBatches) {
  const SlotLayout s = Layout();
  EXPECT_EQ(s.sequences(), 5u);
  EXPECT_EQ(s.micro_batches(), 3u);
  EXPECT_EQ(s.micro_batch_of(1), 0u);
  EXPECT_EQ(s.micro_batch_of(2), 1u);
  EXPECT_EQ(s.micro_batch_of(4), 2u);
  EXPECT_TRUE(s.is_vl_sequence(4));
  EXPECT_FALSE(s.is_vl_sequence(3));
  EXPECT_EQ(s.first_sequence(2), 4u);
}

TEST(SequenceStateTest, UnpaddedCostIsSumOfDocs) {
  const CostModel m;
  SequenceState st({1, 1}, Layout(), m, /*padded=*/false);
  uint32_t q;
  double d;
  ASSERT_TRUE(st.BestSequence(0, 300, false, &q, &d));
  EXPECT_DOUBLE_EQ(d, m.Llm(300));
  st.Add(0, q, 300, m.Llm(300));
  ASSERT_TRUE(st.BestSequence(0, 200, false, &q, &d));
  st.Add(0, q, 200, m.Llm(200));
  EXPECT_DOUBLE_EQ(st.cost(0), m.Llm(300) + m.Llm(200));
  // Most room first: the second doc went to another (empty) sequence.
  EXPECT_EQ(st.tokens(0, 0) + st.tokens(0, 1) + st.tokens(0, 2) + st.tokens(0, 3), 500u);
  EXPECT_FALSE(st.BestSequence(0, 1001, false, &q, &d));
  EXPECT_FALSE(st.BestSequence(0, 1001, true, &q, &d));
}

TEST(SequenceStateTest, PaddedCostCountsLongestOfMicroBatch) {
  const CostModel m;
  SequenceState st({1, 1}, Layout(), m, /*padded=*/true);
  st.Add(0, 0, 600, m.Llm(600));
  EXPECT_DOUBLE_EQ(st.cost(0), 2 * m.Llm(600));  // micro-batch 0 has 2 sequences
  st.Add(0, 1, 100, m.Llm(100));                 // shorter: no change
  EXPECT_DOUBLE_EQ(st.cost(0), 2 * m.Llm(600));
  st.Add(0, 4, 50, m.Llm(50));  // VL micro-batch of 1
  EXPECT_DOUBLE_EQ(st.cost(0), 2 * m.Llm(600) + m.Llm(50));
  // The best text sequence for a 200-token doc is in the empty micro-batch?
  // No: adding to sequence 1 (100 -> 300) costs nothing, it stays under 600.
  uint32_t q;
  double d;
  ASSERT_TRUE(st.BestSequence(0, 200, false, &q, &d));
  EXPECT_EQ(q, 1u);
  EXPECT_DOUBLE_EQ(d, 0.0);
  st.Remove(0, 0, 600, m.Llm(600));
  EXPECT_DOUBLE_EQ(st.cost(0), 2 * m.Llm(100) + m.Llm(50));
}

// Incremental deltas agree with recomputation under random operations.
TEST(SequenceStateTest, DeltasMatchRecomputation) {
  const CostModel m;
  for (bool padded : {false, true}) {
    SequenceState st({2, 1}, Layout(), m, padded);
    std::mt19937 rng(padded ? 1 : 2);
    std::vector<std::tuple<uint32_t, uint32_t, uint32_t>> docs;  // rank, seq, tokens
    for (int step = 0; step < 400; ++step) {
      const uint32_t r = rng() % 2;
      if (docs.empty() || rng() % 3 != 0) {
        const uint32_t t = 1 + rng() % 300;
        const bool vl = rng() % 4 == 0;
        uint32_t q;
        double d;
        if (!st.BestSequence(r, t, vl, &q, &d)) continue;
        const double before = st.cost(r);
        st.Add(r, q, t, m.Llm(t));
        EXPECT_NEAR(st.cost(r) - before, d, 1e-6);
        EXPECT_LE(st.tokens(r, q), 1000u);
        docs.push_back({r, q, t});
      } else {
        const size_t k = rng() % docs.size();
        auto [dr, dq, dt] = docs[k];
        const double expect = st.RemoveDelta(dr, dq, dt, m.Llm(dt));
        const double before = st.cost(dr);
        st.Remove(dr, dq, dt, m.Llm(dt));
        EXPECT_NEAR(before - st.cost(dr), expect, 1e-6);
        docs.erase(docs.begin() + k);
      }
    }
    // Recompute from the remaining docs.
    SequenceState fresh({2, 1}, Layout(), m, padded);
    for (auto [r, q, t] : docs) fresh.Add(r, q, t, m.Llm(t));
    for (uint32_t r = 0; r < 2; ++r) EXPECT_NEAR(fresh.cost(r), st.cost(r), 1e-6);
    // A swap's half agrees with doing it.
    if (!docs.empty()) {
      auto [r, q, t] = docs[0];
      double delta;
      if (st.ReplaceDelta(r, q, t, m.Llm(t), 7, m.Llm(7), &delta)) {
        const double before = st.cost(r);
        st.Remove(r, q, t, m.Llm(t));
        st.Add(r, q, 7, m.Llm(7));
        EXPECT_NEAR(st.cost(r) - before, delta, 1e-6);
      }
    }
  }
}

}  // namespace
}  // namespace tutti::dispatch
