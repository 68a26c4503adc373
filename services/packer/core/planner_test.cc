#include "services/packer/core/planner.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/smart_resize.h"
#include "gtest/gtest.h"
#include "services/packer/core/plan_audit.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

using testing::Config;
using testing::kBaseConfig;
using testing::MakeJob;
using testing::SmallDataset;
using testing::SyntheticIndex;

std::shared_ptr<const Index> SmallIndex() {
  static auto* index = new std::shared_ptr<const Index>(SyntheticIndex(SmallDataset()));
  return *index;
}

v1::StepPlan PlanOf(const std::shared_ptr<const Job>& job, uint64_t step,
                    std::vector<uint32_t> ranks = {}) {
  Planner planner(job);
  StepPlanData data;
  absl::Status s = planner.Plan(step, &data);
  EXPECT_TRUE(s.ok()) << s;
  v1::StepPlan plan;
  s = BuildStepPlan(*job, data, ranks, &plan);
  EXPECT_TRUE(s.ok()) << s;
  return plan;
}

std::vector<uint64_t> GlobalBatch(const v1::StepPlan& plan) {
  std::vector<uint64_t> ids;
  for (const auto& s : plan.samples()) ids.push_back(s.sample_id());
  return ids;
}

std::string WithStrategy(const std::string& strategy, bool post = false) {
  return absl::StrCat(kBaseConfig, " packing { strategy: '", strategy, "' }",
                      post ? " post_balancing { enabled: true }" : "");
}

TEST(PlannerTest, PlansAreByteIdenticalAcrossPlanners) {
  for (const char* strategy : {"greedy", "seed-v1", "seed-v2", "tutti"}) {
    for (bool post : {false, true}) {
      auto a = MakeJob(WithStrategy(strategy, post), SmallIndex());
      auto b = MakeJob(WithStrategy(strategy, post), SmallIndex());
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok());
      for (uint64_t step : {0, 1, 17, 1000}) {
        v1::StepPlan pa = PlanOf(*a, step), pb = PlanOf(*b, step);
        pb.mutable_stats()->set_plan_seconds(123);  // not part of the identity
        EXPECT_EQ(PlanIdentityBytes(&pa), PlanIdentityBytes(&pb)) << strategy << " " << step;
        EXPECT_EQ(PlanHash(&pa), PlanHash(&pb));
      }
    }
  }
}

TEST(PlannerTest, GlobalBatchDoesNotDependOnWorldSize) {
  auto small = MakeJob(kBaseConfig, SmallIndex());
  std::string eight = kBaseConfig;
  eight.replace(eight.find("world_size: 4"), 13, "world_size: 8");
  auto big = MakeJob(eight, SmallIndex());
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(big.ok()) << big.status();
  for (uint64_t step : {0, 3, 250, 1000000}) {
    EXPECT_EQ(GlobalBatch(PlanOf(*small, step)), GlobalBatch(PlanOf(*big, step))) << step;
  }
}

TEST(PlannerTest, EpochIsAPermutationAndResumesAnywhere) {
  auto job = MakeJob(kBaseConfig, SmallIndex());
  ASSERT_TRUE(job.ok());
  const Index& ix = *SmallIndex();
  // Each stream cycles on its own: over the job's epoch (the slower stream's)
  // every epoch of each stream draws each of its samples exactly once, the
  // remainder included, and no step draws a sample twice.
  const uint64_t spe = (*job)->steps_per_epoch();
  ASSERT_GT(spe, 10u);
  Planner planner(*job);
  StepPlanData d;
  std::vector<uint32_t> text, vl;  // the streams, in draw order
  for (uint64_t s = 0; s < spe; ++s) {
    ASSERT_TRUE(planner.Plan(s, &d).ok());
    std::set<uint32_t> in_step;
    for (const auto& ps : d.samples) {
      EXPECT_TRUE(in_step.insert(ps.sample).second) << "sample repeated in step " << s;
      EXPECT_EQ(ps.vl, ix.is_vl(ps.sample));
      (ps.vl ? vl : text).push_back(ps.sample);
    }
    EXPECT_EQ(d.text_epoch, s * 24 / ix.text_samples().size());
    EXPECT_EQ(d.vl_epoch, s * 8 / ix.vl_samples().size());
  }
  for (auto [drawn, n] :
       {std::pair{&text, ix.text_samples().size()}, std::pair{&vl, ix.vl_samples().size()}}) {
    ASSERT_GE(drawn->size(), n);
    for (size_t e = 0; (e + 1) * n <= drawn->size(); ++e) {
      std::set<uint32_t> epoch(drawn->begin() + e * n, drawn->begin() + (e + 1) * n);
      EXPECT_EQ(epoch.size(), n) << "epoch " << e;
    }
  }
  // A later step is planned directly, and epochs use different permutations.
  ASSERT_TRUE(planner.Plan(1000000, &d).ok());
  std::vector<uint32_t> e0, e1;
  ASSERT_TRUE(planner.Plan(0, &d).ok());
  for (const auto& ps : d.samples) e0.push_back(ps.sample);
  // Step n_vl starts VL epoch 8 at its position 0: the same positions as step
  // 0 in another permutation.
  ASSERT_TRUE(planner.Plan(ix.vl_samples().size(), &d).ok());
  for (const auto& ps : d.samples) e1.push_back(ps.sample);
  EXPECT_NE(e0, e1);
}

