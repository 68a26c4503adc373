// The overflow policy (overflow.h): long documents, deferral of what a step
// cannot fit, restart safety, exactly-once with deferrals, and the bad-input
// refusals.
#include "services/packer/core/overflow.h"

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/core/plan_audit.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

std::shared_ptr<const Index> SeedIndex() {
  static auto* index = new std::shared_ptr<const Index>([] {
    auto ix = MakeSeedIndex(SeedWorkloadOptions(), 40000);
    EXPECT_TRUE(ix.ok()) << ix.status();
    return *ix;
  }());
  return *index;
}

// The seed workload at 8 ranks and 16 MP, as `tutti bench packer` plans it:
// a valid config some of whose steps hold more VL tokens than the world's VL
// sequences (steps 2, 7, 16, 33, 53 and 56 of the first 80 failed with
// FAILED_PRECONDITION before deferral).
v1::JobConfig SixteenMegapixelConfig() {
  SeedWorkloadOptions o;
  auto shape = SeedShape(o, *SeedIndex(), 8, kSeedStage2MaxPixels);
  EXPECT_TRUE(shape.ok());
  return SeedConfig(o, *shape, 8, kSeedStage2MaxPixels, "tutti", 1, false);
}

struct PlannedRun {
  std::vector<StepPlanData> plans;
  uint64_t deferred = 0, fallback = 0;
};

PlannedRun PlanSteps(const std::shared_ptr<const Job>& job, uint64_t from, uint64_t to,
                     uint32_t img_cap = 0) {
  PlannedRun run;
  Planner planner(job);
  PlanCheckOptions check;
  check.img_cap = img_cap;
  for (uint64_t step = from; step < to; ++step) {
    StepPlanData d;
    absl::Status s = planner.Plan(step, &d);
    EXPECT_TRUE(s.ok()) << "step " << step << ": " << s;
    if (!s.ok()) continue;
    EXPECT_TRUE(CheckPlannedStep(d, check).ok())
        << "step " << step << ": " << CheckPlannedStep(d, check);
    EXPECT_TRUE(AuditPlanAgainstJob(*job, d).ok()) << AuditPlanAgainstJob(*job, d);
    run.deferred += d.overflow.deferred_out;
    run.fallback += d.overflow.fallback_packing;
    run.plans.push_back(std::move(d));
  }
  return run;
}

std::string HashOf(const Job& job, const StepPlanData& d) {
  v1::StepPlan plan;
  EXPECT_TRUE(BuildStepPlan(job, d, {}, &plan).ok());
  return PlanHash(&plan);
}

