// tutti-packerd as a real process on loopback: serving, errors with their
// codes, metrics, clean shutdown, a port in use, and a SIGKILL + restart
// that clients cannot tell from an uninterrupted run, also while samples wait
// in the deferral queue.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "gtest/gtest.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/planner.h"
#include "services/packer/index/index.h"
#include "services/packer/load_job.h"
#include "services/packer/plan_proto.h"
#include "tests/packer_daemon.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti {
namespace {

namespace fs = std::filesystem;

class PackerDaemonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/tutti_packerd_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    packer::SyntheticOptions o;
    o.samples = 3000;
    o.text_median_tokens = 400;
    o.max_text_tokens = 4000;
    o.small_max_pixels = 1e6;
    o.big_max_pixels = 4e6;
    o.fit_seq_len = 8192;
    o.fit_max_pixels = 1003520;
    auto bytes = packer::MakeSyntheticIndex(o);
    ASSERT_TRUE(bytes.ok());
    std::ofstream(*dir_ + "/index.idx", std::ios::binary) << *bytes;
    std::ofstream(*dir_ + "/job.textproto") << R"pb(
      seed: 11
      world_size: 4
      ranks_per_node: 2
      epochs: 2
      plan_window: 4
      batch {
        text_samples_per_step: 24
        vl_samples_per_step: 8
        grad_accum: 2
        text_micro_batch: 2
        vl_micro_batch: 1
        text_vl_ratio: "2:1"
      }
      curriculum { start_step: 0 max_pixels: 262144 seq_len: 8192 }
      curriculum { start_step: 5 max_pixels: 1003520 seq_len: 8192 }
      post_balancing { enabled: true }
    )pb";
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  std::vector<std::string> Args(const std::string& listen = "127.0.0.1:0") {
    return {"--config=" + *dir_ + "/job.textproto", "--index=" + *dir_ + "/index.idx",
            "--listen=" + listen, "--metrics=127.0.0.1:0"};
  }

  // Plan hashes of [start, end) read through StreamPlans (stops after
  // `stop_after` plans when set).
  static std::vector<std::string> Stream(v1::Packer::Stub* stub, uint64_t start, uint64_t end,
                                         size_t stop_after = SIZE_MAX, uint32_t world = 4) {
    std::vector<std::string> hashes;
    for (v1::StepPlan& plan : StreamPlans(stub, start, end, stop_after, world)) {
      EXPECT_EQ(plan.step(), start + hashes.size());
      hashes.push_back(packer::PlanHash(&plan));
    }
    return hashes;
  }

  static std::string* dir_;
};
std::string* PackerDaemonTest::dir_ = nullptr;

