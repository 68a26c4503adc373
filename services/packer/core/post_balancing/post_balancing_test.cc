#include "services/packer/core/post_balancing/post_balancing.h"

#include <gtest/gtest.h>

#include "services/packer/bench/post_workload.h"
#include "services/packer/core/post_balancing/move_lists.h"
#include "services/packer/core/post_balancing/plan_check.h"
#include "services/packer/testing/post_samples.h"

namespace tutti::dispatch {
namespace {

using testing::SmallOptions;
using testing::Text;
using testing::Vl;

Workload Small(uint32_t world, uint32_t per_node, double audio_share = 0, uint64_t seed = 1) {
  WorkloadOptions w;
  w.world_size = world;
  w.ranks_per_node = per_node;
  w.seq_len = 8192;
  w.audio_share = audio_share;
  w.seed = seed;
  auto out = GenerateWorkload(w);
  EXPECT_TRUE(out.ok()) << out.status();
  return *out;
}

const PhaseStats* Phase(const DispatchPlan& p, const std::string& name) {
  for (const auto& s : p.stats.phases) {
    if (s.phase == name) return &s;
  }
  return nullptr;
}

void ExpectSamePlan(const DispatchPlan& a, const DispatchPlan& b) {
  for (int e = 0; e < kNumEncoders; ++e) {
    EXPECT_EQ(a.encoders[e].rank, b.encoders[e].rank);
    EXPECT_EQ(a.encoders[e].remote_load, b.encoders[e].remote_load);
    EXPECT_EQ(a.encoders[e].load_source, b.encoders[e].load_source);
    ASSERT_EQ(a.encoders[e].rank_items.size(), b.encoders[e].rank_items.size());
    for (size_t r = 0; r < a.encoders[e].rank_items.size(); ++r) {
      ASSERT_EQ(a.encoders[e].rank_items[r].size(), b.encoders[e].rank_items[r].size());
      for (size_t i = 0; i < a.encoders[e].rank_items[r].size(); ++i) {
        EXPECT_EQ(a.encoders[e].rank_items[r][i].sample, b.encoders[e].rank_items[r][i].sample);
        EXPECT_EQ(a.encoders[e].rank_items[r][i].item, b.encoders[e].rank_items[r][i].item);
      }
    }
  }
  EXPECT_EQ(a.llm_rank, b.llm_rank);
  ASSERT_EQ(a.llm.size(), b.llm.size());
  for (size_t r = 0; r < a.llm.size(); ++r) {
    ASSERT_EQ(a.llm[r].micro_batches.size(), b.llm[r].micro_batches.size());
    for (size_t m = 0; m < a.llm[r].micro_batches.size(); ++m) {
      for (size_t q = 0; q < a.llm[r].micro_batches[m].sequences.size(); ++q) {
        EXPECT_EQ(a.llm[r].micro_batches[m].sequences[q].docs,
                  b.llm[r].micro_batches[m].sequences[q].docs);
      }
    }
  }
  for (size_t r = 0; r < a.forward.size(); ++r) {
    ASSERT_EQ(a.forward[r].sends.size(), b.forward[r].sends.size());
    for (size_t k = 0; k < a.forward[r].sends.size(); ++k) {
      EXPECT_EQ(a.forward[r].sends[k].peer, b.forward[r].sends[k].peer);
      EXPECT_EQ(a.forward[r].sends[k].bytes, b.forward[r].sends[k].bytes);
    }
  }
  EXPECT_EQ(a.stats.inter_node_bytes, b.stats.inter_node_bytes);
}

TEST(DispatcherTest, PlanIsConsistentForEveryVariant) {
  for (bool padded : {false, true}) {
    for (bool node_aware : {true, false}) {
      Workload w = Small(16, 4, 0.2);
      w.options.padded = padded;
      w.options.node_aware = node_aware;
      auto plan = Dispatch(w.input, w.options);
      ASSERT_TRUE(plan.ok()) << plan.status();
      EXPECT_TRUE(CheckPlan(w.input, w.options, *plan).ok())
          << CheckPlan(w.input, w.options, *plan) << " padded " << padded;
      // Every phase within the bound it reports; the bound is the balancer's
      // makespan or (1 + tolerance) x lower bound.
      for (const PhaseStats& s : plan->stats.phases) {
        EXPECT_LE(s.max, s.bound * (1 + 1e-9)) << s.phase;
        EXPECT_GE(s.max, s.lower_bound * (1 - 1e-9)) << s.phase;
        EXPECT_GE(s.imbalance, 1.0 - 1e-12);
      }
      ASSERT_NE(Phase(*plan, "vit"), nullptr);
      ASSERT_NE(Phase(*plan, "audio"), nullptr);
      ASSERT_NE(Phase(*plan, "llm"), nullptr);
      // Post-balancing beats the drawn split on every phase.
      for (const PhaseStats& s : plan->stats.phases) {
        EXPECT_LT(s.imbalance, s.imbalance_before) << s.phase;
      }
      // Backward is the exact inverse.
      const auto back = InverseExchange(plan->cluster, plan->forward);
      EXPECT_TRUE(CheckExchangeSymmetry(back).ok());
      EXPECT_EQ(SumExchange(plan->cluster, back).inter_node, plan->stats.inter_node_bytes);
    }
  }
}

TEST(DispatcherTest, BalanceBoundsOnTheSeedShape) {
  Workload w = Small(32, 8);
  auto plan = Dispatch(w.input, w.options);
  ASSERT_TRUE(plan.ok());
  const double tol = w.options.balance_tolerance;
  for (const char* name : {"vit", "llm"}) {
    const PhaseStats* s = Phase(*plan, name);
    ASSERT_NE(s, nullptr);
    EXPECT_LE(s->imbalance_vs_bound, 1 + tol + 1e-9) << name;
    EXPECT_LE(s->imbalance, 1.01) << name;
  }
}

TEST(DispatcherTest, NodeAwareMovesFarFewerBytesAtTheSameBalance) {
  Workload w = Small(32, 8, 0.1);
  auto aware = Dispatch(w.input, w.options);
  DispatchOptions o = w.options;
  o.node_aware = false;
  auto oblivious = Dispatch(w.input, o);
  ASSERT_TRUE(aware.ok() && oblivious.ok());
  EXPECT_GT(oblivious->stats.inter_node_bytes, 0u);
  EXPECT_LE(aware->stats.inter_node_bytes, oblivious->stats.inter_node_bytes / 2);
  for (const PhaseStats& s : aware->stats.phases) {
    EXPECT_LE(s.imbalance_vs_bound, 1 + o.balance_tolerance + 1e-9) << s.phase;
  }
}

TEST(DispatcherTest, SameInputSamePlan) {
  Workload w = Small(16, 4, 0.2, 7);
  auto a = Dispatch(w.input, w.options);
  auto b = Dispatch(w.input, w.options);
  ASSERT_TRUE(a.ok() && b.ok());
  ExpectSamePlan(*a, *b);
}

TEST(DispatcherTest, StatisticsDoNotNeedTheExchangeLists) {
  Workload w = Small(16, 4, 0.2, 3);
  w.input.availability = ShardAvailability::None(4096, 4);
  for (uint32_t s = 0; s < 4096; ++s) w.input.availability.Set(s, s % 4, true);
  auto full = Dispatch(w.input, w.options);
  DispatchOptions o = w.options;
  o.build_exchanges = false;
  auto bare = Dispatch(w.input, o);
  ASSERT_TRUE(full.ok() && bare.ok()) << full.status() << bare.status();
  EXPECT_TRUE(bare->forward.empty());
  EXPECT_TRUE(bare->load.empty());
  EXPECT_EQ(bare->llm_rank, full->llm_rank);
  EXPECT_EQ(bare->llm_seq, full->llm_seq);
  EXPECT_EQ(bare->text_remote, full->text_remote);
  const ExchangeTotals fwd = SumExchange(full->cluster, full->forward);
  for (const DispatchPlan* p : {&*full, &*bare}) {
    EXPECT_EQ(p->stats.inter_node_bytes, fwd.inter_node);
    EXPECT_EQ(p->stats.intra_node_bytes, fwd.intra_node);
    EXPECT_EQ(p->stats.self_bytes, fwd.self);
  }
  uint64_t load = 0;
  for (const RankExchange& x : full->load) load += x.send_bytes;
  EXPECT_GT(load, 0u);
  EXPECT_EQ(bare->stats.remote_load_bytes, load);
  // Every document's sequence slot, as the layout lists it.
  for (uint32_t r = 0; r < full->llm.size(); ++r) {
    uint32_t q = 0;
    for (const MicroBatchPlan& mb : full->llm[r].micro_batches) {
      for (const SequencePlan& sp : mb.sequences) {
        for (uint32_t s : sp.docs) {
          EXPECT_EQ(full->llm_rank[s], r);
          EXPECT_EQ(full->llm_seq[s], q);
        }
        ++q;
      }
    }
  }
}

TEST(DispatcherTest, IlpRearrangementIsExactAndKeepsTheBalance) {
  Workload w = Small(4, 2, 0.2, 5);
  auto fast = Dispatch(w.input, w.options);
  DispatchOptions o = w.options;
  o.rearrangement = Rearrangement::kIlp;
  auto ilp = Dispatch(w.input, o);
  ASSERT_TRUE(fast.ok() && ilp.ok()) << fast.status() << ilp.status();
  EXPECT_EQ(fast->stats.rearrangement, "fast");
  EXPECT_EQ(ilp->stats.rearrangement, "ilp optimal");
  EXPECT_TRUE(CheckPlan(w.input, o, *ilp).ok()) << CheckPlan(w.input, o, *ilp);
  EXPECT_LE(ilp->stats.inter_node_bytes + ilp->stats.remote_load_bytes,
            fast->stats.inter_node_bytes + fast->stats.remote_load_bytes);
  const PhaseStats* llm = Phase(*ilp, "llm");
  ASSERT_NE(llm, nullptr);
  EXPECT_LE(llm->max, llm->bound * (1 + 1e-9));
  // A budget of one branch-and-bound node cannot prove an optimum on a step
  // this size unless the relaxation is integral; either way the plan is valid
  // and says which placement it kept.
  o.ilp_max_nodes = 1;
  auto tight = Dispatch(w.input, o);
  ASSERT_TRUE(tight.ok());
  EXPECT_TRUE(tight->stats.rearrangement == "ilp optimal" ||
              tight->stats.rearrangement.find("node limit") != std::string::npos)
      << tight->stats.rearrangement;
  EXPECT_TRUE(CheckPlan(w.input, o, *tight).ok());
}

TEST(DispatcherTest, AudioAndVisionAreSeparatePhases) {
  DispatchInput in;
  // Sample 0: two images; sample 1: one audio clip; sample 2: image + audio.
  in.samples.push_back(Vl(0, {400, 800}, 50, 0));
  in.samples.push_back(Vl(1, {}, 30, 1));
  testing::AddAudio(&in.samples.back(), 300);
  in.samples.push_back(Vl(2, {1200}, 20, 1));
  testing::AddAudio(&in.samples.back(), 100);
  for (uint64_t id = 3; id < 9; ++id) in.samples.push_back(Text(id, 100 + 37 * id, id % 4));
  const DispatchOptions o = SmallOptions(4, 2, 4096);
  auto plan = Dispatch(in, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckPlan(in, o, *plan).ok()) << CheckPlan(in, o, *plan);
  EXPECT_EQ(plan->item_offset[int(EncoderKind::kVision)].back(), 3u);
  EXPECT_EQ(plan->item_offset[int(EncoderKind::kAudio)].back(), 2u);
  const PhaseStats* audio = Phase(*plan, "audio");
  ASSERT_NE(audio, nullptr);
  // Two clips of 300 and 100 tokens on 4 ranks: optimal is one each.
  EXPECT_NE(plan->encoders[1].rank[0], plan->encoders[1].rank[1]);
  // Both encoders' outputs reach the LLM ranks in the one forward exchange.
  uint32_t audio_items = 0;
  for (const auto& x : plan->forward) {
    for (const auto& t : x.recvs) {
      for (const auto& it : t.items) audio_items += it.encoder == EncoderKind::kAudio;
    }
  }
  EXPECT_EQ(audio_items, 2u);
}

TEST(DispatcherTest, RemoteLoadWhenNoStagingNodeFits) {
  // Every VL sample's shard (0) is staged on node 0 only; the vision phase
  // cannot keep all of it on node 0's 2 ranks and stay balanced.
  DispatchInput in;
  for (uint64_t id = 0; id < 16; ++id) in.samples.push_back(Vl(id, {1000, 1000}, 10, id % 4, 0));
  for (uint64_t id = 16; id < 40; ++id) in.samples.push_back(Text(id, 300, id % 4, 1));
  in.availability = ShardAvailability::None(2, 2);
  in.availability.Set(0, 0, true);
  in.availability.Set(1, 0, true);
  in.availability.Set(1, 1, true);
  const DispatchOptions o = SmallOptions(4, 2, 8192);
  auto plan = Dispatch(in, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckPlan(in, o, *plan).ok()) << CheckPlan(in, o, *plan);
  const auto& ep = plan->encoders[int(EncoderKind::kVision)];
  uint32_t remote = 0;
  uint64_t pixel_bytes = 0;
  for (size_t i = 0; i < ep.rank.size(); ++i) {
    if (!ep.remote_load[i]) continue;
    ++remote;
    EXPECT_EQ(o.cluster.node_of(ep.rank[i]), 1u);
    EXPECT_EQ(o.cluster.node_of(ep.load_source[i]), 0u);
    pixel_bytes += PixelBytes(1000, 2, 14, 4);
  }
  EXPECT_GT(remote, 0u);
  // Balanced: half of the 32 equal images on each node.
  EXPECT_EQ(remote, 16u);
  EXPECT_EQ(plan->stats.remote_load_items, remote);
  // The pixels come through the load exchange, with the token ids of the
  // VL documents whose LLM rank is on node 1.
  uint64_t load_bytes = 0, token_bytes = 0;
  for (const auto& x : plan->load) {
    for (const auto& t : x.sends) {
      for (const auto& it : t.items) {
        EXPECT_NE(it.payload, Payload::kEncoderOutput);
        (it.payload == Payload::kEncoderInput ? load_bytes : token_bytes) += it.bytes;
      }
    }
  }
  EXPECT_EQ(load_bytes, pixel_bytes);
  EXPECT_EQ(token_bytes, uint64_t{plan->stats.remote_text_samples} * 10 * 4);
  EXPECT_EQ(plan->stats.remote_load_bytes, pixel_bytes + token_bytes);
  // Text-only samples (shard 1) are staged everywhere; a VL sample whose
  // document lands on node 1 reads its token ids from node 0.
  for (size_t s = 0; s < in.samples.size(); ++s) {
    if (!plan->text_remote[s]) continue;
    EXPECT_EQ(in.samples[s].shard, 0u);
    EXPECT_EQ(o.cluster.node_of(plan->llm_rank[s]), 1u);
    EXPECT_EQ(o.cluster.node_of(plan->text_source[s]), 0u);
  }
}

TEST(DispatcherTest, PrefersStagingNodesWhenBalanceAllows) {
  Workload w = Small(16, 4);
  // Shard s staged on nodes s % 4 and (s + 1) % 4 only.
  w.input.availability = ShardAvailability::None(4096, 4);
  for (uint32_t s = 0; s < 4096; ++s) {
    w.input.availability.Set(s, s % 4, true);
    w.input.availability.Set(s, (s + 1) % 4, true);
  }
  auto plan = Dispatch(w.input, w.options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(CheckPlan(w.input, w.options, *plan).ok()) << CheckPlan(w.input, w.options, *plan);
  EXPECT_LE(plan->stats.remote_load_items, w.images / 20);
  // Documents go where their token ids are staged, mostly.
  EXPECT_LE(plan->stats.remote_text_samples, w.input.samples.size() / 20);
  uint64_t token_bytes = 0;
  for (const auto& x : plan->load) {
    for (const auto& t : x.sends) {
      for (const auto& it : t.items) {
        if (it.payload == Payload::kTextTokens) {
          token_bytes += it.bytes;
          EXPECT_EQ(it.bytes, uint64_t{w.input.samples[it.sample].text_tokens} * 4);
        }
      }
    }
  }
  EXPECT_EQ(plan->stats.remote_text_samples > 0, token_bytes > 0);
}

TEST(DispatcherTest, PaddedAndUnpaddedCostsDiffer) {
  Workload w = Small(16, 4);
  w.options.slots.text_micro_batches = 1;
  w.options.slots.text_micro_batch = 3;  // 3 text sequences in one micro-batch
  auto unpadded = Dispatch(w.input, w.options);
  w.options.padded = true;
  auto padded = Dispatch(w.input, w.options);
  ASSERT_TRUE(unpadded.ok() && padded.ok());
  EXPECT_TRUE(CheckPlan(w.input, w.options, *padded).ok());
  // Padding only adds cost.
  EXPECT_GT(Phase(*padded, "llm")->mean, Phase(*unpadded, "llm")->mean);
  EXPECT_LE(Phase(*padded, "llm")->imbalance, 1.05);
}

TEST(DispatcherTest, EvaluateSplitCountsOverflow) {
  DispatchInput in;
  for (uint64_t id = 0; id < 6; ++id) in.samples.push_back(Text(id, 900, 0));
  const DispatchOptions o = SmallOptions(2, 1, 1000, 2, 1);
  std::vector<uint32_t> all_on_zero(6, 0);
  auto ev = EvaluateSplit(in, o, all_on_zero);
  ASSERT_TRUE(ev.ok());
  EXPECT_EQ(ev->overflow_sequences, 4u);  // 2 text sequences hold 2 of the 6
  EXPECT_DOUBLE_EQ(ev->phases.back().imbalance, 2.0);
  EXPECT_FALSE(EvaluateSplit(in, o, {0, 1}).ok());
  EXPECT_FALSE(EvaluateSplit(in, o, std::vector<uint32_t>(6, 9)).ok());
}

TEST(DispatcherTest, BadInputIsRefusedWithAClearMessage) {
  const DispatchOptions o = SmallOptions(4, 2, 1000);
  auto expect = [&](DispatchInput in, DispatchOptions opts, absl::StatusCode code,
                    const std::string& words) {
    auto plan = Dispatch(in, opts);
    ASSERT_FALSE(plan.ok()) << words;
    EXPECT_EQ(plan.status().code(), code) << plan.status();
    EXPECT_NE(plan.status().message().find(words), std::string::npos) << plan.status();
  };
  DispatchInput ok;
  ok.samples = {Text(1, 10), Vl(2, {16}, 5)};
  ASSERT_TRUE(Dispatch(ok, o).ok());

  DispatchOptions bad = o;
  bad.cluster = {6, 4};
  expect(ok, bad, absl::StatusCode::kInvalidArgument, "multiple of ranks_per_node");
  bad = o;
  bad.slots.seq_len = 0;
  expect(ok, bad, absl::StatusCode::kInvalidArgument, "sequence layout");
  bad = o;
  bad.balance_tolerance = -1;
  expect(ok, bad, absl::StatusCode::kInvalidArgument, "balance_tolerance");

  DispatchInput in = ok;
  in.samples.push_back(Text(1, 10));
  expect(in, o, absl::StatusCode::kInvalidArgument, "sample 1 appears twice");
  in = ok;
  in.samples.push_back(Text(3, 10, 9));
  expect(in, o, absl::StatusCode::kInvalidArgument, "outside world_size");
  in = ok;
  in.samples.push_back(Text(3, 1001));
  expect(in, o, absl::StatusCode::kInvalidArgument, "sample 3 has 1001 LLM tokens");
  in = ok;
  in.samples.push_back(Text(3, 10));
  in.samples.back().vl = true;
  expect(in, o, absl::StatusCode::kInvalidArgument, "is VL but has no images");
  in = ok;
  in.samples.push_back(Vl(3, {16}, 5));
  in.samples.back().vl = false;
  expect(in, o, absl::StatusCode::kInvalidArgument, "is text-only but has images");
  in = ok;
  in.samples.push_back(Vl(3, {16}, 5));
  in.samples.back().items[0][0].units = 0;
  expect(in, o, absl::StatusCode::kInvalidArgument, "empty vit item");
  in = ok;
  in.samples.push_back(Vl(3, {400}, 5));
  in.samples.back().llm_tokens = 50;
  expect(in, o, absl::StatusCode::kInvalidArgument, "encoder tokens");
  in = ok;
  in.availability = ShardAvailability::None(1, 2);
  expect(in, o, absl::StatusCode::kFailedPrecondition, "no node's stager has staged");
  in = ok;
  in.availability = ShardAvailability::None(1, 3);
  expect(in, o, absl::StatusCode::kInvalidArgument, "availability bitmap has 3 nodes");
  in = ok;
  in.samples[0].shard = 5;
  in.availability = ShardAvailability::None(1, 2);
  in.availability.Set(0, 0, true);
  expect(in, o, absl::StatusCode::kInvalidArgument, "outside the availability bitmap");
  in = ok;
  for (uint64_t id = 10; id < 20; ++id) in.samples.push_back(Text(id, 900));
  expect(in, o, absl::StatusCode::kResourceExhausted, "text tokens");
}

TEST(DispatcherTest, EmptyStep) {
  const DispatchOptions o = SmallOptions(4, 2, 1000);
  auto plan = Dispatch(DispatchInput{}, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(CheckPlan(DispatchInput{}, o, *plan).ok());
  EXPECT_EQ(plan->stats.inter_node_bytes, 0u);
}

}  // namespace
}  // namespace tutti::dispatch