TEST(OverflowTest, SixteenMegapixelStepsThatDoNotFitDeferAtEightRanks) {
  auto job = Job::Create(SixteenMegapixelConfig(), SeedIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const PlannedRun run = PlanSteps(*job, 0, 20);
  EXPECT_EQ(run.plans.size(), 20u);
  EXPECT_GT(run.deferred, 0u);
  // What a step defers, the next one places first.
  for (size_t i = 0; i + 1 < run.plans.size(); ++i) {
    EXPECT_EQ(run.plans[i].deferred_out, run.plans[i + 1].deferred_in) << "step " << i;
  }
}

// The seed workload with img_cap_tokens 5200 and 2 VL sequences per rank at
// 8 ranks, the VL samples per step set so that image tokens fill `fill` of
// the cap on average (tokens are far below seq_len: the cap binds); or, with
// `text_fill` > 0, the text samples set so that tokens fill that much of the
// text sequences of `seq_len` (seq_len binds).
v1::JobConfig CapConfig(double fill, double text_fill = 0, uint32_t seq_len = 0) {
  SeedWorkloadOptions o;
  auto shape = SeedShape(o, *SeedIndex(), 8, kSeedStage1MaxPixels);
  EXPECT_TRUE(shape.ok());
  const StageCoster coster(SixteenMegapixelConfig(), *SeedIndex(), kSeedStage1MaxPixels);
  double image_tokens = 0;
  for (uint32_t s : SeedIndex()->vl_samples()) image_tokens += coster.Cost(s)->image_tokens;
  image_tokens /= SeedIndex()->vl_samples().size();
  shape->text_seqs = 2;
  shape->vl_seqs = 2;
  const uint32_t text_len = seq_len > 0 ? seq_len : 32768;
  shape->text_samples = static_cast<uint32_t>(8 * 2 * text_len * (text_fill > 0 ? text_fill : 0.8) /
                                              shape->mean_text_tokens);
  shape->vl_samples = static_cast<uint32_t>(fill * 8 * 2 * 5200 / image_tokens);
  v1::JobConfig config = SeedConfig(o, *shape, 8, kSeedStage1MaxPixels, "tutti", 1, false);
  config.mutable_batch()->set_img_cap_tokens(5200);
  if (seq_len > 0) config.mutable_curriculum(0)->set_seq_len(seq_len);
  return config;
}

// Every stream position drawn in [0, steps) planned exactly once (or still
// waiting after the last step), and positions [0, n) of a stream (its epoch
// 0) each sample once.
void ExpectEachPositionOnce(const Job& job, const PlannedRun& run, uint64_t steps) {
  const auto& b = job.config().batch();
  for (const bool vl : {false, true}) {
    std::map<uint64_t, int> seen;
    for (const StepPlanData& d : run.plans) {
      for (const PlannedSample& ps : d.samples) {
        if (ps.vl == vl && ps.piece == 0) ++seen[ps.position];
      }
      for (uint64_t p : vl ? d.skipped_vl : d.skipped_text) ++seen[p];
    }
    const DeferralQueue& left = run.plans.back().deferred_out;
    for (uint64_t p : vl ? left.vl : left.text) ++seen[p];
    const uint64_t per = vl ? b.vl_samples_per_step() : b.text_samples_per_step();
    ASSERT_EQ(seen.size(), steps * per) << (vl ? "VL" : "text");
    for (const auto& [p, times] : seen) {
      ASSERT_LT(p, steps * per);
      ASSERT_EQ(times, 1) << "position " << p;
    }
    const uint64_t n = vl ? job.vl_samples().size() : job.text_samples().size();
    if (n > steps * per - (vl ? left.vl.size() : left.text.size())) continue;
    std::set<uint32_t> epoch0;
    for (const StepPlanData& d : run.plans) {
      for (const PlannedSample& ps : d.samples) {
        if (ps.vl == vl && ps.piece == 0 && ps.position < n) {
          EXPECT_TRUE(epoch0.insert(ps.sample).second) << "sample " << ps.sample;
        }
      }
    }
    EXPECT_EQ(epoch0.size(), n) << (vl ? "VL" : "text");
  }
}

// What the plans of a run defer: steps that defer, the most waiting, and
// the longest run of consecutive steps entered with a queue.
struct Deferrals {
  uint64_t steps = 0, most = 0, longest = 0;
};
Deferrals DeferralsOf(const PlannedRun& run) {
  Deferrals r;
  uint64_t streak = 0;
  for (const StepPlanData& d : run.plans) {
    r.steps += d.overflow.deferred_out > 0;
    r.most = std::max<uint64_t>(r.most, d.deferred_out.size());
    streak = d.deferred_in.empty() ? 0 : streak + 1;
    r.longest = std::max(r.longest, streak);
  }
  return r;
}

TEST(OverflowTest, ImageCapThatBindsPlansEveryStep) {
  auto job = Job::Create(CapConfig(0.8), SeedIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const PlannedRun run = PlanSteps(*job, 0, 200, 5200);
  EXPECT_EQ(run.plans.size(), 200u);
  for (const StepPlanData& d : run.plans) {
    uint64_t images = 0;
    for (const PlannedSample& ps : d.samples) images += ps.cost.image_tokens;
    EXPECT_LE(images, uint64_t{8} * 2 * 5200);
  }
}

// The cap at 0.93 of the load limit: the data keeps up (first-fit packs
// what a step draws, on average), but the queue rarely empties, so the job
// runs only if admission packs near what first-fit packs. It stopped at step
// 8 with RESOURCE_EXHAUSTED when admission was a bound on first-fit alone.
TEST(OverflowTest, ImageCapNearTheLoadLimitKeepsUpForHundredsOfSteps) {
  auto job = Job::Create(CapConfig(0.93), SeedIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const uint64_t steps = 400;
  const PlannedRun run = PlanSteps(*job, 0, steps, 5200);
  ASSERT_EQ(run.plans.size(), steps);
  const Deferrals d = DeferralsOf(run);
  EXPECT_GT(d.steps, steps / 4) << "the cap hardly binds";
  EXPECT_LE(d.most, (*job)->config().batch().vl_samples_per_step());
  ExpectEachPositionOnce(**job, run, steps);
  // tutti packs what admission admits wherever first fit does, and balances
  // it: no step goes to the planner's first-fit fallback (before: 135 of
  // 400, LLM 1.047 over the bound on average), LLM 1.002.
  EXPECT_EQ(run.fallback, 0u);
  double llm = 0;
  for (const StepPlanData& p : run.plans) llm += p.llm.max / p.llm.lower_bound;
  EXPECT_LT(llm / steps, 1.01);
  for (size_t i = 0; i + 1 < run.plans.size(); ++i) {
    ASSERT_EQ(run.plans[i].deferred_out, run.plans[i + 1].deferred_in) << "step " << i;
  }
}

// The same near seq_len: text documents of the seed workload at 0.93 of
// 2 x 8 sequences of 8192 tokens (long ones split), the VL cap at 0.9.
TEST(OverflowTest, SeqLenNearTheLoadLimitKeepsUpForHundredsOfSteps) {
  auto job = Job::Create(CapConfig(0.9, 0.93, 8192), SeedIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const uint64_t steps = 300;
  const PlannedRun run = PlanSteps(*job, 0, steps, 5200);
  ASSERT_EQ(run.plans.size(), steps);
  uint64_t text_deferred = 0;
  for (const StepPlanData& d : run.plans) text_deferred += d.deferred_out.text.size();
  EXPECT_GT(text_deferred, 0u) << "seq_len never binds";
  ExpectEachPositionOnce(**job, run, steps);
}

// A curriculum whose stages change while samples wait: what a 1 MP step
// (image tokens at 0.93 of the cap) defers is costed again at the next
// stage, 0.26 MP, and a restarted planner recovers the queue
// across the change.
TEST(OverflowTest, DeferralAcrossCurriculumStagesAndARestartThere) {
  v1::JobConfig config = CapConfig(0.93);
  // The stage changes after the first step from 40 on that leaves a queue.
  uint64_t change = 0;
  {
    auto one = Job::Create(config, SeedIndex());
    ASSERT_TRUE(one.ok());
    const PlannedRun run = PlanSteps(*one, 0, 80, 5200);
    for (uint64_t k = 40; k < run.plans.size() && change == 0; ++k) {
      if (run.plans[k].deferred_out.vl.size() > 2) change = k + 1;
    }
    ASSERT_GT(change, 0u);
  }
  auto* next = config.add_curriculum();
  *next = config.curriculum(0);
  next->set_start_step(change);
  next->set_max_pixels(262144);
  auto job = Job::Create(config, SeedIndex());
  ASSERT_TRUE(job.ok()) << job.status();
  const PlannedRun run = PlanSteps(*job, 0, 120, 5200);
  ASSERT_EQ(run.plans.size(), 120u);
  ExpectEachPositionOnce(**job, run, 120);
  EXPECT_FALSE(run.plans[change].deferred_in.empty());
  EXPECT_EQ(run.plans[change].stage, 1u);
  auto fresh = Job::Create(config, SeedIndex());
  ASSERT_TRUE(fresh.ok());
  for (uint64_t step : {change - 1, change, change + 1, change + 30}) {
    Planner alone(*fresh);
    StepPlanData d;
    ASSERT_TRUE(alone.Plan(step, &d).ok()) << "step " << step;
    EXPECT_EQ(d.deferred_in, run.plans[step].deferred_in) << "step " << step;
    EXPECT_EQ(HashOf(**fresh, d), HashOf(**job, run.plans[step])) << "step " << step;
  }
}

// Near the load limit the queue stays non-empty for many steps in a row; a
// restarted planner still recovers it (from the two bounds, planner.h).
TEST(OverflowTest, RestartWhereTheQueueHasNotEmptiedForManySteps) {
  auto job = Job::Create(CapConfig(0.95), SeedIndex());
  ASSERT_TRUE(job.ok());
  const PlannedRun run = PlanSteps(*job, 0, 200, 5200);
  ASSERT_EQ(run.plans.size(), 200u);
  // The step after the longest stretch of steps entered with a queue.
  uint64_t k = 0, streak = 0, best = 0;
  for (uint64_t i = 0; i < 190; ++i) {
    streak = run.plans[i].deferred_in.empty() ? 0 : streak + 1;
    if (streak > best) best = streak, k = i;
  }
  EXPECT_GT(best, uint64_t{(*job)->overflow().max_deferred_steps});
  auto fresh = Job::Create(CapConfig(0.95), SeedIndex());
  ASSERT_TRUE(fresh.ok());
  Planner planner(*fresh);
  for (uint64_t step = k; step < k + 8; ++step) {
    StepPlanData d;
    ASSERT_TRUE(planner.Plan(step, &d).ok()) << "step " << step;
    EXPECT_EQ(d.deferred_in, run.plans[step].deferred_in) << "step " << step;
    EXPECT_EQ(HashOf(**fresh, d), HashOf(**job, run.plans[step])) << "step " << step;
  }
}

TEST(OverflowTest, RestartAtAStepWithAWaitingQueueGivesIdenticalPlans) {
  auto job = Job::Create(SixteenMegapixelConfig(), SeedIndex());
  ASSERT_TRUE(job.ok());
  const PlannedRun run = PlanSteps(*job, 0, 40);
  ASSERT_EQ(run.plans.size(), 40u);
  uint64_t k = 0;
  while (k < 30 && run.plans[k].deferred_in.empty()) ++k;
  ASSERT_LT(k, 30u) << "no step entered with a waiting queue";
  // A fresh job and planner, as a restarted packer has: nothing remembered.
  auto fresh = Job::Create(SixteenMegapixelConfig(), SeedIndex());
  ASSERT_TRUE(fresh.ok());
  Planner planner(*fresh);
  for (uint64_t step = k; step < k + 10; ++step) {
    StepPlanData d;
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    EXPECT_EQ(d.deferred_in, run.plans[step].deferred_in) << "step " << step;
    EXPECT_EQ(HashOf(**fresh, d), HashOf(**job, run.plans[step])) << "step " << step;
  }
  // And in any order, one step at a time.
  for (uint64_t step : {k + 3, k, k + 1}) {
    Planner alone(*fresh);
    StepPlanData d;
    ASSERT_TRUE(alone.Plan(step, &d).ok());
    EXPECT_EQ(HashOf(**fresh, d), HashOf(**job, run.plans[step])) << "step " << step;
  }
}

// Over more than an epoch of each stream, with deferrals: every stream
// position drawn is planned exactly once (or still waiting at the end), so
// every sample of each epoch exactly once.
TEST(OverflowTest, ExactlyOnceOverAnEpochWithDeferrals) {
  auto job = Job::Create(SixteenMegapixelConfig(), SeedIndex());
  ASSERT_TRUE(job.ok());
  const auto& b = (*job)->config().batch();
  const uint64_t steps = (*job)->vl_samples().size() / b.vl_samples_per_step() + 2;
  const PlannedRun run = PlanSteps(*job, 0, steps);
  ASSERT_EQ(run.plans.size(), steps);
  EXPECT_GT(run.deferred, 0u);
  ExpectEachPositionOnce(**job, run, steps);
}

// 600 samples: text of 400 tokens, every 50th 20,000 (longer than seq_len
// 8192); VL with one image, every 100th with three 1 MP images and 7,000
// text tokens (11,000 tokens).
std::shared_ptr<const Index> LongDocumentIndex() {
  IndexWriter w;
  w.SetSourceDir("long");
  for (uint32_t s = 0; s < 600; ++s) {
    if (s % 100 == 0) {
      EXPECT_TRUE(w.AddShard(absl::StrCat("l-", s / 100, ".tar"), 1 << 30, 0).ok());
    }
    const bool vl = s % 5 == 4;
    const bool longer = vl ? s % 100 == 9 : s % 50 == 3;
    const uint32_t text = vl ? (longer ? 7000 : 60) : (longer ? 20000 : 400);
    const uint64_t base = uint64_t{s % 100} << 20;
    MemberInput json{MemberKind::kJson, "json", base + 512, uint64_t{text} * 6 + 16};
    std::vector<MemberInput> media;
    for (uint32_t k = 0; vl && k < (longer ? 3u : 1u); ++k) {
      MemberInput m;
      m.kind = MemberKind::kJpeg;
      m.ext = absl::StrCat(k, ".jpg");
      m.width = m.height = longer ? 1000 : 600;
      m.offset = base + 100000 + k * 200000;
      m.size = 100000;
      media.push_back(m);
    }
    EXPECT_TRUE(w.AddSample(absl::StrCat("k", s), text, &json, media).ok());
  }
  auto ix = Index::FromString(w.Finish(), "long.idx");
  EXPECT_TRUE(ix.ok()) << ix.status();
  return *ix;
}

std::string LongDocumentConfig(const std::string& overflow) {
  return absl::StrCat(R"pb(
                        seed: 3
                        world_size: 4
                        ranks_per_node: 2
                        batch {
                          text_samples_per_step: 24
                          vl_samples_per_step: 6
                          grad_accum: 2
                          text_micro_batch: 2
                          vl_micro_batch: 1
                          text_vl_ratio: "2:1"
                        }
                        curriculum { start_step: 0 max_pixels: 1003520 seq_len: 8192 }
                      )pb",
                      overflow);
}

// Under colocated packing and post-balancing alike: a split VL document's
// later pieces hold its text alone and still go to VL sequences (post-
// balancing refused such a step as "VL but has no images or audio").
TEST(OverflowTest, ALongDocumentUnderEachPolicy) {
  const auto index = LongDocumentIndex();
  for (const bool post : {false, true})
    for (const std::string policy : {"", "split", "truncate", "skip"}) {
      SCOPED_TRACE(absl::StrCat(policy, post ? ", post-balancing" : ""));
      auto job =
          testing::MakeJob(LongDocumentConfig(absl::StrCat(
                               policy.empty() ? ""
                                              : absl::StrCat("overflow { long_documents: '", policy,
                                                             "' max_skip_fraction: 0.05 }"),
                               post ? " post_balancing { enabled: true }" : "")),
                           index);
      ASSERT_TRUE(job.ok()) << job.status();
      const PlannedRun run = PlanSteps(*job, 0, 40);  // two epochs of each stream
      ASSERT_EQ(run.plans.size(), 40u);
      uint64_t split = 0, pieces = 0, truncated = 0, skipped = 0, long_planned = 0;
      for (const StepPlanData& d : run.plans) {
        split += d.overflow.split_documents;
        pieces += d.overflow.split_pieces;
        truncated += d.overflow.truncated;
        skipped += d.overflow.skipped;
        v1::StepPlan plan;
        ASSERT_TRUE(BuildStepPlan(**job, d, {}, &plan).ok());
        for (const PlannedSample& ps : d.samples) {
          EXPECT_LE(ps.cost.llm_tokens, 8192u);
          const uint32_t full = ps.vl ? 7000 : 20000;
          if (ps.pieces > 0 || ps.truncated) ++long_planned;
          if (ps.truncated) {
            EXPECT_EQ(ps.cost.llm_tokens, 8192u);
            EXPECT_EQ(ps.cost.images, ps.vl ? 3 : 0);
            EXPECT_LT(ps.cost.text_tokens, full);
          }
        }
        for (const auto& rank : plan.ranks()) {
          for (const auto& mb : rank.micro_batches()) {
            for (const auto& seq : mb.sequences()) {
              for (const auto& doc : seq.docs()) {
                if (doc.pieces() == 0) continue;
                EXPECT_LT(doc.piece(), doc.pieces());
                // Text-only pieces before the last fill a sequence.
                if (mb.modality() == v1::MODALITY_TEXT && doc.piece() + 1 < doc.pieces()) {
                  EXPECT_EQ(doc.length(), 8192u);
                  EXPECT_EQ(doc.text_begin(), doc.piece() * 8192u);
                }
              }
            }
          }
        }
      }
      // 12 long text and 6 long VL documents per epoch of each stream.
      if (policy.empty() || policy == "split") {
        EXPECT_EQ(split, 36u);
        EXPECT_EQ(pieces, 24u * 3 + 12u * 2);  // 20,000 = 3 x 8192; 11,000 = 2
        EXPECT_EQ(truncated + skipped, 0u);
      } else if (policy == "truncate") {
        EXPECT_EQ(truncated, 36u);
        EXPECT_EQ(split + skipped, 0u);
      } else {
        EXPECT_EQ(skipped, 36u);
        EXPECT_EQ(split + truncated + long_planned, 0u);
      }
    }
}

TEST(OverflowTest, ShapeDocumentNeverCutsARun) {
  std::vector<DocPiece> p;
  EXPECT_EQ(ShapeDocument(20000, {}, 8192, LongDocuments::kSplit, &p), LongDocOutcome::kSplit);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].tokens, 8192u);
  EXPECT_EQ(p[1].text_begin, 8192u);
  EXPECT_EQ(p[2].tokens, 20000u - 2 * 8192);
  const std::vector<uint32_t> runs = {3000, 3000, 3000};
  EXPECT_EQ(ShapeDocument(100, runs, 8192, LongDocuments::kSplit, &p), LongDocOutcome::kSplit);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].runs, 2u);
  EXPECT_EQ(p[0].tokens, 6000u);
  EXPECT_EQ(p[1].first_run, 2u);
  EXPECT_EQ(p[1].tokens, 3100u);
  // Truncation keeps every run: these do not fit together, so it skips.
  EXPECT_EQ(ShapeDocument(100, runs, 8192, LongDocuments::kTruncate, &p), LongDocOutcome::kSkipped);
  EXPECT_EQ(ShapeDocument(6000, {3000}, 8192, LongDocuments::kTruncate, &p),
            LongDocOutcome::kTruncated);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].text_tokens, 8192u - 3000);
  EXPECT_EQ(ShapeDocument(100, {9000}, 8192, LongDocuments::kSplit, &p), LongDocOutcome::kSkipped);
  EXPECT_EQ(ShapeDocument(100, {3000}, 8192, LongDocuments::kSplit, &p), LongDocOutcome::kWhole);
}

