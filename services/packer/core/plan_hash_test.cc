// Pins the identity hashes of the plans of a set of jobs: every strategy,
// colocated and post-balanced (fast, padded, ilp, restricted staging), a
// three-stage curriculum with a seq_len change, audio, and several world
// sizes. A refactoring of the planning core must leave every hash as it is;
// a change that alters planning on purpose re-pins here and says why.
// Re-pinned once: step 9 of the two W64 jobs spans the VL stream's epoch
// boundary, and exactly-once sampling (sampler.h) draws it without repeats.
//
// TUTTI_PRINT_PLAN_HASHES=1 prints the table as C++ to paste below.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rng.h"
#include "gtest/gtest.h"
#include "services/packer/bench/staging.h"
#include "services/packer/core/planner.h"
#include "services/packer/plan_proto.h"
#include "services/packer/testing/jobs.h"

namespace tutti::packer {
namespace {

using testing::MakeJob;

// The pinned dataset, built here (not by a generator that may change):
// 6,000 samples in 60 shards, 20% VL with 1-2 images up to 1.5 MP, a fifth
// of them with an audio clip.
std::shared_ptr<const Index> PinIndex() {
  static auto* index = new std::shared_ptr<const Index>([] {
    Rng rng(11);
    IndexWriter w;
    w.SetSourceDir("pinned");
    for (uint32_t s = 0; s < 6000; ++s) {
      if (s % 100 == 0) {
        EXPECT_TRUE(w.AddShard(absl::StrCat("pin-", s / 100, ".tar"), uint64_t{100} << 30, 0).ok());
      }
      const bool vl = rng.Bernoulli(0.2);
      const uint32_t text = static_cast<uint32_t>(
          std::clamp(rng.LogNormal(vl ? 80 : 400, 0.8), 1.0, vl ? 1500.0 : 3900.0));
      const uint64_t base = uint64_t{s % 100} << 30;
      MemberInput json{MemberKind::kJson, "json", base + 512, uint64_t{text} * 6 + 16};
      std::vector<MemberInput> media;
      uint64_t off = json.offset + json.size + 1024;
      if (vl) {
        const uint32_t images = static_cast<uint32_t>(rng.Between(1, 2));
        for (uint32_t k = 0; k < images; ++k) {
          const double area = rng.LogUniform(2e4, 1.5e6);
          const double aspect = rng.LogUniform(0.5, 2.0);
          MemberInput m;
          m.kind = MemberKind::kJpeg;
          m.ext = absl::StrCat(k, ".jpg");
          m.width = static_cast<uint32_t>(std::max(28.0, std::sqrt(area * aspect)));
          m.height = static_cast<uint32_t>(std::max(28.0, area / m.width));
          m.offset = off;
          m.size = uint64_t{m.width} * m.height / 4 + 1024;
          off += m.size + 1024;
          media.push_back(m);
        }
        if (rng.Bernoulli(0.2)) {
          MemberInput a;
          a.kind = MemberKind::kWav;
          a.ext = "wav";
          a.offset = off;
          a.audio_ms = static_cast<uint32_t>(rng.Between(1000, 20000));
          a.size = uint64_t{a.audio_ms} * 32 + 44;
          media.push_back(a);
        }
      }
      EXPECT_TRUE(w.AddSample(absl::StrCat("k", s), text, &json, media).ok());
    }
    auto ix = Index::FromString(w.Finish(), "pinned.idx");
    EXPECT_TRUE(ix.ok()) << ix.status();
    return *ix;
  }());
  return *index;
}

// A job of `world` ranks (2 per node) with a three-stage curriculum.
std::string JobText(uint32_t world, const std::string& packing, const std::string& post,
                    uint32_t img_cap = 0) {
  return absl::StrCat(R"pb(
                        seed: 5 world_size:)pb",
                      world, R"pb(
                        ranks_per_node: 2
                        batch { text_samples_per_step:)pb",
                      6 * world, R"pb(
                        vl_samples_per_step:)pb",
                      2 * world, R"pb(
                        grad_accum: 2
                        text_micro_batch: 2
                        vl_micro_batch: 1
                        text_vl_ratio: "2:1"
                        max_patches_per_chunk: 4096
                        img_cap_tokens:)pb",
                      img_cap, R"pb(
                        }
                        curriculum { start_step: 0 max_pixels: 262144 seq_len: 4096 }
    curriculum { start_step: 3 max_pixels: 1003520 seq_len: 8192 }
    curriculum { start_step: 6 max_pixels: 2007040 seq_len: 8192 }
  )pb",
                      packing, " ", post);
}