TEST(PlannerTest, ModalitySegregationAndTheSeedsRatioExample) {
  // text:VL 4:1 through gradient accumulation: grad_accum 2, text micro-batch
  // of 4 sequences, VL micro-batch of 1.
  auto job = MakeJob(R"pb(
                       seed: 3
                       world_size: 4
                       ranks_per_node: 2
                       batch {
                         text_samples_per_step: 40
                         vl_samples_per_step: 8
                         grad_accum: 2
                         text_micro_batch: 4
                         vl_micro_batch: 1
                         text_vl_ratio: "4:1"
                       }
                       curriculum { start_step: 0 max_pixels: 1003520 seq_len: 8192 }
                     )pb",
                     SmallIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const v1::StepPlan plan = PlanOf(*job, 5);
  std::map<uint64_t, v1::Modality> modality;
  for (const auto& s : plan.samples()) modality[s.sample_id()] = s.modality();
  size_t docs = 0;
  for (const auto& r : plan.ranks()) {
    ASSERT_EQ(r.micro_batches_size(), 2);
    EXPECT_EQ(r.micro_batches(0).modality(), v1::MODALITY_TEXT);  // text first
    EXPECT_EQ(r.micro_batches(0).sequences_size(), 4);
    EXPECT_EQ(r.micro_batches(1).modality(), v1::MODALITY_VL);
    EXPECT_EQ(r.micro_batches(1).sequences_size(), 1);
    for (const auto& mb : r.micro_batches()) {
      for (const auto& seq : mb.sequences()) {
        uint32_t offset = 0;
        for (const auto& doc : seq.docs()) {
          EXPECT_EQ(modality[doc.sample_id()], mb.modality()) << "modalities mixed";
          EXPECT_EQ(doc.offset(), offset);
          offset += doc.length();
          ++docs;
        }
        EXPECT_EQ(seq.tokens(), offset);
        EXPECT_LE(seq.tokens(), plan.seq_len());
      }
    }
  }
  EXPECT_EQ(docs, 48u);  // every sample of the global batch exactly once
}