TEST_F(PackerDaemonTest, ServesPlansMetricsAndStopsCleanly) {
  Daemon d(*dir_, "serve", Args());
  ASSERT_TRUE(d.WaitReady()) << d.err();
  auto stub = d.Stub();

  grpc::ClientContext c1;
  v1::JobInfo info;
  ASSERT_TRUE(stub->GetJob(&c1, v1::GetJobRequest(), &info).ok());
  EXPECT_EQ(info.config().world_size(), 4u);
  EXPECT_EQ(info.samples(), 3000u);
  EXPECT_GT(info.steps_per_epoch(), 0u);
  // epochs: 2, each stream cycling on its own: the steps until every sample
  // of both streams was drawn twice (24 text and 8 VL samples a step).
  auto steps = [](uint64_t n, uint64_t per) { return (2 * n + per - 1) / per; };
  EXPECT_EQ(info.total_steps(),
            std::max(steps(info.text_samples(), 24), steps(info.vl_samples(), 8)));
  EXPECT_LE(info.total_steps(), 2 * info.steps_per_epoch());

  // The served plan is the planning core's plan, byte for byte.
  auto job = packer::LoadJob(*dir_ + "/job.textproto", *dir_ + "/index.idx");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(info.config_fingerprint(), (*job)->fingerprint());
  packer::Planner planner(*job);
  packer::StepPlanData data;
  ASSERT_TRUE(planner.Plan(7, &data).ok());
  v1::StepPlan local;
  ASSERT_TRUE(packer::BuildStepPlan(**job, data, {1, 2}, &local).ok());

  grpc::ClientContext c2;
  v1::GetPlanRequest req;
  req.set_step(7);
  req.add_ranks(2);
  req.add_ranks(1);
  req.set_world_size(4);
  req.set_config_fingerprint(info.config_fingerprint());
  v1::StepPlan served;
  grpc::Status s = stub->GetPlan(&c2, req, &served);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(packer::PlanHash(&served), packer::PlanHash(&local));
  ASSERT_EQ(served.ranks_size(), 2);
  EXPECT_EQ(served.ranks(0).rank(), 1u);

  EXPECT_EQ(Stream(stub.get(), 0, 3).size(), 3u);

  grpc::ClientContext c3;
  v1::StepTimingReport report;
  report.set_step(7);
  report.set_rank(1);
  auto* ph = report.add_phases();
  ph->set_phase("llm");
  ph->set_seconds(0.8);
  v1::ReportTimingResponse rr;
  EXPECT_TRUE(stub->ReportTiming(&c3, report, &rr).ok());

  const std::string metrics = HttpGet(d.metrics_port(), "/metrics");
  for (const char* name :
       {"tutti_packer_plan_seconds_bucket", "tutti_packer_samples_planned_total",
        "tutti_packer_plan_window_depth", "tutti_packer_imbalance_ratio{phase=\"vit\"}",
        "tutti_packer_imbalance_ratio{phase=\"llm\"}",
        "tutti_packer_imbalance_before_ratio{phase=\"vit\"}",
        "tutti_packer_imbalance_before_ratio{phase=\"llm\"}",
        "tutti_packer_exchange_inter_node_bytes_count",
        "tutti_packer_exchange_intra_node_bytes_sum",
        "tutti_packer_exchange_remote_load_bytes_bucket",
        "tutti_packer_rearrangements_total{result=\"fast\"}",
        "tutti_packer_plans_served_total{rpc=\"StreamPlans\"} 3",
        "tutti_packer_timing_reports_total{result=\"accepted\"} 1",
        "tutti_packer_index_samples 3000"}) {
    EXPECT_NE(metrics.find(name), std::string::npos) << name << "\n" << metrics;
  }
  // The index is mapped (its file's bytes) and allocated next to nothing per
  // sample; the job built over it is reported beside it, and both are logged.
  const uint64_t file_bytes = std::filesystem::file_size(*dir_ + "/index.idx");
  auto MetricValue = [](const std::string& text, const std::string& name) -> std::optional<double> {
    const size_t at = text.find("\n" + name + " ");
    if (at == std::string::npos) return std::nullopt;
    return std::stod(text.substr(at + name.size() + 2));
  };
  EXPECT_EQ(MetricValue(metrics, "tutti_packer_index_bytes{memory=\"mapped\"}"),
            static_cast<double>(file_bytes));
  EXPECT_LT(MetricValue(metrics, "tutti_packer_index_bytes{memory=\"heap\"}").value_or(1e9), 3000);
  EXPECT_NEAR(
      MetricValue(metrics, "tutti_packer_memory_per_sample_bytes{memory=\"mapped\"}").value_or(0),
      file_bytes / 3000.0, 0.01);
  EXPECT_TRUE(MetricValue(metrics, "tutti_packer_job_heap_bytes").has_value());
  EXPECT_NE(d.err().find("index loaded"), std::string::npos) << d.err();
  EXPECT_NE(d.err().find("mapped_bytes_per_sample="), std::string::npos) << d.err();

  // The banner follows the port file (the daemon prints it once serving), so
  // on a busy machine it may come a moment after the port file.
  const std::string banner = absl::StrCat("tutti-packerd listening on 127.0.0.1:", d.grpc_port(),
                                          " (metrics 127.0.0.1:", d.metrics_port(), ")");
  for (int i = 0; i < 500 && d.out().find(banner) == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(d.out().find(banner), std::string::npos) << d.out();
  d.Signal(SIGTERM);
  ASSERT_TRUE(d.Exited(10000));
  EXPECT_EQ(d.ExitCode(), 0) << d.err();
}

TEST_F(PackerDaemonTest, RefusalsCarryCodesAndFixes) {
  Daemon d(*dir_, "errors", Args());
  ASSERT_TRUE(d.WaitReady()) << d.err();
  auto stub = d.Stub();
  grpc::ClientContext c0;
  v1::JobInfo info;
  ASSERT_TRUE(stub->GetJob(&c0, v1::GetJobRequest(), &info).ok());

  auto get = [&](uint64_t step, uint32_t world, std::string fp, std::vector<uint32_t> ranks) {
    grpc::ClientContext ctx;
    v1::GetPlanRequest req;
    req.set_step(step);
    req.set_world_size(world);
    req.set_config_fingerprint(fp);
    for (uint32_t r : ranks) req.add_ranks(r);
    v1::StepPlan plan;
    return stub->GetPlan(&ctx, req, &plan);
  };
  grpc::Status s = get(0, 8, "", {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("world_size 8"), std::string::npos);
  s = get(0, 0, "feedfacefeedface", {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("feedfacefeedface"), std::string::npos);
  s = get(0, 4, "", {0, 4});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("rank 4"), std::string::npos);
  s = get(info.total_steps(), 4, "", {});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(s.error_message().find(absl::StrCat("step ", info.total_steps())), std::string::npos);

  grpc::ClientContext c1;
  v1::StreamPlansRequest sreq;
  sreq.set_start_step(info.total_steps() + 3);
  auto reader = stub->StreamPlans(&c1, sreq);
  v1::StepPlan plan;
  EXPECT_FALSE(reader->Read(&plan));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::OUT_OF_RANGE);

  grpc::ClientContext c2;
  v1::StepTimingReport report;
  report.set_rank(9);
  v1::ReportTimingResponse rr;
  s = stub->ReportTiming(&c2, report, &rr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("rank 9"), std::string::npos);

  // A stream to the end of the dataset finishes with OK.
  EXPECT_EQ(Stream(stub.get(), info.total_steps() - 2, 0).size(), 2u);

  // SIGINT stops it cleanly too.
  d.Signal(SIGINT);
  ASSERT_TRUE(d.Exited(10000));
  EXPECT_EQ(d.ExitCode(), 0) << d.err();
}

TEST_F(PackerDaemonTest, PortInUseAndBadInputsExitNonZero) {
  Daemon first(*dir_, "first", Args());
  ASSERT_TRUE(first.WaitReady()) << first.err();
  Daemon second(*dir_, "second", Args(first.address()));
  ASSERT_TRUE(second.Exited(20000));
  EXPECT_NE(second.ExitCode(), 0);
  EXPECT_NE(second.err().find(first.address()), std::string::npos) << second.err();
  EXPECT_NE(second.err().find("in use"), std::string::npos) << second.err();

  Daemon no_index(*dir_, "noindex",
                  {"--config=" + *dir_ + "/job.textproto", "--index=" + *dir_ + "/missing.idx",
                   "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0"});
  ASSERT_TRUE(no_index.Exited(20000));
  EXPECT_EQ(no_index.ExitCode(), 1);
  EXPECT_NE(no_index.err().find("missing.idx"), std::string::npos) << no_index.err();
  EXPECT_NE(no_index.err().find("tutti index"), std::string::npos) << no_index.err();

  // A missing required flag is bad usage (exit 2), a missing index a runtime failure (1).
  Daemon no_config(*dir_, "noconfig", {"--listen=127.0.0.1:0", "--metrics=127.0.0.1:0"});
  ASSERT_TRUE(no_config.Exited(20000));
  EXPECT_EQ(no_config.ExitCode(), 2);
  EXPECT_NE(no_config.err().find("--config"), std::string::npos) << no_config.err();
}

// The job's identity comes from the index's content: a packer started with
// the same config and index given as a relative path, an absolute one or
// through a symlink has one fingerprint and serves the same plans, so a
// restart with another spelling is not refused by the stagers; another
// index gives another fingerprint.
TEST_F(PackerDaemonTest, TheFingerprintFollowsTheIndexContentNotItsPath) {
  const fs::path absolute = fs::absolute(*dir_ + "/index.idx");
  const fs::path link = *dir_ + "/link.idx";
  fs::remove(link);
  fs::create_symlink(absolute, link);
  packer::SyntheticOptions o;
  o.samples = 3000;
  o.seed = 99;
  o.text_median_tokens = 400;
  o.max_text_tokens = 4000;
  o.small_max_pixels = 1e6;
  o.big_max_pixels = 4e6;
  o.fit_seq_len = 8192;
  o.fit_max_pixels = 1003520;
  auto other_bytes = packer::MakeSyntheticIndex(o);
  ASSERT_TRUE(other_bytes.ok());
  const std::string other = *dir_ + "/other.idx";
  std::ofstream(other, std::ios::binary) << *other_bytes;

  struct Served {
    std::string fingerprint, plan;
  };
  auto serve = [&](const std::string& name, const std::string& index) -> Served {
    Daemon d(*dir_, name,
             {"--config=" + *dir_ + "/job.textproto", "--index=" + index, "--listen=127.0.0.1:0",
              "--metrics=127.0.0.1:0"});
    EXPECT_TRUE(d.WaitReady()) << d.err();
    grpc::ClientContext ctx;
    v1::JobInfo info;
    EXPECT_TRUE(d.Stub()->GetJob(&ctx, v1::GetJobRequest(), &info).ok());
    const std::vector<std::string> plans = Stream(d.Stub().get(), 3, 4);
    return {info.config_fingerprint(), plans.empty() ? "" : plans[0]};
  };
  const Served by_absolute = serve("absolute", absolute.string());
  ASSERT_FALSE(by_absolute.fingerprint.empty());
  for (const std::string& spelling : {fs::relative(absolute).string(), link.string(),
                                      (fs::path(*dir_) / "." / "index.idx").string()}) {
    const Served s = serve("spelling", spelling);
    EXPECT_EQ(s.fingerprint, by_absolute.fingerprint) << spelling;
    EXPECT_EQ(s.plan, by_absolute.plan) << spelling;
  }
  EXPECT_NE(serve("other", other).fingerprint, by_absolute.fingerprint);
}

// A config value the plans would be sized by, far out of range, is refused
// at start naming the field and its range, before anything is allocated by
// it (it once made the daemon grow by ~200 MB/s without answering).
TEST_F(PackerDaemonTest, AConfigValueOutOfRangeIsRefusedAtStartNamingItsRange) {
  const std::string config = *dir_ + "/huge.textproto";
  std::ofstream(config) << R"pb(
    world_size: 4
    ranks_per_node: 2
    batch { text_samples_per_step: 24 vl_samples_per_step: 8 vl_micro_batch: 2147483647 }
  )pb";
  Daemon d(*dir_, "huge",
           {"--config=" + config, "--index=" + *dir_ + "/index.idx", "--listen=127.0.0.1:0",
            "--metrics=127.0.0.1:0"});
  ASSERT_TRUE(d.Exited(20000)) << d.err();
  EXPECT_EQ(d.ExitCode(), 1) << d.err();
  EXPECT_NE(d.err().find("batch.vl_micro_batch 2147483647 is outside its range 1..1024"),
            std::string::npos)
      << d.err();
  EXPECT_NE(d.err().find("huge.textproto"), std::string::npos) << d.err();
}

