// The planner with its dispatchers: batch post-balancing through the packer
// core (services/packer/dispatch/ does the placement), checked on the plans
// tutti-packerd serves.
#include "services/packer/core/dispatcher.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/packer/bench/staging.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/core/post_balancing/post_balancing.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

using testing::kBaseConfig;
using testing::MakeJob;
using testing::SmallDataset;
using testing::SyntheticIndex;

// SmallDataset with audio clips on a third of the VL samples.
std::shared_ptr<const Index> AudioIndex() {
  static auto* index = new std::shared_ptr<const Index>([] {
    SyntheticOptions o = SmallDataset();
    o.audio_fraction = 0.3;
    return SyntheticIndex(o);
  }());
  return *index;
}

std::string PostConfig(const std::string& extra = "") {
  return absl::StrCat(kBaseConfig, " post_balancing { enabled: true ", extra, " }");
}

std::shared_ptr<const Job> JobOf(const std::string& config,
                                 std::shared_ptr<const Index> index = AudioIndex()) {
  auto job = MakeJob(config, std::move(index));
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : nullptr;
}

std::string IdentityOf(const Job& job, const StepPlanData& data) {
  v1::StepPlan plan;
  EXPECT_TRUE(BuildStepPlan(job, data, {}, &plan).ok());
  return PlanIdentityBytes(&plan);
}

v1::StepPlan Plan(const Planner& planner, uint64_t step) {
  StepPlanData data;
  absl::Status s = planner.Plan(step, &data);
  EXPECT_TRUE(s.ok()) << s;
  v1::StepPlan plan;
  EXPECT_TRUE(BuildStepPlan(planner.job(), data, {}, &plan).ok());
  return plan;
}

TEST(PostBalancingTest, PlansAreByteIdenticalWhateverRanThemBefore) {
  for (const char* extra : {"", "padded: true", "rearrangement: 'ilp'"}) {
    auto a = JobOf(PostConfig(extra)), b = JobOf(PostConfig(extra));
    ASSERT_TRUE(a && b);
    Planner pa(a), pb(b);
    // One buffer reused over steps in one order, fresh buffers in another,
    // and a plan made on another thread: the same bytes for the same step.
    StepPlanData reused;
    std::map<uint64_t, std::string> first;
    for (uint64_t step : {11, 0, 3, 11}) {
      ASSERT_TRUE(pa.Plan(step, &reused).ok());
      const std::string bytes = IdentityOf(*a, reused);
      if (first.count(step)) {
        EXPECT_EQ(first[step], bytes) << extra << " step " << step << " replanned";
      }
      first[step] = bytes;
    }
    for (uint64_t step : {3, 0, 11}) {
      StepPlanData fresh;
      ASSERT_TRUE(pb.Plan(step, &fresh).ok());
      EXPECT_EQ(first[step], IdentityOf(*b, fresh)) << extra << " step " << step;
    }
    std::string threaded;
    std::thread([&] {
      StepPlanData d;
      ASSERT_TRUE(pb.Plan(3, &d).ok());
      threaded = IdentityOf(*b, d);
    }).join();
    EXPECT_EQ(first[3], threaded) << extra;
  }
}