TEST(OverflowTest, CertificateSizesAreTheExactCeilingOfTheirShare) {
  // min(kUnit, ceil(x kUnit / cap)) for every cap the config allows, at the
  // edges of each quotient and at random.
  const uint64_t unit = PackCertificate::kUnit;
  auto want = [&](uint64_t x, uint64_t cap) {
    return static_cast<uint32_t>(std::min<uint64_t>(unit, (x * unit + cap - 1) / cap));
  };
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  for (const uint64_t cap : {1ull, 2ull, 3ull, 7ull, 1000ull, 4096ull, 5200ull, 8191ull, 8192ull,
                             40960ull, 1000003ull, 16777216ull, 0x7FFFFFFFull, 0xFFFFFFFFull}) {
    const PackCertificate tokens(4, static_cast<uint32_t>(cap), 0);
    const PackCertificate images(4, 1u << 31, static_cast<uint32_t>(cap));
    std::vector<uint64_t> xs = {0, 1, cap - 1, cap, cap + 1, 0xFFFFFFFFull};
    for (uint64_t q = 1; q < 64; ++q) {
      const uint64_t at = cap * q / 64;  // near each 64th of the cap
      for (const uint64_t d : {0ull, 1ull}) xs.push_back(at + d), xs.push_back(at > d ? at - d : 0);
    }
    for (int i = 0; i < 2000; ++i) xs.push_back(next() % (2 * cap + 2));
    for (const uint64_t x64 : xs) {
      const uint32_t x = static_cast<uint32_t>(std::min<uint64_t>(x64, 0xFFFFFFFFull));
      ASSERT_EQ(tokens.Size(x, 0), want(x, cap)) << x << " tokens, seq_len " << cap;
      ASSERT_EQ(images.Size(0, x), std::max(want(0, 1u << 31), want(x, cap)))
          << x << " image tokens, cap " << cap;
    }
  }
}

