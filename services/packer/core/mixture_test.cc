// The mixture's draw: proportions against the weights (per step and
// cumulative) through schedule changes, exactly once per source-epoch,
// the same global batches at two world sizes and at any resumed step.
#include "services/packer/core/mixture.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "services/packer/core/plan_audit.h"
#include "services/packer/core/plan_check.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/mixture_jobs.h"

namespace tutti::packer {
namespace {

using testing::MakeJob;
using testing::MixtureIndex;
using testing::MixtureJob;
using testing::ThreeSources;

// The configured weights of a stream's sources at `step` (doubles, as the
// config says them: the test's targets, independent of the planner's
// integer weights).
std::vector<double> StreamWeights(const Mixture& m, bool vl, uint64_t step) {
  const MixtureSegment* seg = &m.segments()[0];
  for (const MixtureSegment& g : m.segments()) {
    if (g.start_step <= step) seg = &g;
  }
  std::vector<double> w;
  for (uint32_t src : m.stream_sources(vl)) w.push_back(seg->weights[src]);
  return w;
}

// Over `steps` steps of both streams: every source's count within one
// sample of weight x N (against the config's weights in doubles), the
// counts summing to N, every cumulative count within one sample of its
// target summed since the stream's weights last changed, and (every
// `draw_every` steps) the sources the draw gives at the step's positions
// are those counts. Returns the largest errors seen.
struct Errors {
  double step = 0, cumulative = 0;
};
Errors CheckProportions(const Job& job, uint64_t steps, uint64_t draw_every) {
  const Mixture& m = *job.mixture();
  Errors worst;
  for (const bool vl : {false, true}) {
    const Apportionment* a = m.apportionment(vl);
    if (a == nullptr) continue;
    const uint32_t S = a->sources(), N = a->per_step();
    std::vector<uint32_t> count(S);
    std::vector<uint64_t> before(S), running(S, 0), since(S, 0);
    std::vector<double> target(S, 0), last_share(S, -1);
    std::vector<uint64_t> pos(N);
    std::vector<uint32_t> ids(N);
    std::vector<uint8_t> src(N);
    for (uint64_t t = 0; t < steps; ++t) {
      const std::vector<double> w = StreamWeights(m, vl, t);
      double total = 0;
      for (double x : w) total += x;
      // The weights changed (normalised): targets count from here.
      bool changed = false;
      for (uint32_t s = 0; s < S; ++s) {
        const double share = N * w[s] / total;
        changed |= std::abs(share - last_share[s]) > 1e-12;
      }
      if (changed) {
        for (uint32_t s = 0; s < S; ++s) {
          since[s] = running[s];
          target[s] = 0;
          last_share[s] = N * w[s] / total;
        }
      }
      a->At(t, count.data(), before.data());
      uint64_t sum = 0;
      for (uint32_t s = 0; s < S; ++s) {
        EXPECT_EQ(before[s], running[s]) << "step " << t;
        const double share = N * w[s] / total;
        worst.step = std::max(worst.step, std::abs(count[s] - share));
        running[s] += count[s];
        sum += count[s];
        target[s] += share;
        worst.cumulative = std::max(
            worst.cumulative, std::abs(static_cast<double>(running[s] - since[s]) - target[s]));
      }
      EXPECT_EQ(sum, N) << "step " << t;
      if (draw_every > 0 && t % draw_every == 0) {
        for (uint32_t j = 0; j < N; ++j) pos[j] = t * N + j;
        job.DrawSamples(vl, pos.data(), N, ids.data(), src.data());
        std::vector<uint32_t> drawn(S, 0);
        for (uint32_t j = 0; j < N; ++j) ++drawn[m.source(src[j]).part[vl].slot];
        EXPECT_EQ(drawn, count) << "step " << t;
        std::sort(ids.begin(), ids.end());
        EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << "step " << t;
      }
    }
  }
  return worst;
}

// Weights for the 200 FineVision-shaped sources: by size until 12,000,
// then the first 50 three times theirs, then a ramp back to sizes.
std::string Schedule(const MixtureDatasetOptions& o) {
  std::string out = MixtureConfigText(o, /*by_size=*/true);
  out.pop_back();  // the closing brace and newline
  out.pop_back();
  absl::StrAppend(&out, "  stages { start_step: 12000");
  for (size_t i = 0; i < 50 && i < o.sources.size(); ++i) {
    absl::StrAppend(&out, " weights { source: '", o.sources[i].name,
                    "' weight: ", 3 * o.sources[i].samples, " }");
  }
  absl::StrAppend(&out, " }\n  stages { start_step: 15000 ramp_steps: 1600");
  for (size_t i = 0; i < 50 && i < o.sources.size(); ++i) {
    absl::StrAppend(&out, " weights { source: '", o.sources[i].name,
                    "' weight: ", o.sources[i].samples, " }");
  }
  absl::StrAppend(&out, " }\n}\n");
  return out;
}

void RealisedProportions(uint32_t world, uint32_t sources) {
  MixtureDatasetOptions o = sources == 3 ? ThreeSources(4) : FineVisionShape(sources, 240000, 5);
  if (sources == 3) {
    o.samples_per_shard = 1000;
  }
  auto index = MixtureIndex(o);
  std::string mixture;
  if (sources == 3) {
    mixture = R"pb(mixture {
                     sources { name: "ocr" shard_prefixes: "ocr/" weight: 0.3 }
                     sources { name: "charts" shard_prefixes: "charts/" weight: 0.2 }
                     sources { name: "text" shard_prefixes: "text/" weight: 0.5 }
                     stages {
                       start_step: 12000
                       weights { source: "charts" weight: 0.45 }
                     }
                     stages {
                       start_step: 15000
                       ramp_steps: 1600
                       weights { source: "ocr" weight: 0.05 }
                     }
                   })pb";
  } else {
    mixture = Schedule(o);
  }
  auto job = MakeJob(MixtureJob(world, 6 * world, 2 * world, mixture), index);
  ASSERT_TRUE(job.ok()) << job.status();
  const Errors e = CheckProportions(**job, 20000, world >= 256 ? 97 : 13);
  EXPECT_LT(e.step, 1.0) << "W " << world << ", " << sources << " sources";
  EXPECT_LT(e.cumulative, 1.0) << "W " << world << ", " << sources << " sources";
}