TEST(PostBalancingTest, EachPhaseIsBalancedOnItsOwnCost) {
  auto pre = JobOf(kBaseConfig);
  auto post = JobOf(PostConfig());
  ASSERT_TRUE(pre && post);
  EXPECT_EQ(post->dispatcher().name(), "post-balancing");
  EXPECT_EQ(pre->dispatcher().name(), "colocated");
  Planner pre_planner(pre), post_planner(post);
  double vit_pre = 0, vit_post = 0, llm_post = 0, llm_before = 0;
  bool moved = false, audio_phase = false;
  for (uint64_t step = 0; step < 6; ++step) {
    const v1::StepPlan p = Plan(post_planner, step);
    EXPECT_EQ(p.strategy(), "post-balancing/fast");
    std::map<std::string, const v1::PhaseStats*> phase;
    for (const auto& s : p.stats().phases()) phase[s.phase()] = &s;
    ASSERT_TRUE(phase.count("vit") && phase.count("llm"));
    vit_post += phase["vit"]->imbalance();
    llm_post += phase["llm"]->imbalance();
    llm_before += phase["llm"]->imbalance_before();
    audio_phase |= phase.count("audio") > 0;
    const v1::StepPlan pre_plan = Plan(pre_planner, step);
    for (const auto& s : pre_plan.stats().phases()) {
      if (s.phase() == "vit") vit_pre += s.imbalance();
    }
    // Encoder items may sit on another rank than their document; the plan
    // says where each output goes and the exchange carries exactly those.
    std::map<uint32_t, uint32_t> llm_rank_of;  // sample id -> LLM rank
    for (const auto& r : p.ranks()) {
      for (const auto& mb : r.micro_batches()) {
        for (const auto& seq : mb.sequences()) {
          EXPECT_LE(seq.tokens(), p.seq_len());
          for (const auto& doc : seq.docs()) llm_rank_of[doc.sample_id()] = r.rank();
        }
      }
    }
    EXPECT_EQ(llm_rank_of.size(), size_t(p.samples_size()));
    for (const auto& r : p.ranks()) {
      for (const auto& e : r.encoders()) {
        for (const auto& im : e.images()) {
          EXPECT_EQ(im.llm_rank(), llm_rank_of[im.sample_id()]);
          moved |= im.llm_rank() != r.rank();
        }
        for (const auto& au : e.audio()) EXPECT_EQ(au.llm_rank(), llm_rank_of[au.sample_id()]);
      }
    }
  }
  EXPECT_TRUE(moved) << "post-balancing never separated an image from its document";
  EXPECT_TRUE(audio_phase) << "the dataset has audio: its encoder phase must be reported";
  EXPECT_LT(vit_post, vit_pre);
  EXPECT_LT(llm_post, llm_before);
}

TEST(PostBalancingTest, PaddedCostIsWhatThePhaseReports) {
  auto unpadded = JobOf(PostConfig()), padded = JobOf(PostConfig("padded: true"));
  ASSERT_TRUE(unpadded && padded);
  StepPlanData u, p;
  ASSERT_TRUE(Planner(unpadded).Plan(4, &u).ok());
  ASSERT_TRUE(Planner(padded).Plan(4, &p).ok());
  EXPECT_TRUE(p.phases_from_dispatcher);
  // A padded micro-batch costs as its longest sequence times its size, so the
  // padded LLM phase can only cost more in total.
  EXPECT_GE(p.llm.mean, u.llm.mean);
  EXPECT_EQ(u.samples.size(), p.samples.size());
}

TEST(PostBalancingTest, UnstagedShardsComeThroughTheLoadExchange) {
  const std::shared_ptr<const Index> index = AudioIndex();
  auto job = JobOf(PostConfig(), index);
  ASSERT_TRUE(job);
  const uint32_t nodes = job->world_size() / job->ranks_per_node();
  ShardsOnNodes staging(index->num_shards(), nodes);
  Planner planner(job, &staging);
  uint64_t remote_images = 0, remote_docs = 0;
  for (uint64_t step = 0; step < 4; ++step) {
    const v1::StepPlan p = Plan(planner, step);
    std::map<uint64_t, uint32_t> shard_of;  // sample id -> index shard (by name)
    std::map<std::string, uint32_t> shard_index;
    for (uint32_t s = 0; s < index->num_shards(); ++s) shard_index[index->shard(s).name] = s;
    for (const auto& s : p.samples())
      shard_of[s.sample_id()] = shard_index[p.shards(s.shard()).name()];
    auto staged = [&](uint64_t sample, uint32_t rank) {
      return shard_of.at(sample) % nodes == rank / job->ranks_per_node();
    };
    // What each rank expects through its load exchange, and what is sent.
    std::set<std::tuple<uint32_t, uint64_t, int, uint32_t>> expected, received;
    std::map<std::pair<uint32_t, uint32_t>, std::string> sent, got;
    uint64_t load_bytes = 0;
    for (const auto& r : p.ranks()) {
      for (const auto& e : r.encoders()) {
        for (const auto& im : e.images()) {
          EXPECT_EQ(im.remote_load(), !staged(im.sample_id(), r.rank()));
          if (im.remote_load()) {
            expected.insert({r.rank(), im.sample_id(), v1::ENCODER_VISION, im.image_index()});
            ++remote_images;
          }
        }
        for (const auto& au : e.audio()) {
          EXPECT_EQ(au.remote_load(), !staged(au.sample_id(), r.rank()));
          if (au.remote_load()) {
            expected.insert({r.rank(), au.sample_id(), v1::ENCODER_AUDIO, au.audio_index()});
          }
        }
      }
      for (const auto& mb : r.micro_batches()) {
        for (const auto& seq : mb.sequences()) {
          for (const auto& doc : seq.docs()) {
            EXPECT_EQ(doc.remote_load(), !staged(doc.sample_id(), r.rank()));
            if (doc.remote_load()) {
              expected.insert({r.rank(), doc.sample_id(), v1::ENCODER_UNSPECIFIED, 0});
              ++remote_docs;
            }
          }
        }
      }
      const v1::Exchange& lx = r.load_exchange();
      for (const auto& t : lx.recvs()) {
        for (const auto& it : t.items()) {
          received.insert({r.rank(), it.sample_id(), it.encoder(), it.index()});
          EXPECT_NE(t.peer() / job->ranks_per_node(), r.rank() / job->ranks_per_node());
          EXPECT_TRUE(staged(it.sample_id(), t.peer())) << "loaded where it is not staged";
        }
        v1::Transfer as_sent = t;
        as_sent.set_peer(r.rank());
        got[{t.peer(), r.rank()}] = as_sent.SerializeAsString();
      }
      std::set<uint64_t> described;
      for (const auto& s : p.samples()) described.insert(s.sample_id());
      for (const auto& t : lx.sends()) {
        load_bytes += t.bytes();
        for (const auto& it : t.items()) EXPECT_TRUE(described.count(it.sample_id()));
        sent[{r.rank(), t.peer()}] = t.SerializeAsString();
      }
    }
    EXPECT_EQ(expected, received) << "step " << step;
    EXPECT_EQ(sent, got) << "load exchange sends and receives disagree, step " << step;
    EXPECT_EQ(p.stats().remote_load_bytes(), load_bytes);
  }
  EXPECT_GT(remote_images + remote_docs, 0u) << "the staging map made nothing remote";
}