TEST_F(PackerDaemonTest, SigkillAndRestartIsInvisibleToClients) {
  const uint64_t kSteps = 12;
  std::vector<std::string> uninterrupted;
  {
    Daemon d(*dir_, "reference", Args());
    ASSERT_TRUE(d.WaitReady()) << d.err();
    uninterrupted = Stream(d.Stub().get(), 0, kSteps);
  }
  ASSERT_EQ(uninterrupted.size(), kSteps);

  std::vector<std::string> seen;
  std::string address;
  {
    Daemon d(*dir_, "victim", Args());
    ASSERT_TRUE(d.WaitReady()) << d.err();
    address = d.address();
    seen = Stream(d.Stub().get(), 0, kSteps, /*stop_after=*/5);
    d.Signal(SIGKILL);  // mid-run: plans computed ahead are lost
    ASSERT_TRUE(d.Exited(10000));
  }
  ASSERT_EQ(seen.size(), 5u);
  // The restarted packer (same address) resumes where the client is.
  Daemon again(*dir_, "restarted", Args(address));
  ASSERT_TRUE(again.WaitReady()) << again.err();
  auto rest = Stream(again.Stub().get(), seen.size(), kSteps);
  seen.insert(seen.end(), rest.begin(), rest.end());
  EXPECT_EQ(seen, uninterrupted);
}