TEST(MixtureTest, ProportionsW8ThreeSources) { RealisedProportions(8, 3); }
TEST(MixtureTest, ProportionsW256ThreeSources) { RealisedProportions(256, 3); }
TEST(MixtureTest, ProportionsW8TwoHundredSources) { RealisedProportions(8, 200); }
TEST(MixtureTest, ProportionsW256TwoHundredSources) { RealisedProportions(256, 200); }

// Every source's draws in position order: (source position, sample) by
// walking each step's positions (a source's k-th of a step is its position
// before(step) + k).
std::map<uint32_t, std::vector<uint32_t>> DrawsBySource(
    const Job& job, bool vl, uint64_t steps, std::vector<std::vector<uint32_t>>* by_step) {
  const Mixture& m = *job.mixture();
  const uint32_t N = m.apportionment(vl)->per_step();
  std::map<uint32_t, std::vector<uint32_t>> out;
  std::vector<uint64_t> pos(N);
  std::vector<uint32_t> ids(N);
  std::vector<uint8_t> src(N);
  for (uint64_t t = 0; t < steps; ++t) {
    for (uint32_t j = 0; j < N; ++j) pos[j] = t * N + j;
    job.DrawSamples(vl, pos.data(), N, ids.data(), src.data());
    for (uint32_t j = 0; j < N; ++j) {
      auto& v = out[src[j]];
      EXPECT_EQ(v.size(),
                m.Before(vl, src[j], t) + std::count(src.begin(), src.begin() + j, src[j]))
          << "step " << t;
      v.push_back(ids[j]);
    }
    if (by_step) by_step->push_back(ids);
  }
  return out;
}