TEST(PostBalancingTest, EverythingStagedEverywhereByDefault) {
  auto job = JobOf(PostConfig());
  ASSERT_TRUE(job);
  const v1::StepPlan p = Plan(Planner(job), 2);
  EXPECT_EQ(p.stats().remote_load_bytes(), 0u);
  for (const auto& r : p.ranks()) {
    EXPECT_FALSE(r.has_load_exchange());
    for (const auto& e : r.encoders()) {
      for (const auto& im : e.images()) EXPECT_FALSE(im.remote_load());
    }
  }
}

TEST(PostBalancingTest, IlpIsExactOnSmallJobsAndRefusedOnLargeOnes) {
  auto fast = JobOf(PostConfig()), ilp = JobOf(PostConfig("rearrangement: 'ilp'"));
  ASSERT_TRUE(fast && ilp);
  for (uint64_t step : {1, 5}) {
    StepPlanData f, x;
    ASSERT_TRUE(Planner(fast).Plan(step, &f).ok());
    ASSERT_TRUE(Planner(ilp).Plan(step, &x).ok());
    EXPECT_EQ(f.rearrangement, "fast");
    EXPECT_EQ(x.rearrangement, "ilp optimal") << "step " << step;
    // The same encoder placement feeds both; the optimum moves no more bytes.
    EXPECT_LE(x.inter_node_bytes + x.remote_load_bytes, f.inter_node_bytes + f.remote_load_bytes);
  }
  std::string big = PostConfig("rearrangement: 'ilp'");
  big.replace(big.find("world_size: 4"), 13, "world_size: 64");
  big.replace(big.find("ranks_per_node: 2"), 17, "ranks_per_node: 8");
  big.replace(big.find("text_samples_per_step: 24"), 25, "text_samples_per_step: 240");
  auto refused = MakeJob(big, AudioIndex());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* needle :
       {"rearrangement 'ilp'", "binary variables", "use rearrangement 'fast'"}) {
    EXPECT_NE(refused.status().message().find(needle), std::string::npos)
        << needle << ": " << refused.status();
  }
}