TEST(OverflowTest, TheCertificateIsClosedUnderSubsetsAndFirstFitPacksWhatItAdmits) {
  const PackCertificate cert(8, 8192, 0);
  std::vector<uint32_t> sizes;
  for (uint32_t t : {4900u, 4900u, 4900u, 3000u, 800u, 800u, 400u})
    sizes.push_back(cert.Size(t, 0));
  EXPECT_TRUE(cert.Holds(sizes));
  std::vector<uint32_t> big(12, cert.Size(4900, 0));
  EXPECT_FALSE(cert.Holds(big));
  std::vector<uint32_t> begin(13);
  for (uint32_t i = 0; i <= 12; ++i) begin[i] = i;
  const uint32_t n = cert.LongestPrefix(big, begin);
  EXPECT_GT(n, 0u);
  EXPECT_LT(n, 12u);
  EXPECT_TRUE(cert.Holds(absl::MakeConstSpan(big).subspan(0, n)));
  EXPECT_FALSE(cert.Holds(absl::MakeConstSpan(big).subspan(0, n + 1)));
  std::vector<PackItem> items(n, PackItem{4900, 0, 0, 1});
  PackProblem p;
  p.ranks = 4;
  p.seq_len = 8192;
  p.text_seqs_per_rank = 2;
  p.text = items;
  PackResult r;
  ASSERT_TRUE(MakeFirstFitStrategy()->Pack(p, &r).ok());
  std::map<uint32_t, uint32_t> tokens;
  for (uint32_t i = 0; i < n; ++i) tokens[r.text_slot[i]] += 4900;
  for (const auto& [slot, t] : tokens) EXPECT_LE(t, 8192u) << "slot " << slot;
}