TEST(PlannerTest, SamplesTheStagerWouldRefuseAreNeverPlanned) {
  // The stager refuses an image over vision.max_source_pixels without
  // decoding it: such a sample must never be planned, or its caption would
  // be trained against a substitute.
  const std::string config = std::string(kBaseConfig) + "vision { max_source_pixels: 2000000 }";
  auto job = MakeJob(config, SmallIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const Index& ix = *SmallIndex();
  const uint64_t left_out = (*job)->unservable().count("image_too_large")
                                ? (*job)->unservable().at("image_too_large")
                                : 0;
  ASSERT_GT(left_out, 0u);
  EXPECT_EQ((*job)->vl_samples().size() + left_out, ix.vl_samples().size());
  EXPECT_EQ((*job)->text_samples().size(), ix.text_samples().size());
  EXPECT_FALSE((*job)->unservable_examples().at("image_too_large").empty());
  // A whole epoch of VL samples: none over the limit, every servable one once.
  const uint64_t steps = (*job)->vl_samples().size() / 8;
  std::set<uint64_t> seen;
  Planner planner(*job);
  StepPlanData d;
  for (uint64_t step = 0; step < steps; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    for (const auto& ps : d.samples) {
      for (uint32_t j = ix.media_begin(ps.sample); j < ix.media_end(ps.sample); ++j) {
        ASSERT_LE(uint64_t{ix.media_width(j)} * ix.media_height(j), 2000000u) << ps.sample;
      }
      if (ix.is_vl(ps.sample)) seen.insert(ps.sample);
    }
  }
  EXPECT_EQ(seen.size(), steps * 8);
  // Without the limit nothing is left out.
  auto all = MakeJob(kBaseConfig, SmallIndex());
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE((*all)->unservable().empty());
  EXPECT_EQ((*all)->vl_samples().data(), ix.vl_samples().data());  // the index's own stream
}

TEST(PlannerTest, SamplesWithMoreImagesThanTheLimitAreNeverPlanned) {
  // SmallDataset's VL samples carry 1 to 4 images; at a limit of 3 a sample
  // with 3 is planned and one with 4 is left out, counted by reason.
  const std::string config = std::string(kBaseConfig) + "vision { max_images_per_sample: 3 }";
  auto job = MakeJob(config, SmallIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const Index& ix = *SmallIndex();
  auto images = [&](uint32_t s) {
    uint32_t n = 0;
    for (uint32_t j = ix.media_begin(s); j < ix.media_end(s); ++j) n += ix.media_is_image(j);
    return n;
  };
  uint64_t four = 0, three = 0;
  for (const uint32_t s : ix.vl_samples()) four += images(s) == 4, three += images(s) == 3;
  ASSERT_GT(four, 0u);
  ASSERT_GT(three, 0u);
  ASSERT_EQ((*job)->unservable().count("too_many_images"), 1u);
  EXPECT_EQ((*job)->unservable().at("too_many_images"), four);
  EXPECT_EQ((*job)->vl_samples().size() + four, ix.vl_samples().size());
  EXPECT_FALSE((*job)->unservable_examples().at("too_many_images").empty());
  Planner planner(*job);
  StepPlanData d;
  uint64_t at_limit = 0;
  for (uint64_t step = 0; step < 40; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    for (const auto& ps : d.samples) {
      ASSERT_LE(images(ps.sample), 3u) << ps.sample;
      at_limit += images(ps.sample) == 3;
    }
  }
  EXPECT_GT(at_limit, 0u);
  // The default (64) leaves every sample in.
  auto all = MakeJob(kBaseConfig, SmallIndex());
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE((*all)->unservable().empty());
}

TEST(PlannerTest, CurriculumFollowsSmartResize) {
  auto job = MakeJob(kBaseConfig, SmallIndex());
  ASSERT_TRUE(job.ok());
  const Index& ix = *SmallIndex();
  for (uint64_t step : {2, 12}) {
    const v1::StepPlan plan = PlanOf(*job, step);
    const uint64_t max_pixels = step < 10 ? 262144 : 1003520;
    EXPECT_EQ(plan.max_pixels(), max_pixels);
    std::map<uint64_t, const v1::SampleInfo*> info;
    for (const auto& s : plan.samples()) info[s.sample_id()] = &s;
    int images = 0;
    for (const auto& r : plan.ranks()) {
      for (const auto& e : r.encoders()) {
        for (const auto& im : e.images()) {
          const auto& ref = info[im.sample_id()]->images(im.image_index());
          VisionGeometryOptions g;
          g.max_pixels = max_pixels;
          auto want = SmartResize(ref.height(), ref.width(), g);
          ASSERT_TRUE(want.ok());
          EXPECT_EQ(im.resized_height(), want->height);
          EXPECT_EQ(im.resized_width(), want->width);
          EXPECT_EQ(im.llm_tokens(), want->llm_tokens);
          EXPECT_EQ(im.patches(), want->patches);
          EXPECT_EQ(im.grid_t(), 1u);
          EXPECT_LE(uint64_t{im.resized_height()} * im.resized_width(), max_pixels);
          EXPECT_EQ(im.resized_height() % 28, 0u);
          ++images;
        }
      }
    }
    EXPECT_GT(images, 0);
    // LLM tokens of a sample = text + sum(image tokens + 2).
    for (const auto& s : plan.samples()) {
      uint64_t tokens = s.text_tokens();
      for (const auto& im : s.images()) {
        VisionGeometryOptions g;
        g.max_pixels = max_pixels;
        tokens += SmartResize(im.height(), im.width(), g)->llm_tokens + 2;
      }
      EXPECT_EQ(s.llm_tokens(), tokens);
      EXPECT_EQ(s.text_tokens(), ix.text_tokens(s.sample_id()));
    }
  }
}

TEST(PlannerTest, ChunksDrawnSplitAndSubsets) {
  auto job = MakeJob(kBaseConfig, SmallIndex());
  ASSERT_TRUE(job.ok());
  const v1::StepPlan plan = PlanOf(*job, 15);
  for (const auto& r : plan.ranks()) {
    EXPECT_EQ(r.node(), r.rank() / 2);
    // Drawn: the global batch dealt round-robin.
    for (int k = 0; k < r.drawn_size(); ++k) {
      EXPECT_EQ(r.drawn(k), plan.samples(r.rank() + 4 * k).sample_id());
    }
    for (const auto& e : r.encoders()) {
      std::vector<int> seen(e.images_size(), 0);
      for (const auto& c : e.chunks()) {
        uint64_t patches = 0;
        for (uint32_t i : c.items()) {
          ++seen[i];
          patches += e.images(i).patches();
        }
        EXPECT_EQ(c.patches(), patches);
        EXPECT_TRUE(patches <= 8192 || c.items_size() == 1) << patches;
      }
      for (int n : seen) EXPECT_EQ(n, 1);
    }
  }
  // Only rank 2: its RankPlan and only the samples/shards it touches.
  const v1::StepPlan one = PlanOf(*job, 15, {2});
  ASSERT_EQ(one.ranks_size(), 1);
  EXPECT_EQ(one.ranks(0).SerializeAsString(), plan.ranks(2).SerializeAsString());
  std::set<uint64_t> touched;
  for (const auto& mb : one.ranks(0).micro_batches()) {
    for (const auto& seq : mb.sequences()) {
      for (const auto& d : seq.docs()) touched.insert(d.sample_id());
    }
  }
  for (uint64_t id : one.ranks(0).drawn()) touched.insert(id);
  const std::vector<uint64_t> listed = GlobalBatch(one);
  EXPECT_EQ(std::set<uint64_t>(listed.begin(), listed.end()), touched);
  for (const auto& s : one.samples()) EXPECT_LT(s.shard(), uint32_t(one.shards_size()));
  EXPECT_LT(one.shards_size(), plan.shards_size());
}

TEST(PlannerTest, ExchangeListsMatchBetweenPeers) {
  for (bool post : {false, true}) {
    auto job = MakeJob(WithStrategy("tutti", post), SmallIndex());
    ASSERT_TRUE(job.ok());
    const v1::StepPlan plan = PlanOf(*job, 4);
    std::map<std::pair<uint32_t, uint32_t>, std::string> sent, received;
    uint64_t image_bytes = 0, sent_bytes = 0, inter = 0;
    for (const auto& r : plan.ranks()) {
      for (const auto& e : r.encoders()) {
        for (const auto& im : e.images()) {
          image_bytes += im.output_bytes();
          EXPECT_EQ(im.output_bytes(), uint64_t{im.llm_tokens()} * 4096 * 2);  // bf16
          if (!post) {
            EXPECT_EQ(im.llm_rank(), r.rank());
          }
        }
      }
      uint32_t last_peer = 0;
      for (int i = 0; i < r.exchange().sends_size(); ++i) {
        const auto& t = r.exchange().sends(i);
        if (i > 0) {
          EXPECT_GT(t.peer(), last_peer);
        }
        last_peer = t.peer();
        if (!post) {
          EXPECT_EQ(t.peer(), r.rank());
        }
        uint64_t b = 0;
        for (const auto& it : t.items()) b += it.bytes();
        EXPECT_EQ(t.bytes(), b);
        sent_bytes += b;
        if (t.peer() / 2 != r.rank() / 2) inter += b;
        sent[{r.rank(), t.peer()}] = t.SerializeAsString();
      }
      for (const auto& t : r.exchange().recvs()) {
        v1::Transfer as_sent = t;
        as_sent.set_peer(r.rank());
        received[{t.peer(), r.rank()}] = as_sent.SerializeAsString();
      }
    }
    EXPECT_EQ(sent, received) << "post " << post;
    EXPECT_EQ(sent_bytes, image_bytes);
    EXPECT_EQ(plan.stats().inter_node_bytes(), inter);
    if (post) {
      EXPECT_GT(plan.stats().inter_node_bytes() + plan.stats().intra_node_bytes(), 0u);
    }
  }
}

// The receive lists' order, as plan.proto documents it: in post-balanced
// plans a pair's items follow the LLM rank's input_ids (with runs); in
// colocated plans a rank's only transfer is to itself and follows its
// encoder order, which is not always the input_ids order (no runs).
TEST(PlannerTest, ReceiveListsFollowInputIdsWhenItemsMoveAndEncoderOrderOtherwise) {
  const std::string config = R"pb(
    seed: 5
    world_size: 4
    ranks_per_node: 2
    batch {
      text_samples_per_step: 8
      vl_samples_per_step: 24
      grad_accum: 4
      text_micro_batch: 1
      vl_micro_batch: 4
      text_vl_ratio: "1:4"
    }
    curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
  )pb";
  using Item = std::pair<uint64_t, uint32_t>;  // (sample, image index)
  for (const bool post : {false, true}) {
    auto job = MakeJob(absl::StrCat(config, post ? " post_balancing { enabled: true }" : ""),
                       SmallIndex());
    ASSERT_TRUE(job.ok()) << job.status();
    int pairs = 0, colocated_off_input_order = 0;
    for (uint64_t step = 0; step < 6; ++step) {
      const v1::StepPlan plan = PlanOf(*job, step);
      for (const auto& r : plan.ranks()) {
        std::vector<Item> encoder, input_ids;
        for (const auto& e : r.encoders()) {
          if (e.encoder() != v1::ENCODER_VISION) continue;
          for (const auto& im : e.images()) encoder.emplace_back(im.sample_id(), im.image_index());
        }
        for (const auto& mb : r.micro_batches()) {
          for (const auto& seq : mb.sequences()) {
            for (const auto& d : seq.docs()) {
              for (const auto& im : d.images())
                input_ids.emplace_back(d.sample_id(), im.image_index());
            }
          }
        }
        for (const auto& t : r.exchange().recvs()) {
          std::vector<Item> items;
          for (const auto& it : t.items()) {
            if (it.encoder() == v1::ENCODER_VISION) items.emplace_back(it.sample_id(), it.index());
          }
          const std::set<Item> in_pair(items.begin(), items.end());
          std::vector<Item> by_input_ids;
          for (const Item& x : input_ids) {
            if (in_pair.count(x)) by_input_ids.push_back(x);
          }
          ++pairs;
          if (post) {
            EXPECT_EQ(items, by_input_ids) << "step " << step << " rank " << r.rank();
            EXPECT_GT(t.runs_size(), 0);
          } else {
            EXPECT_EQ(t.peer(), r.rank());
            EXPECT_EQ(items, encoder) << "step " << step << " rank " << r.rank();
            EXPECT_EQ(t.runs_size(), 0);
            colocated_off_input_order += items != by_input_ids;
          }
        }
      }
    }
    EXPECT_GT(pairs, 0);
    if (!post) {
      EXPECT_GT(colocated_off_input_order, 0);
    }
  }
}

TEST(PlannerTest, PostBalancingBalancesEncoders) {
  auto pre = MakeJob(WithStrategy("greedy"), SmallIndex());
  auto post = MakeJob(WithStrategy("greedy", true), SmallIndex());
  ASSERT_TRUE(pre.ok() && post.ok());
  double pre_sum = 0, post_sum = 0;
  for (uint64_t step = 0; step < 8; ++step) {
    pre_sum += PlanOf(*pre, step).stats().phases(0).imbalance();
    const v1::StepPlan p = PlanOf(*post, step);
    EXPECT_EQ(p.stats().phases(0).phase(), "vit");
    post_sum += p.stats().phases(0).imbalance();
  }
  EXPECT_LT(post_sum, pre_sum);
}

// --- bad input: each refused with a message naming the value and the fix.

void ExpectRefused(const absl::Status& s, absl::StatusCode code, std::vector<std::string> needles) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s;
  for (const auto& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << n << ": " << s;
}

// Hundreds of steps at several world sizes, colocated (tutti and a peer)
// and post-balanced: every plan agrees with what its job alone says
// (AuditPlanAgainstJob) and with itself (CheckPlannedStep).
TEST(PlannerTest, AnIndependentAuditAgreesWithEveryPlan) {
  for (uint32_t world : {4u, 16u}) {
    for (const char* mode : {"packing { strategy: 'tutti' }", "packing { strategy: 'lpt' }",
                             "post_balancing { enabled: true }"}) {
      std::string c = absl::StrCat(kBaseConfig, " ", mode);
      c.replace(c.find("world_size: 4"), 13, absl::StrCat("world_size: ", world));
      c.replace(c.find("text_samples_per_step: 24"), 25,
                absl::StrCat("text_samples_per_step: ", 6 * world));
      c.replace(c.find("vl_samples_per_step: 8"), 22,
                absl::StrCat("vl_samples_per_step: ", 2 * world));
      auto job = MakeJob(c, SmallIndex());
      ASSERT_TRUE(job.ok()) << job.status();
      Planner planner(*job);
      StepPlanData d;
      for (uint64_t step = 0; step < 120; ++step) {
        ASSERT_TRUE(planner.Plan(step, &d).ok()) << mode << " W=" << world << " step " << step;
        absl::Status audit = AuditPlanAgainstJob(**job, d);
        EXPECT_TRUE(audit.ok()) << mode << " W=" << world << ": " << audit;
        absl::Status check = CheckPlannedStep(d);
        EXPECT_TRUE(check.ok()) << mode << " W=" << world << ": " << check;
        if (!audit.ok() || !check.ok()) break;
      }
      // The audit is not blind: a plan that moves one sample to a rank's
      // other modality, or reports another maximum, is caught.
      ASSERT_TRUE(planner.Plan(3, &d).ok());
      StepPlanData moved = d;
      moved.samples[0].seq = d.text_seqs;  // a text sample into a VL sequence
      EXPECT_FALSE(AuditPlanAgainstJob(**job, moved).ok()) << mode;
      StepPlanData wrong = d;
      wrong.llm.max *= 1.01;
      if (!d.phases_from_dispatcher) {
        EXPECT_FALSE(AuditPlanAgainstJob(**job, wrong).ok()) << mode;
      }
    }
  }
}

TEST(PlannerBadInputTest, RatioThatCannotBeMet) {
  auto job = MakeJob(R"pb(
                       world_size: 4
                       batch {
                         text_samples_per_step: 8
                         vl_samples_per_step: 2
                         grad_accum: 2
                         text_micro_batch: 3
                         vl_micro_batch: 1
                         text_vl_ratio: "4:1"
                       })pb",
                     SmallIndex());
  ExpectRefused(job.status(), absl::StatusCode::kInvalidArgument,
                {"4:1", "grad_accum 2", "text_micro_batch 3"});
}

