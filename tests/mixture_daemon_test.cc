// A mixture job served by tutti-packerd and planned by `tutti plan`: the
// same plans in both, a SIGKILL and restart that clients cannot tell from
// an uninterrupted run (while samples wait, through a schedule change), the
// per-source metrics and JobInfo, the realised mixture `tutti plan` and
// `tutti simulate` print, and bad mixtures refused at load.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/packer/bench/mixture_dataset.h"
#include "services/packer/core/planner.h"
#include "services/packer/load_job.h"
#include "services/packer/plan_proto.h"
#include "tests/packer_daemon.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// Three sources; the sequences tight enough that steps defer samples; the
// mixture changes at step 6 and ramps from step 14.
constexpr char kJob[] = R"pb(
  seed: 11
  world_size: 4
  ranks_per_node: 2
  plan_window: 4
  overflow { max_deferred_steps: 16 }
  batch {
    text_samples_per_step: 54
    vl_samples_per_step: 20
    grad_accum: 2
    text_micro_batch: 2
    vl_micro_batch: 1
    text_vl_ratio: "2:1"
  }
  curriculum { start_step: 0 max_pixels: 1003520 seq_len: 4096 }
  mixture {
    sources { name: "ocr" shard_prefixes: "ocr/" weight: 3 }
    sources { name: "charts" shard_prefixes: "charts/" weight: 2 max_pixels: 200704 }
    sources { name: "text" shard_prefixes: "text/" weight: 5 }
    stages {
      start_step: 6
      weights { source: "charts" weight: 7 }
    }
    stages {
      start_step: 14
      ramp_steps: 8
      weights { source: "ocr" weight: 1 }
    }
  }
)pb";

class MixtureDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tutti_mixture_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    packer::MixtureDatasetOptions o;
    o.samples_per_shard = 250;
    o.sources = {{"ocr", 3000, 1.0}, {"charts", 1500, 1.0}, {"text", 4000, 0}};
    auto bytes = packer::MakeMixtureIndex(o);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    std::ofstream(*dir_ + "/index.idx", std::ios::binary) << *bytes;
    std::ofstream(*dir_ + "/job.textproto") << kJob;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string Config() { return *dir_ + "/job.textproto"; }
  static std::string IndexPath() { return *dir_ + "/index.idx"; }
  std::vector<std::string> Args(const std::string& listen = "127.0.0.1:0") {
    return {"--config=" + Config(), "--index=" + IndexPath(), "--listen=" + listen,
            "--metrics=127.0.0.1:0"};
  }
  static std::string Tutti(const std::string& args) {
    return Output(absl::StrCat(TUTTI_CLI, " ", args, " 2>&1"));
  }

  static std::string* dir_;
};
std::string* MixtureDaemonTest::dir_ = nullptr;

constexpr uint64_t kSteps = 26;

// The plan hashes `tutti plan --format hash` prints for [step, step + n).
std::vector<std::string> CliHashes(const std::string& out) {
  std::vector<std::string> hashes;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    if (f.size() == 3 && f[0] == "step") hashes.push_back(f[2]);
  }
  return hashes;
}

TEST_F(MixtureDaemonTest, SigkillAndRestartThroughAScheduleChangeWhileSamplesWait) {
  // In process: the steps' hashes, and a step from 4 on that samples wait into.
  auto job = packer::LoadJob(Config(), IndexPath());
  ASSERT_TRUE(job.ok()) << job.status();
  packer::Planner planner(*job);
  std::vector<std::string> local;
  uint64_t kill_at = 0;
  for (uint64_t step = 0; step < kSteps; ++step) {
    packer::StepPlanData d;
    ASSERT_TRUE(planner.Plan(step, &d).ok()) << step;
    v1::StepPlan plan;
    ASSERT_TRUE(packer::BuildStepPlan(**job, d, {}, &plan).ok());
    local.push_back(packer::PlanHash(&plan));
    if (kill_at == 0 && step >= 7 && !d.deferred_in.empty()) kill_at = step;
  }
  ASSERT_GT(kill_at, 0u) << "the job never defers after its first schedule change";

  std::vector<std::string> uninterrupted;
  {
    Daemon d(*dir_, "reference", Args());
    ASSERT_TRUE(d.WaitReady()) << d.err();
    for (v1::StepPlan& p : StreamPlans(d.Stub().get(), 0, kSteps)) {
      uninterrupted.push_back(packer::PlanHash(&p));
    }
  }
  EXPECT_EQ(uninterrupted, local);

  std::vector<std::string> seen;
  std::string address;
  {
    Daemon d(*dir_, "victim", Args());
    ASSERT_TRUE(d.WaitReady()) << d.err();
    address = d.address();
    for (v1::StepPlan& p : StreamPlans(d.Stub().get(), 0, kSteps, kill_at)) {
      seen.push_back(packer::PlanHash(&p));
    }
    d.Signal(SIGKILL);  // samples wait, the mixture changed: all of it in memory, lost
    ASSERT_TRUE(d.Exited(10000));
  }
  ASSERT_EQ(seen.size(), kill_at);
  Daemon again(*dir_, "restarted", Args(address));
  ASSERT_TRUE(again.WaitReady()) << again.err();
  for (v1::StepPlan& p : StreamPlans(again.Stub().get(), kill_at, kSteps)) {
    seen.push_back(packer::PlanHash(&p));
  }
  EXPECT_EQ(seen, uninterrupted);

  // `tutti plan` at any step, fresh each time: the daemon's plans.
  for (uint64_t step : {uint64_t{0}, kill_at, uint64_t{15}, kSteps - 1}) {
    const std::string out = Tutti(absl::StrCat("plan --config=", Config(), " --index=", IndexPath(),
                                               " --format=hash --step=", step));
    const std::vector<std::string> h = CliHashes(out);
    ASSERT_EQ(h.size(), 1u) << out;
    EXPECT_EQ(h[0], uninterrupted[step]) << "step " << step;
  }
}

