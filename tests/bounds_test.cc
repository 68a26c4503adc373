// The job's bounds end to end, through the real `tutti index`, tutti-packerd
// and two tutti-stagerd: a dataset holding samples the stager would refuse
// (more images than vision.max_images_per_sample, an image over
// vision.max_source_pixels) is indexed as it is, the packer leaves those
// samples out when it loads the index (logged and counted by reason), and
// over a whole epoch the stagers refuse nothing: the planned work is the
// served work. Requests carrying numbers that are no measurement (a NaN or
// negative wait, a NaN phase time) are refused and counted, and a client
// connection holds a bounded number of plan streams.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "common/tar.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

std::string Png(int width, int height) {
  cv::Mat img(height, width, CV_8UC3, cv::Scalar(30, 120, 200));
  std::vector<uchar> buf;
  EXPECT_TRUE(cv::imencode(".png", img, buf));
  return std::string(buf.begin(), buf.end());
}

std::string InputIds(int n) {
  std::string s = "{\"input_ids\": [";
  for (int i = 0; i < n; ++i) s += absl::StrCat(i ? ", " : "", 500 + i);
  return s + "]}";
}

// Samples named by what they test: "many_*" carry 3 images (over a limit of
// 2), "big_*" one 700x600 image (over 400,000 pixels), "pair_*" 2 images (at
// the limit).
std::string ExtraShard() {
  TarWriter w;
  const std::string small = Png(64, 64), big = Png(700, 600);
  for (int i = 0; i < 3; ++i) {
    const std::string key = absl::StrCat("many_", i);
    w.Add(key + ".json", InputIds(20));
    for (int j = 0; j < 3; ++j) w.Add(absl::StrCat(key, ".", j, ".png"), small);
  }
  for (int i = 0; i < 3; ++i) {
    const std::string key = absl::StrCat("big_", i);
    w.Add(key + ".json", InputIds(20));
    w.Add(key + ".png", big);
  }
  for (int i = 0; i < 2; ++i) {
    const std::string key = absl::StrCat("pair_", i);
    w.Add(key + ".json", InputIds(20));
    for (int j = 0; j < 2; ++j) w.Add(absl::StrCat(key, ".", j, ".png"), small);
  }
  return w.Finish();
}

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return ctx;
}

std::string Metrics(Daemon& d) {
  auto m = HttpGet(d.metrics_port(), "/metrics");
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *m : "";
}