// A config whose image cap binds: VL samples drawn so that image tokens fill
// 0.93 of batch.img_cap_tokens on average, so steps defer samples and the
// queue often stays non-empty for several steps.
std::string DeferringConfig(uint32_t vl_samples, uint32_t img_cap) {
  return absl::StrCat(R"pb(
                        seed: 11
                        world_size: 4
                        ranks_per_node: 2
                        plan_window: 4
                        batch { text_samples_per_step: 24 vl_samples_per_step:)pb",
                      vl_samples, R"pb(
                        img_cap_tokens:)pb",
                      img_cap, R"pb(
      grad_accum: 2
      text_micro_batch: 2
      vl_micro_batch: 1
      text_vl_ratio: "2:1"
    }
          curriculum { start_step: 0 max_pixels: 1003520 seq_len: 8192 }
  )pb");
}

// tutti-packerd killed (SIGKILL) while samples wait and restarted, as users
// start it: the plans after the restart are byte-identical to an
// uninterrupted run's, and across the restart each drawn sample is planned
// once.
TEST_F(PackerDaemonTest, SigkillAndRestartWhileSamplesWaitLosesAndRepeatsNothing) {
  // The cap and the VL draw from the index's image tokens at 1 MP.
  const std::string probe = *dir_ + "/probe.textproto";
  std::ofstream(probe) << DeferringConfig(8, 0);
  auto base = packer::LoadJob(probe, *dir_ + "/index.idx");
  ASSERT_TRUE(base.ok()) << base.status();
  const packer::Job& b = **base;
  double mean = 0;
  uint32_t most = 0;
  for (uint32_t s : b.vl_samples()) {
    auto c = b.coster(0).Cost(s);
    ASSERT_TRUE(c.ok());
    mean += c->image_tokens;
    most = std::max(most, c->image_tokens);
  }
  mean /= b.vl_samples().size();
  const uint32_t cap = std::max<uint32_t>(most, static_cast<uint32_t>(2.5 * mean));
  const uint32_t vl = static_cast<uint32_t>(0.93 * 4 * b.vl_seqs_per_rank() * cap / mean);
  const std::string config = *dir_ + "/defer.textproto";
  std::ofstream(config) << DeferringConfig(vl, cap);
  auto job = packer::LoadJob(config, *dir_ + "/index.idx");
  ASSERT_TRUE(job.ok()) << job.status();

  // In process: the step to kill at, the first from 4 on entered with samples
  // waiting that waited in the step before too.
  const uint64_t kSteps = 30;
  packer::Planner planner(*job);
  std::vector<std::string> local;
  uint64_t kill_at = 0;
  bool waited_before = false;
  for (uint64_t step = 0; step < kSteps; ++step) {
    packer::StepPlanData d;
    ASSERT_TRUE(planner.Plan(step, &d).ok()) << "step " << step;
    v1::StepPlan plan;
    ASSERT_TRUE(packer::BuildStepPlan(**job, d, {}, &plan).ok());
    local.push_back(packer::PlanHash(&plan));
    if (kill_at == 0 && step >= 4 && waited_before && !d.deferred_in.empty()) kill_at = step;
    waited_before = !d.deferred_in.empty();
  }
  ASSERT_GT(kill_at, 0u) << "the config never defers across two steps (vl " << vl << ", cap " << cap
                         << ")";

  const std::vector<std::string> args = {"--config=" + config, "--index=" + *dir_ + "/index.idx",
                                         "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0"};
  std::vector<std::string> uninterrupted;
  {
    Daemon d(*dir_, "defer-reference", args);
    ASSERT_TRUE(d.WaitReady()) << d.err();
    for (v1::StepPlan& p : StreamPlans(d.Stub().get(), 0, kSteps)) {
      uninterrupted.push_back(packer::PlanHash(&p));
    }
  }
  EXPECT_EQ(uninterrupted, local);

  std::vector<v1::StepPlan> seen;
  std::string address;
  {
    Daemon d(*dir_, "defer-victim", args);
    ASSERT_TRUE(d.WaitReady()) << d.err();
    address = d.address();
    seen = StreamPlans(d.Stub().get(), 0, kSteps, kill_at);
    d.Signal(SIGKILL);  // while samples wait: the queue in memory is lost
    ASSERT_TRUE(d.Exited(10000));
  }
  ASSERT_EQ(seen.size(), kill_at);
  std::vector<std::string> restarted_args = args;
  restarted_args[2] = "--listen=" + address;
  Daemon again(*dir_, "defer-restarted", restarted_args);
  ASSERT_TRUE(again.WaitReady()) << again.err();
  for (v1::StepPlan& p : StreamPlans(again.Stub().get(), kill_at, kSteps)) seen.push_back(p);
  ASSERT_EQ(seen.size(), kSteps);
  std::vector<std::string> hashes;
  uint64_t deferred = 0, waiting_at_kill = 0;
  std::map<uint64_t, int> planned;  // sample id -> times (first pieces)
  for (v1::StepPlan& p : seen) {
    hashes.push_back(packer::PlanHash(&p));
    deferred += p.stats().overflow().deferred_out();
    if (p.step() == kill_at) waiting_at_kill = p.stats().overflow().deferred_in();
    for (const auto& rank : p.ranks()) {
      for (const auto& mb : rank.micro_batches()) {
        for (const auto& seq : mb.sequences()) {
          for (const auto& doc : seq.docs()) {
            if (doc.piece() == 0) ++planned[doc.sample_id()];
          }
        }
      }
    }
  }
  EXPECT_EQ(hashes, uninterrupted);
  EXPECT_GT(deferred, 0u);
  EXPECT_GT(waiting_at_kill, 0u);
  // 30 steps draw less than an epoch of either stream: each sample at most
  // once, and every drawn sample planned except those still waiting.
  ASSERT_LT(kSteps * vl, b.vl_samples().size());
  ASSERT_LT(kSteps * 24, b.text_samples().size());
  uint64_t docs = 0;
  for (const auto& [sample, times] : planned) {
    EXPECT_EQ(times, 1) << "sample " << sample;
    docs += times;
  }
  const uint64_t still_waiting = seen.back().stats().overflow().deferred_out();
  EXPECT_EQ(docs + still_waiting, kSteps * (24 + vl));
  // And the independent checker over 300 steps (more than an epoch of VL).
  const std::string check = Output(absl::StrCat(TUTTI_CLI, " plan --config ", config, " --index ",
                                                *dir_, "/index.idx --check --quiet --steps 300"));
  EXPECT_NE(check.find("0 violations, 0 not planned"), std::string::npos) << check;
}