TEST_F(MixtureDaemonTest, JobInfoMetricsAndSummaries) {
  Daemon d(*dir_, "serve", Args());
  ASSERT_TRUE(d.WaitReady()) << d.err();
  auto stub = d.Stub();
  grpc::ClientContext c;
  v1::JobInfo info;
  ASSERT_TRUE(stub->GetJob(&c, v1::GetJobRequest(), &info).ok());
  ASSERT_EQ(info.sources_size(), 3);
  EXPECT_EQ(info.sources(1).name(), "charts");
  EXPECT_EQ(info.sources(1).vl_samples(), 1500u);
  ASSERT_EQ(info.mixture_history_size(), 3);
  EXPECT_EQ(info.mixture_history(1).start_step(), 6u);
  EXPECT_EQ(info.mixture_history(2).start_step(), 14u);

  const std::vector<v1::StepPlan> plans = StreamPlans(stub.get(), 0, 8);
  ASSERT_EQ(plans.size(), 8u);
  for (const v1::StepPlan& p : plans) {
    for (const v1::SampleInfo& s : p.samples()) {
      ASSERT_TRUE(s.has_source());
      ASSERT_LT(s.source(), 3u);
      EXPECT_EQ(s.key().substr(0, info.sources(s.source()).name().size()),
                info.sources(s.source()).name());
      EXPECT_EQ(s.max_pixels(), s.source() == 1 ? 200704u : 0u);
    }
  }
  const std::string metrics = HttpGet(d.metrics_port(), "/metrics");
  for (const char* name : {"ocr", "charts", "text"}) {
    EXPECT_THAT(metrics, HasSubstr(absl::StrCat("tutti_packer_source_samples_total{source=\"", name,
                                                "\"}")));
    EXPECT_THAT(metrics,
                HasSubstr(absl::StrCat("tutti_packer_source_epochs{source=\"", name, "\"}")));
  }

  // `tutti plan --summary`: the realised mixture per stage against its target.
  std::string out = Tutti(
      absl::StrCat("plan --config=", Config(), " --index=", IndexPath(), " --steps=20 --summary"));
  EXPECT_THAT(out, HasSubstr("the sources' weights (steps 0-5)"));
  EXPECT_THAT(out, HasSubstr("mixture.stages[0] from step 6 (steps 6-13)"));
  EXPECT_THAT(out, HasSubstr("mixture.stages[1] from step 14, a ramp of 8 steps (steps 14-19)"));
  EXPECT_THAT(out, HasSubstr("charts"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("rank  node")));  // no per-step tables
  // Steps 0-5: charts has 2 of the VL sources' weight 5: 40.00% of the VL draw.
  EXPECT_THAT(out, ::testing::ContainsRegex("charts +VL +[0-9]+ +[0-9.]+% +40.00% +48 "));
  out = Tutti(absl::StrCat("simulate --config=", Config(), " --index=", IndexPath(), " --steps=8"));
  EXPECT_THAT(out, HasSubstr("mixture (per stage"));
  EXPECT_THAT(out, ::testing::ContainsRegex("text +text +[0-9]+ +100.00% +100.00% +324 "));
  out = Tutti(
      absl::StrCat("simulate --config=", Config(), " --index=", IndexPath(), " --steps=8 --json"));
  EXPECT_THAT(out, HasSubstr("\"source\": \"ocr\", \"stream\": \"vl\""));
}

TEST_F(MixtureDaemonTest, BadMixturesAreRefusedAtLoad) {
  const std::string bad = *dir_ + "/bad.textproto";
  std::string text = kJob;
  const std::string from = "start_step: 14";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "start_step: 5");
  std::ofstream(bad) << text;
  const std::string out =
      Tutti(absl::StrCat("plan --config=", bad, " --index=", IndexPath(), " --step=0"));
  EXPECT_THAT(out, HasSubstr("exit"));
  EXPECT_THAT(out, HasSubstr("mixture.stages[1].start_step 5 is not after "
                             "mixture.stages[0].start_step 6"));
  Daemon d(*dir_, "bad",
           {"--config=" + bad, "--index=" + IndexPath(), "--listen=127.0.0.1:0",
            "--metrics=127.0.0.1:0"});
  ASSERT_TRUE(d.Exited(20000));
  EXPECT_NE(d.ExitCode(), 0);
  EXPECT_THAT(d.err(), HasSubstr("mixture.stages[1].start_step"));
}

}  // namespace
}  // namespace tutti