struct PinCase {
  std::string name;
  std::string config;
  bool restricted_staging = false;
};

std::vector<PinCase> Cases() {
  std::vector<PinCase> cases;
  for (uint32_t w : {4u, 16u}) {
    const std::string ws = absl::StrCat("W", w, " ");
    cases.push_back({ws + "greedy", JobText(w, "packing { strategy: 'greedy' }", "")});
    cases.push_back(
        {ws + "seed-v1 N=2", JobText(w, "packing { strategy: 'seed-v1' open_bins: 2 }", "")});
    cases.push_back(
        {ws + "seed-v2 N=4", JobText(w, "packing { strategy: 'seed-v2' open_bins: 4 }", "")});
    cases.push_back({ws + "tutti", JobText(w, "packing { strategy: 'tutti' }", "")});
    cases.push_back({ws + "tutti img_cap", JobText(w, "packing { strategy: 'tutti' }", "", 4000)});
    cases.push_back({ws + "post fast", JobText(w, "", "post_balancing { enabled: true }")});
    cases.push_back(
        {ws + "post padded", JobText(w, "", "post_balancing { enabled: true padded: true }")});
    cases.push_back(
        {ws + "post restricted", JobText(w, "", "post_balancing { enabled: true }"), true});
  }
  cases.push_back(
      {"W4 post ilp", JobText(4, "", "post_balancing { enabled: true rearrangement: 'ilp' }")});
  cases.push_back({"W64 tutti", JobText(64, "packing { strategy: 'tutti' }", "")});
  cases.push_back({"W64 post fast", JobText(64, "", "post_balancing { enabled: true }")});
  return cases;
}

constexpr uint64_t kSteps[] = {0, 1, 2, 3, 5, 6, 9};

// The hash of each pinned step's plan, joined.
std::string HashesOf(const PinCase& c) {
  auto job = MakeJob(c.config, PinIndex());
  EXPECT_TRUE(job.ok()) << c.name << ": " << job.status();
  if (!job.ok()) return "";
  ShardsOnNodes staging((*job)->index().num_shards(), (*job)->world_size() / 2);
  Planner planner(*job, c.restricted_staging ? &staging : nullptr);
  std::string out;
  StepPlanData data;
  for (uint64_t step : kSteps) {
    absl::Status s = planner.Plan(step, &data);
    v1::StepPlan plan;
    if (s.ok()) s = BuildStepPlan(**job, data, {}, &plan);
    absl::StrAppend(&out, out.empty() ? "" : " ", s.ok() ? PlanHash(&plan) : "error");
  }
  return out;
}

struct Pinned {
  const char* name;
  const char* hashes;
};