// The benchmark plans through the code tutti-packerd serves: for every cell
// of `tutti bench packer` (colocated strategies and post-balancing), the
// hash it computes for each step equals `tutti plan --format hash` on the
// same config and index and the hash of the plan the daemon streams.
TEST_F(PackerDaemonTest, BenchmarkPlansAreThePlansTheDaemonServes) {
  const std::string dir = *dir_ + "/bench";
  for (const char* post : {"", " --post-balancing"}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    const std::string bench = Output(absl::StrCat(
        TUTTI_CLI, " bench packer --ranks 8 --stages 1003520 --steps 3 --build-steps 0 ",
        "--strategies greedy,tutti --samples 12000 --fill 0.7 --json --hashes ", dir, post,
        " 2>/dev/null"));
    ASSERT_EQ(bench.rfind("exit", 0), std::string::npos) << bench;
    int cells = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".hashes") continue;
      ++cells;
      const std::string hashes = ReadAll(entry.path());
      ASSERT_EQ(std::count(hashes.begin(), hashes.end(), '\n'), 3) << entry.path() << hashes;
      std::string config = entry.path();
      config.replace(config.size() - 7, 7, ".textproto");
      EXPECT_EQ(Output(absl::StrCat(TUTTI_CLI, " plan --config ", config, " --index ", dir,
                                    "/index.idx --steps 3 --format hash")),
                hashes)
          << config;
      Daemon d(dir, entry.path().stem().string(),
               {"--config=" + config, "--index=" + dir + "/index.idx", "--listen=127.0.0.1:0",
                "--metrics=127.0.0.1:0"});
      ASSERT_TRUE(d.WaitReady()) << d.err();
      std::string streamed;
      uint64_t step = 0;
      for (const std::string& h : Stream(d.Stub().get(), 0, 3, SIZE_MAX, 8)) {
        absl::StrAppend(&streamed, "step ", step++, " ", h, "\n");
      }
      EXPECT_EQ(streamed, hashes) << config;
    }
    // With --post-balancing only tutti's cell plans as a job does (greedy
    // does not run there; the peers' re-deals are the benchmark's own).
    EXPECT_EQ(cells, *post == '\0' ? 2 : 1) << post;
  }
}

}  // namespace
}  // namespace tutti