TEST(PlannerBadInputTest, ImageCapSmallerThanOneImage) {
  v1::JobConfig config = Config(kBaseConfig);
  config.mutable_batch()->set_img_cap_tokens(100);
  auto job = Job::Create(config, SmallIndex());
  ExpectRefused(job.status(), absl::StatusCode::kFailedPrecondition,
                {"img_cap_tokens 100", "raise batch.img_cap_tokens to at least", "of shard"});
}

// Every sample fits the cap on its own, but a step's image tokens cannot fit
// the world's VL sequences under it: refused at load, not at some step.
TEST(PlannerBadInputTest, ImageCapThatNoStepCanKeep) {
  auto probe = Job::Create(Config(kBaseConfig), SmallIndex());
  ASSERT_TRUE(probe.ok()) << probe.status();
  uint32_t cap = 0;
  double sum = 0;
  const auto& vl = (*probe)->vl_samples();
  for (uint32_t s : vl) {
    auto c = (*probe)->coster(0).Cost(s);
    ASSERT_TRUE(c.ok());
    cap = std::max(cap, c->image_tokens);
    sum += c->image_tokens;
  }
  for (uint32_t s : vl) cap = std::max(cap, (*probe)->coster(1).Cost(s)->image_tokens);
  // 4 ranks x 1 VL sequence x cap image tokens, filled past the limit.
  const uint32_t per_step = static_cast<uint32_t>(std::ceil(4.0 * cap / (sum / vl.size())));
  ASSERT_LT(2 * per_step, vl.size());
  v1::JobConfig config = Config(kBaseConfig);
  config.mutable_batch()->set_img_cap_tokens(cap);
  ASSERT_TRUE(Job::Create(config, SmallIndex()).ok());  // the cap alone is fine
  config.mutable_batch()->set_vl_samples_per_step(per_step);
  auto job = Job::Create(config, SmallIndex());
  ExpectRefused(job.status(), absl::StatusCode::kFailedPrecondition,
                {"image tokens would be", "of batch.img_cap_tokens", "no plan can keep the cap",
                 "raise batch.img_cap_tokens to at least", "curriculum[0]"});
}