TEST(Bounds, SamplesTheStagerWouldRefuseAreNeverPlannedAndTheStagersRefuseNothing) {
  const std::string dir = MakeTempDir("bounds_plan");
  const std::string source = dir + "/ds", index = dir + "/index.tutti";
  ASSERT_TRUE(GenerateDataset(source).ok());  // images up to 0.3 MP
  std::ofstream(source + "/zz-extra.tar", std::ios::binary) << ExtraShard();
  std::string out;
  absl::Status indexed = BuildIndex(source, index, {}, &out);  // default bounds: all indexed
  ASSERT_TRUE(indexed.ok()) << indexed << out;

  const std::string config = JobConfigText(index, /*epochs=*/1) +
                             "vision { max_images_per_sample: 2 max_source_pixels: 400000 }\n";
  auto cluster = Cluster::Start({.dir = dir, .job_config = config, .source = source});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;

  // Left out at load, each reason counted and logged with its fix.
  const std::string pm = Metrics(c.packer());
  EXPECT_GE(MetricValue(pm, "tutti_packer_unplanned_samples{reason=\"too_many_images\"}")
                .value_or(0),
            3);
  EXPECT_GE(MetricValue(pm, "tutti_packer_unplanned_samples{reason=\"image_too_large\"}")
                .value_or(0),
            3);
  const std::string log = c.packer().log();
  EXPECT_THAT(log, HasSubstr("reason=too_many_images"));
  EXPECT_THAT(log, HasSubstr("raise vision.max_images_per_sample"));
  EXPECT_THAT(log, HasSubstr("reason=image_too_large"));

  v1::JobInfo job;
  {
    grpc::ClientContext ctx;
    auto stub = v1::Packer::NewStub(MakeChannel(c.packer().address()));
    ASSERT_TRUE(stub->GetJob(WithDeadline(&ctx), v1::GetJobRequest(), &job).ok());
  }
  ASSERT_GE(job.total_steps(), 2u);

  // Every step of the epoch on every rank: no refused sample is in any
  // batch, nothing is skipped, and the samples at the limit are served.
  std::vector<std::unique_ptr<Client>> clients;
  for (int rank = 0; rank < 4; ++rank) {
    auto cl = Client::Connect(RankOptions(c.stager(rank / 2).address(), c.packer().address(),
                                          rank, 4));
    ASSERT_TRUE(cl.ok()) << cl.status();
    clients.push_back(std::move(*cl));
  }
  std::set<std::string> served;
  for (uint64_t step = 0; step < job.total_steps(); ++step) {
    for (int rank = 0; rank < 4; ++rank) {
      auto batch = clients[rank]->Next();
      ASSERT_TRUE(batch.ok()) << "rank " << rank << " step " << step << ": " << batch.status();
      EXPECT_TRUE(batch->skipped().empty()) << batch->descriptor().DebugString();
      for (const auto& s : batch->samples()) served.insert(s.key());
      ASSERT_TRUE(batch->Release().ok());
    }
  }
  for (const char* key : {"many_0", "many_1", "many_2", "big_0", "big_1", "big_2"}) {
    EXPECT_EQ(served.count(key), 0u) << key;
  }
  EXPECT_EQ(served.count("pair_0") + served.count("pair_1"), 2u);
  for (int node = 0; node < 2; ++node) {
    const std::string m = Metrics(c.stager(node));
    for (const char* limit : {"source_pixels", "image_pixels", "images_per_sample"}) {
      EXPECT_EQ(MetricValue(m, absl::StrCat("tutti_stager_limit_refusals_total{limit=\"", limit,
                                            "\"}")),
                0.0)
          << "node " << node << " " << limit;
    }
    EXPECT_EQ(MetricValue(m, "tutti_stager_skipped_samples_total{reason=\"too_large\"}"), 0.0);
    EXPECT_GE(MetricValue(m, "tutti_stager_batches_built_total").value_or(0),
              2.0 * job.total_steps());
  }
  clients.clear();
  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

TEST(Bounds, NumbersThatAreNoMeasurementAreRefusedAndCounted) {
  const std::string dir = MakeTempDir("bounds_values");
  const std::string source = dir + "/ds", index = dir + "/index.tutti";
  ASSERT_TRUE(GenerateDataset(source).ok());
  ASSERT_TRUE(BuildIndex(source, index).ok());
  auto cluster =
      Cluster::Start({.dir = dir, .job_config = JobConfigText(index, 1), .source = source});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;

  auto stager = v1::Stager::NewStub(MakeChannel(c.stager(0).address()));
  {
    grpc::ClientContext ctx;
    v1::AcquireBatchRequest req;
    req.set_rank(0);
    v1::BatchDescriptor d;
    grpc::Status s = stager->AcquireBatch(WithDeadline(&ctx), req, &d);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (const double wait : {std::nan(""), inf, -1.0}) {
    grpc::ClientContext ctx;
    v1::ReleaseBatchRequest req;
    req.set_rank(0);
    req.set_wait_seconds(wait);
    v1::ReleaseBatchResponse resp;
    grpc::Status s = stager->ReleaseBatch(WithDeadline(&ctx), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << wait;
    EXPECT_THAT(s.error_message(), HasSubstr("wait_seconds")) << wait;
  }
  {
    grpc::ClientContext ctx;
    v1::ReleaseBatchRequest req;
    req.set_rank(0);
    req.set_wait_seconds(0.5);
    v1::ReleaseBatchResponse resp;
    grpc::Status s = stager->ReleaseBatch(WithDeadline(&ctx), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  const std::string sm = Metrics(c.stager(0));
  EXPECT_EQ(MetricValue(sm, "tutti_rpc_refused_total{reason=\"invalid\",service=\"tutti.v1."
                            "Stager\"}"),
            3.0);
  EXPECT_EQ(MetricValue(sm, "tutti_stager_client_wait_seconds_count"), 1.0);
  EXPECT_EQ(MetricValue(sm, "tutti_stager_client_wait_seconds_sum"), 0.5);

  // A timing report: 32 phases (the limit) pass, a NaN or negative time does not.
  auto packer = v1::Packer::NewStub(MakeChannel(c.packer().address()));
  auto report = [&](int phases, double seconds) {
    grpc::ClientContext ctx;
    v1::StepTimingReport req;
    req.set_rank(0);
    for (int p = 0; p < phases; ++p) {
      v1::PhaseTiming* t = req.add_phases();
      t->set_phase("step");
      t->set_seconds(seconds);
    }
    v1::ReportTimingResponse resp;
    return packer->ReportTiming(WithDeadline(&ctx), req, &resp);
  };
  EXPECT_TRUE(report(32, 0.25).ok());
  for (const double bad : {std::nan(""), -inf, -0.25}) {
    grpc::Status s = report(1, bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
  }
  EXPECT_EQ(report(33, 0.25).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const std::string pm = Metrics(c.packer());
  EXPECT_EQ(MetricValue(pm, "tutti_rpc_refused_total{reason=\"invalid\",service=\"tutti.v1."
                            "Packer\"}"),
            3.0);
  EXPECT_EQ(MetricValue(pm, "tutti_rpc_refused_total{reason=\"too_many_items\",service=\"tutti."
                            "v1.Packer\"}"),
            1.0);
  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

// An AcquireBatch asks to wait at most --max_acquire_timeout_ms: at the
// limit it is served, above it (up to the field's 49 days) it is refused
// at once naming the field and the limit, and counted.
TEST(Bounds, AcquireWaitsAreBoundedAtTheLimit) {
  const std::string dir = MakeTempDir("bounds_acquire_wait");
  const std::string source = dir + "/ds", index = dir + "/index.tutti";
  ASSERT_TRUE(GenerateDataset(source).ok());
  ASSERT_TRUE(BuildIndex(source, index).ok());
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = JobConfigText(index, 1),
                                 .source = source,
                                 .nodes = 1,
                                 .stager_flags = {"--max_acquire_timeout_ms=60000"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  auto stager = v1::Stager::NewStub(MakeChannel(c.stager(0).address()));
  auto acquire = [&](uint32_t timeout_ms, uint64_t step) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
    v1::AcquireBatchRequest req;
    req.set_rank(0);
    req.set_step(step);
    req.set_timeout_ms(timeout_ms);
    v1::BatchDescriptor d;
    return stager->AcquireBatch(&ctx, req, &d);
  };
  for (const uint32_t over : {60001u, std::numeric_limits<uint32_t>::max()}) {
    grpc::Status s = acquire(over, 0);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << over;
    EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("AcquireBatchRequest.timeout_ms ", over,
                                                          " is over the limit 60000")));
    EXPECT_THAT(s.error_message(), HasSubstr("--max_acquire_timeout_ms"));
  }
  grpc::Status at_limit = acquire(60000, 0);
  EXPECT_TRUE(at_limit.ok()) << at_limit.error_message();
  EXPECT_EQ(MetricValue(Metrics(c.stager(0)),
                        "tutti_rpc_refused_total{reason=\"timeout_too_long\","
                        "service=\"tutti.v1.Stager\"}"),
            2.0);
  // The stager refuses a limit below a minute (libtutti asks for a minute).
  auto low = RunCommand({Stagerd(), "--max_acquire_timeout_ms=59999", "--source=" + source,
                         "--cache=" + dir + "/cache-low"},
                        absl::Seconds(60));
  EXPECT_NE(low.status, 0);
  EXPECT_THAT(low.output, HasSubstr("--max_acquire_timeout_ms 59999 is out of range"));
  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

// A client connection holds at most --max_streams_per_client plan streams:
// at the limit they run, one more is refused naming the limit, another
// connection is unaffected, and a finished stream frees its place.
TEST(Bounds, PlanStreamsPerClientAreBoundedAtTheLimit) {
  const std::string dir = MakeTempDir("bounds_streams");
  const std::string source = dir + "/ds", index = dir + "/index.tutti";
  ASSERT_TRUE(GenerateDataset(source).ok());
  ASSERT_TRUE(BuildIndex(source, index).ok());
  // epochs 0: the streams never end by themselves.
  auto cluster = Cluster::Start({.dir = dir,
                                 .job_config = JobConfigText(index, /*epochs=*/0),
                                 .source = source,
                                 .packer_flags = {"--max_streams_per_client=2"}});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  auto connection = [&] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    return grpc::CreateCustomChannel(c.packer().address(), grpc::InsecureChannelCredentials(),
                                     args);
  };
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::StepPlan>> reader;
  };
  auto open = [](v1::Packer::Stub& stub) {
    auto s = std::make_unique<Stream>();
    WithDeadline(&s->ctx);
    s->reader = stub.StreamPlans(&s->ctx, v1::StreamPlansRequest());
    return s;
  };
  auto ch = connection();
  auto stub = v1::Packer::NewStub(ch);
  std::vector<std::unique_ptr<Stream>> held;
  for (int i = 0; i < 2; ++i) {  // at the limit: both stream
    held.push_back(open(*stub));
    v1::StepPlan plan;
    ASSERT_TRUE(held.back()->reader->Read(&plan)) << i;
  }
  {
    auto over = open(*stub);
    v1::StepPlan plan;
    EXPECT_FALSE(over->reader->Read(&plan));
    grpc::Status s = over->reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("--max_streams_per_client 2"));
  }
  {
    auto other = v1::Packer::NewStub(connection());
    auto s = open(*other);
    v1::StepPlan plan;
    EXPECT_TRUE(s->reader->Read(&plan));  // another client is not affected
    s->ctx.TryCancel();
    s->reader->Finish();
  }
  held[0]->ctx.TryCancel();
  held[0]->reader->Finish();
  bool reopened = false;  // the cancelled stream's place comes free
  for (int attempt = 0; attempt < 100 && !reopened; ++attempt) {
    auto s = open(*stub);
    v1::StepPlan plan;
    reopened = s->reader->Read(&plan);
    s->ctx.TryCancel();
    s->reader->Finish();
    if (!reopened) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(reopened);
  held[1]->ctx.TryCancel();
  held[1]->reader->Finish();
  EXPECT_GE(MetricValue(Metrics(c.packer()), "tutti_rpc_refused_total{reason=\"too_many_streams\","
                                             "service=\"tutti.v1.Packer\"}")
                .value_or(0),
            1.0);
  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
  RemoveTree(dir);
}

}  // namespace
}  // namespace tutti::e2e