// FirstFitPrefix sorts a window's sizes once for all its probes: the same
// prefix as a binary search that runs first-fit decreasing on each probe's
// prefix, on windows of one- to three-piece candidates, sizes from tiny to a
// whole sequence, near and far from what the bins hold.
TEST(OverflowTest, FirstFitPrefixIsTheBinarySearchOverFirstFitDecreasing) {
  std::mt19937 rng(12);
  auto reference = [](absl::Span<const uint32_t> sizes, absl::Span<const uint32_t> begin,
                      uint32_t bins) {
    const uint32_t n = static_cast<uint32_t>(begin.size()) - 1;
    if (FirstFitPacks(sizes.subspan(0, begin[n]), bins)) return n;
    uint32_t lo = 0, hi = n;
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      (FirstFitPacks(sizes.subspan(0, begin[mid]), bins) ? lo : hi) = mid;
    }
    return lo;
  };
  uint32_t partial = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const uint32_t bins = rng() % 24;
    const uint32_t n = rng() % 120;
    const uint32_t max_size = 1 + rng() % PackCertificate::kUnit;
    std::vector<uint32_t> sizes, begin{0};
    for (uint32_t c = 0; c < n; ++c) {
      const uint32_t pieces = 1 + (rng() % 8 == 0 ? rng() % 3 : 0);
      for (uint32_t k = 0; k < pieces; ++k) {
        // Repeated sizes too: equal items are where an order could differ.
        sizes.push_back(rng() % 4 == 0 ? max_size / 2 : 1 + rng() % max_size);
      }
      begin.push_back(static_cast<uint32_t>(sizes.size()));
    }
    const uint32_t want = reference(sizes, begin, bins);
    ASSERT_EQ(FirstFitPrefix(sizes, begin, bins), want)
        << "trial " << trial << ": " << n << " candidates, " << bins << " bins";
    partial += want > 0 && want < n;
  }
  EXPECT_GT(partial, 40u);  // the binary search itself was exercised
}