TEST(PlannerBadInputTest, SampleLargerThanSeqLen) {
  std::string c = kBaseConfig;
  c.replace(c.find("max_pixels: 1003520 seq_len: 8192"), 33, "max_pixels: 1003520 seq_len: 1024");
  auto job = MakeJob(c, SmallIndex());
  ExpectRefused(
      job.status(), absl::StatusCode::kFailedPrecondition,
      {"curriculum[1]", "seq_len 1024", "raise curriculum[1].seq_len to at least", "synthetic-"});
}

TEST(PlannerBadInputTest, UnknownStrategy) {
  auto job = MakeJob(WithStrategy("best-fit"), SmallIndex());
  ExpectRefused(job.status(), absl::StatusCode::kInvalidArgument,
                {"'best-fit'", "greedy, seed-v1, seed-v2, tutti"});
}

TEST(PlannerBadInputTest, RankOutsideTheWorld) {
  auto job = MakeJob(kBaseConfig, SmallIndex());
  ASSERT_TRUE(job.ok());
  Planner planner(*job);
  StepPlanData d;
  ASSERT_TRUE(planner.Plan(0, &d).ok());
  v1::StepPlan plan;
  const std::vector<uint32_t> ranks = {1, 4};
  ExpectRefused(BuildStepPlan(**job, d, ranks, &plan), absl::StatusCode::kInvalidArgument,
                {"rank 4", "world_size 4"});
}