TEST(MixtureTest, ExactlyOncePerSourceEpoch) {
  MixtureDatasetOptions o;
  o.samples_per_shard = 40;
  o.sources = {{"tiny", 40, 0}, {"mid", 2000, 0}, {"big", 6000, 0}, {"wide", 1000, 0},
               {"vl", 3000, 1.0}};
  auto index = MixtureIndex(o);
  // tiny is upsampled (about 2.8 of its 40 a step, 4.3 from step 300: an
  // epoch every 9-14 steps, its blocks of varying length); big is taken
  // 1,000 at a time (windows), wide 700 of its 1,000 (windows that overlap).
  const std::string mixture =
      R"pb(mixture {
             sources { name: "tiny" shard_prefixes: "tiny/" weight: 1.1 }
             sources { name: "mid" shard_prefixes: "mid/" weight: 2.9 }
             sources { name: "big" shard_prefixes: "big/" weight: 4 max_samples_per_epoch: 1000 }
    sources { name: "wide" shard_prefixes: "wide/" weight: 1.5 max_samples_per_epoch: 700 }
             sources { name: "vl" shard_prefixes: "vl/" weight: 1 }
             stages {
               start_step: 300
               weights { source: "tiny" weight: 1.9 }
             }
           })pb";
  auto job = MakeJob(MixtureJob(4, 24, 8, mixture), index);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<std::vector<uint32_t>> by_step;
  const auto draws = DrawsBySource(**job, false, 700, &by_step);
  for (const auto& step : by_step) {
    std::set<uint32_t> distinct(step.begin(), step.end());
    EXPECT_EQ(distinct.size(), step.size()) << "a step drew a sample twice";
  }
  const Mixture& m = *(*job)->mixture();
  for (const auto& [source, samples] : draws) {
    const SourcePart& part = m.source(source).part[0];
    const uint64_t E = part.epoch_size;
    ASSERT_GT(samples.size(), 2 * E) << m.source(source).name;
    // Every complete source-epoch: E distinct samples; uncapped, all of it.
    for (uint64_t e = 0; (e + 1) * E <= samples.size(); ++e) {
      std::set<uint32_t> epoch(samples.begin() + e * E, samples.begin() + (e + 1) * E);
      EXPECT_EQ(epoch.size(), E) << m.source(source).name << " epoch " << e;
    }
    if (E < part.n && part.n % E == 0) {
      // Windows walk through every sample: n / E consecutive epochs hold
      // each sample once (when E divides n; 'wide's windows overlap).
      const uint64_t cycle = part.n;
      for (uint64_t c = 0; (c + 1) * cycle <= samples.size(); ++c) {
        std::set<uint32_t> all(samples.begin() + c * cycle, samples.begin() + (c + 1) * cycle);
        EXPECT_EQ(all.size(), part.n) << m.source(source).name << " cycle " << c;
      }
    }
  }
  // The upsampled source cycled many epochs; the capped one is a fraction
  // of itself per job epoch.
  EXPECT_GT(draws.at(0).size() / 40, 50u);
  EXPECT_LT((*job)->steps_per_epoch() * 24 * 4.0 / 10 / 6000, 1.0);
}

// The global batch of each step as (position, sample, source), sorted.
std::vector<std::tuple<uint64_t, uint32_t, uint8_t>> GlobalBatch(const StepPlanData& d) {
  std::vector<std::tuple<uint64_t, uint32_t, uint8_t>> out;
  for (const PlannedSample& ps : d.samples) {
    if (ps.piece == 0) out.emplace_back(ps.position | uint64_t{ps.vl} << 63, ps.sample, ps.source);
  }
  std::sort(out.begin(), out.end());
  return out;
}

const char* kThreeMixture = R"pb(mixture {
                                   sources { name: "ocr" shard_prefixes: "ocr/" weight: 3 }
                                   sources { name: "charts" shard_prefixes: "charts/" weight: 2 }
                                   sources { name: "text" shard_prefixes: "text/" weight: 5 }
                                   stages {
                                     start_step: 6
                                     weights { source: "charts" weight: 7 }
                                   }
                                 })pb";

TEST(MixtureTest, SameGlobalBatchesAtTwoWorldSizes) {
  auto index = MixtureIndex(ThreeSources());
  auto small = MakeJob(MixtureJob(8, 48, 16, kThreeMixture), index);
  auto large = MakeJob(MixtureJob(16, 48, 16, kThreeMixture), index);
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(large.ok()) << large.status();
  Planner a(*small), b(*large);
  StepPlanData da, db;
  for (uint64_t step = 0; step < 20; ++step) {
    ASSERT_TRUE(a.Plan(step, &da).ok());
    ASSERT_TRUE(b.Plan(step, &db).ok());
    EXPECT_EQ(GlobalBatch(da), GlobalBatch(db)) << "step " << step;
    EXPECT_EQ(da.world_size, 8u);
    EXPECT_EQ(db.world_size, 16u);
  }
}