// Bad input.

TEST(OverflowBadInputTest, APolicyThatWouldSkipTooMuchIsRefusedAtLoad) {
  auto job = testing::MakeJob(LongDocumentConfig("overflow { long_documents: 'skip' }"),
                              LongDocumentIndex());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(job.status().message());
  EXPECT_NE(m.find("would skip 12 of the 480 text-only samples"), std::string::npos) << m;
  EXPECT_NE(m.find("above overflow.max_skip_fraction 0.0100"), std::string::npos) << m;
  EXPECT_NE(m.find("raise curriculum[0].seq_len to at least 20000"), std::string::npos) << m;
  EXPECT_NE(m.find("'split'"), std::string::npos) << m;
  auto bad = testing::MakeJob(LongDocumentConfig("overflow { long_documents: 'drop' }"),
                              LongDocumentIndex());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'drop' is unknown"), std::string::npos);
  auto window = testing::MakeJob(LongDocumentConfig("overflow { max_deferred_steps: 65 }"),
                                 LongDocumentIndex());
  ASSERT_FALSE(window.ok());
  EXPECT_NE(window.status().message().find("above 64"), std::string::npos);
}

// Text documents of 0.6 seq_len: a sequence holds one, a step draws 1.5 per
// sequence (fill 0.9, which the load check allows): the queue can only grow.
std::shared_ptr<const Index> HeavyIndex() {
  IndexWriter w;
  w.SetSourceDir("heavy");
  for (uint32_t s = 0; s < 400; ++s) {
    if (s % 100 == 0) {
      EXPECT_TRUE(w.AddShard(absl::StrCat("h-", s / 100, ".tar"), 1 << 30, 0).ok());
    }
    MemberInput json{MemberKind::kJson, "json", uint64_t{s % 100} << 20, 4900 * 6};
    std::vector<MemberInput> media;
    if (s % 4 == 3) {
      MemberInput m;
      m.kind = MemberKind::kJpeg;
      m.ext = "0.jpg";
      m.width = m.height = 300;
      m.offset = (uint64_t{s % 100} << 20) + 40000;
      m.size = 10000;
      media.push_back(m);
    }
    EXPECT_TRUE(w.AddSample(absl::StrCat("k", s), s % 4 == 3 ? 50 : 4900, &json, media).ok());
  }
  auto ix = Index::FromString(w.Finish(), "heavy.idx");
  EXPECT_TRUE(ix.ok()) << ix.status();
  return *ix;
}