TEST(PlannerBadInputTest, StepBeyondTheDatasetsEnd) {
  auto job = MakeJob(absl::StrCat(kBaseConfig, " epochs: 1"), SmallIndex());
  ASSERT_TRUE(job.ok());
  const uint64_t end = (*job)->total_steps();
  ASSERT_EQ(end, (*job)->steps_per_epoch());
  Planner planner(*job);
  StepPlanData d;
  EXPECT_TRUE(planner.Plan(end - 1, &d).ok());
  ExpectRefused(planner.Plan(end, &d), absl::StatusCode::kOutOfRange,
                {absl::StrCat("step ", end), absl::StrCat(end, " steps"), "raise epochs"});
}

TEST(PlannerBadInputTest, OverfullAndImpossibleBatches) {
  auto full = MakeJob(R"pb(
                        world_size: 2
                        batch { text_samples_per_step: 200 vl_samples_per_step: 0 grad_accum: 1 }
                        curriculum { start_step: 0 seq_len: 8192 })pb",
                      SmallIndex());
  ExpectRefused(full.status(), absl::StatusCode::kFailedPrecondition,
                {"text sequences would be", "lower batch.text_samples_per_step to at most"});
  auto too_many =
      MakeJob(R"pb(
                world_size: 2
                batch { text_samples_per_step: 1 vl_samples_per_step: 100000 grad_accum: 2 })pb",
              SmallIndex());
  ExpectRefused(too_many.status(), absl::StatusCode::kFailedPrecondition,
                {"vl_samples_per_step is 100000", "only"});
  SyntheticOptions text_only = SmallDataset(500);
  text_only.vl_fraction = 0;
  auto no_vl = MakeJob(kBaseConfig, SyntheticIndex(text_only));
  ExpectRefused(no_vl.status(), absl::StatusCode::kFailedPrecondition,
                {"no vision-language samples", "set batch.vl_samples_per_step to 0"});
}

}  // namespace
}  // namespace tutti::packer