// clang-format off
// Re-pinned when plans began to carry DocSlot.images and RankPlan.plan_version
// (additive fields; with them cleared every plan hashes as before).
constexpr Pinned kPinned[] = {
    {"W4 greedy",
     "1fe3c04d0b63b3f5 ea703ccdd9234663 09140b00ed9df15d f7a274e93c433ca0 4a71553d2151e87a 49c5c5734636b971 05eeaf4301f8e982"},
    {"W4 seed-v1 N=2",
     "4d4b0187c9ed81f2 724b7651288fe0f9 2e0b79cc4d46d560 70768f5e9a2cfa02 6d668004150da15a 2bf8d27f210f343e 6a8a7395a07459db"},
    {"W4 seed-v2 N=4",
     "3b30b189db0518fc a793b383fccec8a1 0490ada3e049bbd1 2a5565b7d3aa0102 78af6bae6ff88688 e2e5337624885797 8b14186a878e8e35"},
    {"W4 tutti",
     "72de673f4a56c44c 40f7ae9d10b08b1d 8440592f60c79755 eca81a7cb267dc9a 4980e42ee8b6c872 c4e5943bf8d080d6 0473ce6666ee90c8"},
    {"W4 tutti img_cap",
     "f8bd375bc0359428 92162265c25107e5 b088cc52540f0228 37e60f0c6929c9ea d567590574517559 1816a8ac2423bc41 161fbe9d7482e033"},
    {"W4 post fast",
     "a1d5474b32d9a60f 54eab1292b8c65a6 78def6534b8d8cfd 59a83d6bf262c99d da028cd2987a9949 93ab35dadfce9990 18987f1976f0b67a"},
    {"W4 post padded",
     "1bd360eef226ebd9 e18650a401460e23 c8202eec51d346ff c0942b2fcf67572d dcd534f606891eca fdb3a89ebe9b41a8 363124f6b2191878"},
    {"W4 post restricted",
     "9a3111e2eca733a4 ffb506437d1db724 3b38cf1d830949dd d54f5f9842d1a272 17ad8a29417115e4 4d90af28bcf814b8 f14078594116888c"},
    {"W16 greedy",
     "69231017311b66cb 632229c39d9a2025 931de83be481c265 5c700184244262a7 e670f0848bf4bccf 8aefa5c70a674e0a f61e267facde9d94"},
    {"W16 seed-v1 N=2",
     "27d175711870061e 9d046a75da468a1d 885e72eaee9ffc72 920752699f958861 13d7fa3866127e72 71bcfbc3bf6f566b ac00d1316836c5fa"},
    {"W16 seed-v2 N=4",
     "eeaefef2d162f8c2 162385be1e434f32 3030f2d613ed4454 613a7a19dc23982b 1e8885e90885a3c9 0529b3cb121cf366 96567caa738b5104"},
    {"W16 tutti",
     "9385d86e2a07dd74 18a0e34fbc852841 5970332247a1ebe4 c8c3ccffd5cbd6bd 8e648b09bdf1c440 f8d72f395f6b6ad5 12f7c62abc5a9970"},
    {"W16 tutti img_cap",
     "341b51808d99549a 24fcb1a880d97aa6 98c7cb02861613c4 413acf1e5c32d55c dd1dca56ee88851f 13cc6229b47027c5 a2bd1f8f0c1040d5"},
    {"W16 post fast",
     "44f4cf49c6b907b7 9fd2d850e25e1261 bf11206d03391740 aa07f5db66f24686 9a634908100c9310 e4c8cd115414c997 d4d2115d6255304e"},
    {"W16 post padded",
     "bdcdec47711a0a0b 586300880a5ee2e7 3775b6a8e73f9565 4101c25f24ef6774 13ec9777fbce0051 dfa07420bf5508b1 73a2b09878b3f255"},
    {"W16 post restricted",
     "0c5203f729640d13 79286b167e1aa201 0c0b28f9940a6198 f8dffb3d91552fe8 e55ce5905da7be84 e87c8a7ad99d17fb ab1c010515e461ea"},
    {"W4 post ilp",
     "c22b809563daa5f4 8c19c02a4193c3f4 41530189ff5485aa 5bfe9a9ef0300b47 bad56bcfb7e9d79c 375b853714d469ca e9441fbf71f8e980"},
    {"W64 tutti",
     "d746a0e6f78f093f 12dcb14c161502d3 a030e4c03ffb473e 1f3a6037741e24a3 4f759feae8239a5f 08a90a698260659b 7055423b23e47547"},
    {"W64 post fast",
     "1d154d7e86f2dc90 c276588e5956a833 da28adb4de7775ec 124c7038aae30723 97cdde0f82491a65 736fa01c4fa2ffaa 92977d2e669d5331"},
};
// clang-format on

TEST(PlanHashTest, PlansOfThePinnedJobsAreUnchanged) {
  const std::vector<PinCase> cases = Cases();
  const bool print = std::getenv("TUTTI_PRINT_PLAN_HASHES") != nullptr;
  if (print) {
    for (const PinCase& c : cases) {
      std::printf("    {\"%s\",\n     \"%s\"},\n", c.name.c_str(), HashesOf(c).c_str());
    }
    return;
  }
  ASSERT_EQ(std::size(kPinned), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(cases[i].name, kPinned[i].name);
    EXPECT_EQ(HashesOf(cases[i]), kPinned[i].hashes) << cases[i].name;
  }
}

}  // namespace
}  // namespace tutti::packer