// post_balancing.balance_tolerance: unset takes the default (and is not
// written back, so the fingerprint of a job that never set it is unchanged);
// 0 to 0.1 is taken as given; anything else is refused at load naming the
// field and its range.
TEST(PostBalancingTest, TheBalanceToleranceIsBoundedAndDefaulted) {
  auto unset = JobOf(PostConfig());
  ASSERT_TRUE(unset);
  EXPECT_EQ(unset->dispatcher_options().balance_tolerance, kDefaultBalanceTolerance);
  EXPECT_FALSE(unset->config().post_balancing().has_balance_tolerance());
  for (double t : {0.0, 0.003, kMaxBalanceTolerance}) {
    auto job = JobOf(PostConfig(absl::StrCat("balance_tolerance: ", t)));
    ASSERT_TRUE(job);
    EXPECT_EQ(job->dispatcher_options().balance_tolerance, t);
    EXPECT_NE(job->fingerprint(), unset->fingerprint());
  }
  for (const char* bad : {"0.2", "-0.001", "nan", "inf"}) {
    auto job = MakeJob(PostConfig(absl::StrCat("balance_tolerance: ", bad)), AudioIndex());
    ASSERT_FALSE(job.ok()) << bad;
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    for (const char* needle : {"post_balancing.balance_tolerance", "outside [0, 0.1]"}) {
      EXPECT_NE(job.status().message().find(needle), std::string::npos)
          << bad << ": " << job.status();
    }
  }
}

TEST(PostBalancingTest, AStepAcrossAnEpochBoundaryDrawsNoSampleTwice) {
  SyntheticOptions o = SmallDataset(250);  // streams that the steps do not divide
  auto job = JobOf(PostConfig(), SyntheticIndex(o));
  ASSERT_TRUE(job);
  Planner planner(job);
  StepPlanData d;
  uint64_t spanning = 0;
  for (uint64_t step = 0; step < 200; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok()) << "step " << step;
    std::set<uint32_t> seen;
    for (const auto& ps : d.samples) {
      EXPECT_TRUE(seen.insert(ps.sample).second) << "step " << step << " sample " << ps.sample;
    }
    const uint64_t n = job->index().vl_samples().size();
    spanning += (step * 8) / n != (step * 8 + 7) / n;
    EXPECT_TRUE(CheckPlannedStep(d).ok()) << CheckPlannedStep(d);
  }
  EXPECT_GT(spanning, 10u) << "no step spans an epoch; the test needs another dataset size";
}

// The most image tokens any one sequence of the step holds.
uint64_t FullestImageSequence(const StepPlanData& d) {
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> images;
  uint64_t most = 0;
  for (const auto& ps : d.samples) {
    most = std::max(most, images[{ps.rank, ps.seq}] += ps.cost.image_tokens);
  }
  return most;
}

// img_cap_tokens holds in every sequence under post-balancing (fast, padded,
// ilp) as under colocated packing. The cap is the median over the steps of
// the fullest sequence's image tokens without a cap (at least the largest
// sample's), so that it binds in about half the steps; a step that cannot
// keep it is refused naming the image tokens, and most steps can.
TEST(PostBalancingTest, ImageCapHoldsInEveryMode) {
  const std::string base = kBaseConfig;
  auto probe = JobOf(base);
  ASSERT_TRUE(probe);
  uint64_t largest = 0;
  for (uint32_t stage = 0; stage < 2; ++stage) {
    for (uint32_t s : probe->vl_samples()) {
      auto c = probe->coster(stage).Cost(s);
      ASSERT_TRUE(c.ok());
      largest = std::max<uint64_t>(largest, c->image_tokens);
    }
  }
  constexpr uint64_t kSteps = 30;
  std::vector<uint64_t> fullest;
  {
    Planner planner(probe);
    StepPlanData d;
    for (uint64_t step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(planner.Plan(step, &d).ok());
      fullest.push_back(FullestImageSequence(d));
    }
  }
  std::sort(fullest.begin(), fullest.end());
  const uint64_t cap = std::max(largest, fullest[kSteps / 2]);
  std::string capped = base;
  capped.replace(capped.find("max_patches_per_chunk: 8192"), 27,
                 absl::StrCat("max_patches_per_chunk: 8192 img_cap_tokens: ", cap));
  PlanCheckOptions check;
  check.img_cap = static_cast<uint32_t>(cap);
  for (const char* mode : {"post", "post padded: true", "post rearrangement: 'ilp'", "tutti"}) {
    const bool post = std::string(mode).rfind("post", 0) == 0;
    const std::string extra = post ? std::string(mode).substr(4) : "";
    auto config = [&](const std::string& c) {
      return post ? absl::StrCat(c, " post_balancing { enabled: true ", extra, " }") : c;
    };
    auto job = JobOf(config(capped)), uncapped = JobOf(config(base));
    ASSERT_TRUE(job && uncapped);
    Planner planner(job), free_planner(uncapped);
    StepPlanData d;
    uint64_t planned = 0, over_without_cap = 0;
    for (uint64_t step = 0; step < kSteps; ++step) {
      absl::Status s = planner.Plan(step, &d);
      if (s.ok()) {
        ++planned;
        EXPECT_LE(FullestImageSequence(d), cap) << mode << " step " << step;
        EXPECT_TRUE(CheckPlannedStep(d, check).ok())
            << mode << " step " << step << ": " << CheckPlannedStep(d, check);
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << mode << ": " << s;
      }
      ASSERT_TRUE(free_planner.Plan(step, &d).ok()) << mode << " step " << step;
      over_without_cap += FullestImageSequence(d) > cap;
    }
    EXPECT_GE(planned, kSteps * 2 / 3) << mode;
    // Post-balancing breaks it without the cap (colocated tutti spreads VL
    // image tokens evenly enough to stay under it here).
    if (post) {
      EXPECT_GT(over_without_cap, 0u) << mode << ": the cap does not bind";
    }
  }
}

