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
constexpr Pinned kPinned[] = {
    {"W4 greedy",
     "8ca5592d3573f861 90a8e6dc0aa2b7f0 8a4394d9b36234e6 1580aa7e7186be3e 4fa93e2d1a1dfed4 77d8df20cd8cc9cc 4885810b0c0cf4b3"},
    {"W4 seed-v1 N=2",
     "ce7105b2c20c5bda 1fca577b89de6358 2b1efdb21af1f973 4b1ce78aafdc3f5b 3ce7af8c11726c8c ba615807d09c02b2 11de4f618b028bd6"},
    {"W4 seed-v2 N=4",
     "caf312d626ba5f83 6972f2d3e7883303 74ff3a712ed2f544 1ca9e47a16ec6def b1888735e3b3cc05 4107f1fbc69a76e7 07dbd8e14113afa0"},
    {"W4 tutti",
     "88e9407beb403373 11e659541f9f0f94 2749bc65f108f8c8 a2c6eb2dbf73531c 8a7cae539ae703c1 0241072df4627435 e14e839405c779c9"},
    {"W4 tutti img_cap",
     "870479d7e4ad0adf 6cd013b762a94577 f292fd7324d3b9de 94ec10eb8959a8da 7e8f60036e14cd91 4392ca00b5b1b918 22729de5c6fb67b8"},
    {"W4 post fast",
     "73fccb6cc2dc7288 b0db59d1008da904 40a8478bb56ee736 8ae42f02f7e46ff6 ec496dd386a0a9c4 3405b09fd5c6566b a9de145ee5f3f9bd"},
    {"W4 post padded",
     "34ca2e677be05a98 1d0c0d65f042cbc5 2aef517e45508cd3 fd25ad529041e60d 760ff1509632fa16 2372a5023514ea75 8feda76d6bf25bc5"},
    {"W4 post restricted",
     "2f912780582158fb 34165a2b104a0a8e 1eee68fdc07c29eb 39e7cb66ae04302a 752615b6c4f03332 40b8a7353167cf39 d3f71a6209d0aa3b"},
    {"W16 greedy",
     "209ccb5ced475f63 f43268b2299585df ae099afdc75ee526 ebcd0e18bdedc15d 14e9a9c5452d6fbe bd53b1aeb05c62ef 576f9881c783d795"},
    {"W16 seed-v1 N=2",
     "301a5be259e0a1dd 6c20b6090d13426f 60e95cbcde665254 82712527533343ff b7b27a00b31a4d07 5331ac9067f54217 48b4c69e07df28ec"},
    {"W16 seed-v2 N=4",
     "d21643be7267ae56 3019948a7dbb39f1 7712f1f670ae89c9 4f1a1a674cca1653 02966fc5be057f8e 33b9f436097dc1d3 742682e85d3d6e59"},
    {"W16 tutti",
     "84dcc9326b378135 0a875d6353328ef3 c4b938ac88bd15a5 04d9315b7e8049be 4e851936eb61c5cb 05e3f672ac1951f7 633a0b7529bf1cdf"},
    {"W16 tutti img_cap",
     "40f85c45af131442 06f3eb175f463887 475e48150b5a651c d96112c4a3386a21 5bc5d97ffe210582 6cf7eb32c50d4cb7 876e7b87cdeb6c2d"},
    {"W16 post fast",
     "413774a71b791a96 9fd47e3270268947 a9ae2bfc677d8654 491df21c714be0b7 40e56935f7272291 88963e8fbafad07b da3a5bb7a1335a20"},
    {"W16 post padded",
     "b69c66c5ef900a0c c3051524490ce169 e96dac6126a259f1 2c42e802feab59f3 7a2b392ebbdf300a d2ace7a13643390a 52731910c8b07013"},
    {"W16 post restricted",
     "e57cc465f22b8a49 7e0dbd440d1efbab 0258941982f6e1fc 2749ec042372cf5f 6004bec92f8fa349 5845d5868db94434 0e26d30adcfea9d9"},
    {"W4 post ilp",
     "69c2b785523d0126 ecd3e674a4891726 2b89e0b29f2f1e64 f1cbdc2b510d4917 c5c54450cbc51dab 9f56ffd167c0fcd3 939d9da1f853d85c"},
    {"W64 tutti",
     "5b67ba72ae359286 f1e261969642e112 bc40200d94f0ad84 a3878240c3280cb3 93348c7c1e0ea5aa cb53948e10506a25 7550b05b30fc6d5f"},
    {"W64 post fast",
     "14d54981fbab102f d7815acc5680e88c 7695f112eb203244 87a8b59fc730aa0d 3d8ad0631088cd91 01e35641aaa604dc b91d6eb8fb0c0968"},
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