TEST(OverflowBadInputTest, AQueueThatCannotDrainStopsTheJobNamingTheStep) {
  const std::string base = R"pb(
    seed: 5
    world_size: 4
    ranks_per_node: 2
    batch {
      text_samples_per_step: 12
      vl_samples_per_step: 2
      grad_accum: 2
      text_micro_batch: 2
      vl_micro_batch: 1
      text_vl_ratio: "2:1"
    }
    curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
  )pb";
  for (const std::string overflow : {"", "overflow { max_deferred_samples: 100000 }"}) {
    SCOPED_TRACE(overflow);
    auto job = testing::MakeJob(base + overflow, HeavyIndex());
    ASSERT_TRUE(job.ok()) << job.status();
    Planner planner(*job);
    StepPlanData d;
    uint64_t step = 0;
    absl::Status s;
    for (; step < 40; ++step) {
      s = planner.Plan(step, &d);
      if (!s.ok()) break;
      EXPECT_GT(d.overflow.deferred_out, 0u);
    }
    ASSERT_LT(step, 40u);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    const std::string m(s.message());
    EXPECT_NE(m.find(absl::StrCat("step ", step, ": the data cannot keep up")), std::string::npos)
        << m;
    EXPECT_NE(m.find(overflow.empty() ? "above overflow.max_deferred_samples 14"
                                      : "one has waited more than 8 steps"),
              std::string::npos)
        << m;
    // 8 of 12 fit a step: 4 more wait each step, so 16 wait at step 4, and
    // entering step 25 the oldest waiting was drawn at step 16 (position 200).
    EXPECT_EQ(step, overflow.empty() ? 4u : 25u);
    // A fresh planner (a restarted packer) reaches the same verdict.
    Planner fresh(*job);
    EXPECT_EQ(fresh.Plan(step, &d).code(), absl::StatusCode::kResourceExhausted);
  }
}

}  // namespace
}  // namespace tutti::packer