TEST(PostBalancingTest, StagingForAnotherClusterIsRefused) {
  auto job = JobOf(PostConfig());
  ASSERT_TRUE(job);
  ShardsOnNodes wrong(job->index().num_shards(), 3);  // the job has 2 nodes
  StepPlanData d;
  absl::Status s = Planner(job, &wrong).Plan(0, &d);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("3 nodes but the job has 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("step 0"), std::string::npos) << s;
}

}  // namespace
}  // namespace tutti::packer

namespace tutti::packer {
namespace {

// Every document lists its images' grids (what its LLM rank needs for M-RoPE
// position ids), equal to the ImagePlan of whichever rank encodes the image,
// with post-balancing off and on.
TEST(DocImagesTest, EveryDocumentCarriesTheGridsOfItsImages) {
  for (const std::string& config : {std::string(kBaseConfig), PostConfig()}) {
    auto job = JobOf(config);
    ASSERT_NE(job, nullptr);
    Planner planner(job);
    for (uint64_t step = 0; step < 3; ++step) {
      const v1::StepPlan plan = Plan(planner, step);
      std::map<std::pair<uint64_t, uint32_t>, const v1::ImagePlan*> encoded;
      for (const auto& rp : plan.ranks()) {
        EXPECT_EQ(rp.plan_version(), kPlanVersion);
        for (const auto& enc : rp.encoders()) {
          for (const auto& ip : enc.images()) encoded[{ip.sample_id(), ip.image_index()}] = &ip;
        }
      }
      std::map<uint64_t, const v1::SampleInfo*> samples;
      for (const auto& s : plan.samples()) samples[s.sample_id()] = &s;
      size_t images = 0;
      for (const auto& rp : plan.ranks()) {
        for (const auto& mb : rp.micro_batches()) {
          for (const auto& seq : mb.sequences()) {
            for (const auto& doc : seq.docs()) {
              ASSERT_EQ(doc.images_size(), samples.at(doc.sample_id())->images_size());
              uint32_t tokens = 0;
              for (int i = 0; i < doc.images_size(); ++i) {
                const v1::DocImage& di = doc.images(i);
                EXPECT_EQ(di.image_index(), static_cast<uint32_t>(i));
                const v1::ImagePlan* ip = encoded.at({doc.sample_id(), di.image_index()});
                EXPECT_EQ(ip->llm_rank(), rp.rank());
                EXPECT_EQ(
                    std::make_tuple(di.grid_t(), di.grid_h(), di.grid_w(), di.llm_tokens()),
                    std::make_tuple(ip->grid_t(), ip->grid_h(), ip->grid_w(), ip->llm_tokens()));
                tokens += di.llm_tokens();
                ++images;
              }
              if (samples.at(doc.sample_id())->audio_size() == 0) {
                EXPECT_EQ(tokens, doc.encoder_tokens());
              }
            }
          }
        }
      }
      EXPECT_EQ(images, encoded.size()) << config;
      EXPECT_GT(images, 0u);
    }
  }
}

// Transfer.runs, checked from the wire plans alone (CheckExchangeRuns): a
// run's items are adjacent in the encoding rank's encoder output and in the
// LLM rank's embeddings, both ends of a pair list the same items and runs,
// runs are as long as the layout allows, and they are fewer messages than
// items. Without post-balancing no item moves and no transfer has runs.
TEST(ExchangeRunsTest, RunsAreAdjacentAtBothEndsAndFewerThanTheItems) {
  // 8 VL samples a rank in 4 sequences, so that a pair has several items to
  // move and a rank's items come from several sequences.
  auto many = [](std::string c) {
    c.replace(c.find("vl_samples_per_step: 8"), 22, "vl_samples_per_step: 32");
    c.replace(c.find("text_vl_ratio: \"2:1\""), 20, "text_vl_ratio: \"1:2\"");
    return c.replace(c.find("vl_micro_batch: 1"), 17, "vl_micro_batch: 4");
  };
  for (const std::string& config :
       {many(kBaseConfig), many(PostConfig()), many(PostConfig("padded: true"))}) {
    auto job = JobOf(config);
    ASSERT_NE(job, nullptr);
    Planner planner(job);
    const bool post = config.find("post_balancing") != std::string::npos;
    ExchangeRunCounts counts;
    for (uint64_t step = 0; step < 8; ++step) {
      const v1::StepPlan plan = Plan(planner, step);
      ASSERT_TRUE(CheckExchangeRuns(plan, &counts).ok()) << CheckExchangeRuns(plan);
      for (const auto& rp : plan.ranks()) {
        EXPECT_EQ(rp.plan_version(), 3u);
        for (const auto& t : rp.exchange().sends()) {
          EXPECT_EQ(t.runs_size() > 0, post) << "step " << step << ": rank " << rp.rank();
        }
      }
    }
    if (post) {
      // Fewer messages than items (here about two thirds: a rank's four VL
      // sequences hold documents from up to four encoding ranks each).
      EXPECT_GT(counts.items, 0u);
      EXPECT_LT(counts.messages * 4, counts.items * 3)
          << config << ": " << counts.messages << " messages for " << counts.items
          << " items moved between ranks";
    }
  }
}

// The check is not blind: a plan whose encoder images are out of the sends'
// order, whose documents moved, whose runs differ at the two ends or merge
// items that are not adjacent, is refused.
TEST(ExchangeRunsTest, TheCheckRefusesLayoutsThatBreakARun) {
  auto job = JobOf(PostConfig());
  ASSERT_NE(job, nullptr);
  Planner planner(job);
  const v1::StepPlan plan = Plan(planner, 1);
  ASSERT_TRUE(CheckExchangeRuns(plan).ok());
  // A run of at least two items between two ranks.
  int rank = -1, transfer = -1;
  for (const auto& rp : plan.ranks()) {
    for (int k = 0; k < rp.exchange().sends_size(); ++k) {
      for (uint32_t n : rp.exchange().sends(k).runs()) {
        if (n > 1 && rank < 0) rank = rp.rank(), transfer = k;
      }
    }
  }
  ASSERT_GE(rank, 0) << "no run of two items in step 1";
  {
    v1::StepPlan p = plan;  // the sender's encoder images reversed
    auto* images = p.mutable_ranks(rank)->mutable_encoders(0)->mutable_images();
    std::reverse(images->begin(), images->end());
    EXPECT_THAT(std::string(CheckExchangeRuns(p).message()), ::testing::HasSubstr("not adjacent"));
  }
  {
    v1::StepPlan p = plan;  // the receiver's runs split one of the sender's
    const uint32_t peer = p.ranks(rank).exchange().sends(transfer).peer();
    for (auto& u : *p.mutable_ranks(peer)->mutable_exchange()->mutable_recvs()) {
      if (u.peer() != static_cast<uint32_t>(rank)) continue;
      for (int j = 0; j < u.runs_size(); ++j) {
        if (u.runs(j) > 1) {
          u.set_runs(j, u.runs(j) - 1);
          u.mutable_runs()->Add(1);
          break;
        }
      }
    }
    EXPECT_FALSE(CheckExchangeRuns(p).ok());
  }
  {
    v1::StepPlan p = plan;  // one message for every item of every pair
    for (auto& rp : *p.mutable_ranks()) {
      for (auto* list :
           {rp.mutable_exchange()->mutable_sends(), rp.mutable_exchange()->mutable_recvs()}) {
        for (auto& t : *list) {
          t.clear_runs();
          t.add_runs(t.items_size());
        }
      }
    }
    EXPECT_FALSE(CheckExchangeRuns(p).ok());
  }
}

}  // namespace
}  // namespace tutti::packer