// Hashes of steps planned in order, against a fresh job and planner asked
// for each step alone (a resumed or restarted packer), with deferral.
TEST(MixtureTest, ResumeAtAnyStepGivesTheSamePlans) {
  auto index = MixtureIndex(ThreeSources());
  // Tight sequences: steps defer samples, so the recovery of the queue
  // entering a step is exercised too.
  const std::string config =
      MixtureJob(4, 54, 20, kThreeMixture, "overflow { max_deferred_steps: 16 }");
  const std::string tight = absl::StrReplaceAll(config, {{"seq_len: 8192", "seq_len: 4096"}});
  auto job = MakeJob(tight, index);
  ASSERT_TRUE(job.ok()) << job.status();
  Planner planner(*job);
  StepPlanData d;
  std::vector<std::string> hashes;
  uint64_t deferred = 0;
  for (uint64_t step = 0; step < 24; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok()) << step;
    deferred += d.overflow.deferred_out;
    ASSERT_TRUE(AuditPlanAgainstJob(**job, d).ok()) << AuditPlanAgainstJob(**job, d);
    v1::StepPlan plan;
    ASSERT_TRUE(BuildStepPlan(**job, d, {}, &plan).ok());
    hashes.push_back(PlanHash(&plan));
  }
  EXPECT_GT(deferred, 0u) << "the job should defer for this test to cover the queue";
  for (uint64_t step : {23ull, 1ull, 6ull, 7ull, 15ull}) {
    auto fresh = MakeJob(tight, index);
    ASSERT_TRUE(fresh.ok());
    Planner p(*fresh);
    ASSERT_TRUE(p.Plan(step, &d).ok()) << step;
    v1::StepPlan plan;
    ASSERT_TRUE(BuildStepPlan(**fresh, d, {}, &plan).ok());
    EXPECT_EQ(PlanHash(&plan), hashes[step]) << "step " << step;
  }
}

TEST(MixtureTest, AddingAStageLeavesEarlierStepsAsTheyWere) {
  auto index = MixtureIndex(ThreeSources());
  const std::string before = MixtureJob(4, 24, 8, kThreeMixture);
  std::string later = kThreeMixture;
  later.insert(later.rfind('}'), " stages { start_step: 9 weights { source: 'ocr' weight: 9 } }\n");
  auto a = MakeJob(before, index);
  auto b = MakeJob(MixtureJob(4, 24, 8, later), index);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  Planner pa(*a), pb(*b);
  StepPlanData da, db;
  bool differs = false;
  for (uint64_t step = 0; step < 14; ++step) {
    ASSERT_TRUE(pa.Plan(step, &da).ok());
    ASSERT_TRUE(pb.Plan(step, &db).ok());
    if (step < 9) {
      EXPECT_EQ(GlobalBatch(da), GlobalBatch(db)) << "step " << step;
    } else {
      differs |= GlobalBatch(da) != GlobalBatch(db);
    }
  }
  EXPECT_TRUE(differs);
  // What drew the steps before 9 is the same; the new stage has its own.
  const auto& ha = (*a)->mixture()->history();
  const auto& hb = (*b)->mixture()->history();
  ASSERT_EQ(hb.size(), ha.size() + 1);
  for (size_t i = 0; i < ha.size(); ++i) EXPECT_EQ(ha[i], hb[i]);
}

TEST(MixtureTest, PlansPassTheAuditAndCarryTheirSources) {
  auto index = MixtureIndex(ThreeSources());
  auto job = MakeJob(MixtureJob(4, 24, 8, kThreeMixture), index);
  ASSERT_TRUE(job.ok()) << job.status();
  Planner planner(*job);
  StepPlanData d;
  std::map<std::string, uint64_t> seen;
  for (uint64_t step = 0; step < 12; ++step) {
    ASSERT_TRUE(planner.Plan(step, &d).ok());
    ASSERT_TRUE(AuditPlanAgainstJob(**job, d).ok()) << AuditPlanAgainstJob(**job, d);
    ASSERT_TRUE(CheckPlannedStep(d).ok()) << CheckPlannedStep(d);
    for (const PlannedSample& ps : d.samples) {
      const std::string name = (*job)->source_name(ps.source);
      ++seen[name];
      // A sample's source holds it: its key names the source's directory.
      EXPECT_EQ((*job)->index().key(ps.sample).substr(0, name.size()), name);
    }
    v1::StepPlan plan;
    ASSERT_TRUE(BuildStepPlan(**job, d, {}, &plan).ok());
    for (const v1::SampleInfo& s : plan.samples()) {
      ASSERT_TRUE(s.has_source());
      EXPECT_EQ((*job)->index().key(static_cast<uint32_t>(s.sample_id())).substr(0, 3),
                (*job)->source_name(s.source()).substr(0, 3));
    }
  }
  EXPECT_EQ(seen.size(), 3u);
}

}  // namespace
}  // namespace tutti::packer
