// Stager to stager: FetchMembers (the holder's side) and the receiving side
// of remote_load items, with real tutti-stagerd servers (StagerServer, in
// process) on loopback against a small tutti.v1.Packer fixture serving
// precomputed plans: the request's bounds and the job's token, member bytes
// as stored in the shard, and two stagers as two nodes fetching each
// other's members (then the source when the holder fails or is late).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/http_client.h"
#include "common/rpc_security.h"
#include "gtest/gtest.h"
#include "services/stager/member_stream.h"
#include "services/stager/stager_server.h"
#include "services/stager/test_dataset.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::stager {
namespace {

namespace fs = std::filesystem;

// GetJob, and StreamPlans of testing::MakePlan passed through `edit` (which
// marks items remote_load and names their holder).
class FixturePacker final : public v1::Packer::Service {
 public:
  using Edit = std::function<void(v1::StepPlan*)>;
  FixturePacker(testing::Dataset data, v1::JobInfo job, uint64_t end_step, Edit edit = {})
      : data_(std::move(data)), job_(std::move(job)), end_(end_step), edit_(std::move(edit)) {}
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*, v1::JobInfo* out) override {
    *out = job_;
    return grpc::Status::OK;
  }
  grpc::Status StreamPlans(grpc::ServerContext* ctx, const v1::StreamPlansRequest* req,
                           grpc::ServerWriter<v1::StepPlan>* w) override {
    std::vector<uint32_t> ranks(req->ranks().begin(), req->ranks().end());
    const uint64_t stop = req->end_step() == 0 ? ~uint64_t{0} : req->end_step();
    for (uint64_t s = req->start_step(); s < stop && !ctx->IsCancelled(); ++s) {
      if (s >= end_) {
        return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                            "step " + std::to_string(s) + " is past the end of the dataset");
      }
      if (!w->Write(Plan(s, ranks))) break;
    }
    return grpc::Status::OK;
  }
  v1::StepPlan Plan(uint64_t step, const std::vector<uint32_t>& ranks) const {
    v1::StepPlan plan = testing::MakePlan(data_, job_, step, ranks, 2);
    if (edit_) edit_(&plan);
    return plan;
  }

 private:
  testing::Dataset data_;
  v1::JobInfo job_;
  uint64_t end_;
  Edit edit_;
};

struct Env {
  std::string root;
  testing::Dataset data;
  v1::JobInfo job;
  std::unique_ptr<FixturePacker> packer;
  std::unique_ptr<GrpcServer> packer_server;
  int packer_port = 0;

  Env(const std::string& name, int shards, uint32_t world, uint32_t ranks_per_node) {
    root = ::testing::TempDir() + "/peers_" + name + "_" + std::to_string(::getpid());
    fs::remove_all(root);
    data = testing::WriteDataset(root + "/src", {.shards = shards, .samples_per_shard = 8});
    job = testing::MakeJob(data, world, ranks_per_node);
    job.mutable_config()->set_job_id("peers-" + name);
  }
  void StartPacker(uint64_t end_step, FixturePacker::Edit edit = {}) {
    packer = std::make_unique<FixturePacker>(data, job, end_step, std::move(edit));
    auto s = StartGrpcServer("127.0.0.1:0", {packer.get()}, &packer_port);
    ASSERT_TRUE(s.ok()) << s.status();
    packer_server = std::move(*s);
  }
  StagerServerOptions Options(uint32_t node) {
    StagerServerOptions o;
    o.packer = "127.0.0.1:" + std::to_string(packer_port);
    o.listen = "127.0.0.1:0";
    o.metrics = "127.0.0.1:0";
    o.packer_wait = absl::Seconds(20);
    o.core.node = node;
    o.core.cache_dir = absl::StrCat(root, "/cache", node);
    o.core.staging.source_dir = data.dir;
    o.core.staging.queue_depth = 8;
    o.core.staging.block_size = 65536;
    o.core.decode_threads = 2;
    o.core.window = 2;
    o.core.stage_ahead = 2;
    return o;
  }
  ~Env() { fs::remove_all(root); }
};

// The bytes of `member` as stored in the shard.
std::string MemberBytes(const testing::Dataset& data, const v1::ShardRef& shard,
                        const v1::MemberRef& member) {
  std::ifstream in(data.dir + "/" + shard.name(), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.substr(member.offset(), member.size());
}

// FetchMembers for `req` with `security`'s token: the stream's messages by
// index, and how it ended.
struct Fetched {
  grpc::Status status;
  std::map<uint32_t, v1::FetchedMember> members;
};
Fetched Fetch(int port, const v1::FetchMembersRequest& req, const SecurityOptions& security) {
  auto stub = v1::Stager::NewStub(MakeSecureChannel("127.0.0.1:" + std::to_string(port), security));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto reader = stub->FetchMembers(&ctx, req);
  Fetched out;
  v1::FetchedMember m;
  while (reader->Read(&m)) out.members[m.index()] = m;
  out.status = reader->Finish();
  return out;
}

double Metric(int port, const std::string& name) {
  absl::StatusOr<std::string> page = HttpGet(port, "/metrics");
  if (!page.ok()) return -1;
  return MetricValue(*page, name).value_or(-1);
}

// A request for the first `n` members (image, text) of shard 0's samples.
v1::FetchMembersRequest FirstMembers(const testing::Dataset& data, int n) {
  v1::FetchMembersRequest req;
  *req.mutable_shard() = data.shards[0];
  for (const v1::SampleInfo& s : data.samples) {
    if (s.shard() != 0) continue;
    if (req.members_size() < n) *req.add_members() = s.images(0);
    if (req.members_size() < n) *req.add_members() = s.text();
  }
  return req;
}

TEST(FetchMembersTest, ACallWithoutTheJobsTokenIsRefused) {
  Env env("token", 2, 2, 1);
  env.StartPacker(4);
  StagerServerOptions o = env.Options(0);
  o.rpc.security.token = "the-job-token";
  StagerServer server(o);
  ASSERT_TRUE(server.Start().ok());
  const v1::FetchMembersRequest req = FirstMembers(env.data, 2);

  Fetched none = Fetch(server.grpc_port(), req, {});
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << none.status.error_message();
  EXPECT_TRUE(none.members.empty());
  SecurityOptions wrong;
  wrong.token = "another-job";
  EXPECT_EQ(Fetch(server.grpc_port(), req, wrong).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Metric(server.metrics_port(), "tutti_stager_peer_bytes_total{direction=\"sent\"}"), 0);

  SecurityOptions right;
  right.token = "the-job-token";
  Fetched ok = Fetch(server.grpc_port(), req, right);
  ASSERT_TRUE(ok.status.ok()) << ok.status.error_message();
  ASSERT_EQ(ok.members.size(), 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ok.members[i].code(), 0) << ok.members[i].error();
    EXPECT_EQ(ok.members[i].data(),
              MemberBytes(env.data, req.shard(), req.members(static_cast<int>(i))));
  }
}

TEST(FetchMembersTest, BoundsAreCheckedBeforeAnythingIsRead) {
  Env env("bounds", 2, 2, 1);
  env.StartPacker(4);
  StagerServer server(env.Options(0));
  ASSERT_TRUE(server.Start().ok());
  const int port = server.grpc_port();

  v1::FetchMembersRequest none = FirstMembers(env.data, 0);
  Fetched r = Fetch(port, none, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("names no member"), std::string::npos);

  v1::FetchMembersRequest many = FirstMembers(env.data, 1);
  while (many.members_size() <= kMaxPeerMembers) *many.add_members() = many.members(0);
  r = Fetch(port, many, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("at most 64"), std::string::npos)
      << r.status.error_message();

  v1::FetchMembersRequest huge = FirstMembers(env.data, 1);
  huge.mutable_shard()->set_size(0);
  huge.mutable_members(0)->set_size(kMaxPeerMemberBytes + 1);
  r = Fetch(port, huge, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  v1::FetchMembersRequest total = FirstMembers(env.data, 1);
  total.mutable_shard()->set_size(0);
  total.mutable_members(0)->set_size(kMaxPeerMemberBytes);
  for (int i = 0; i < 2; ++i) *total.add_members() = total.members(0);
  r = Fetch(port, total, {});
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(r.members.empty());

  // A shard whose name leads outside --source: refused as the stager's own
  // reads are, per member, and nothing outside is opened.
  v1::FetchMembersRequest outside = FirstMembers(env.data, 1);
  outside.mutable_shard()->set_name("../../etc/passwd");
  outside.mutable_shard()->set_size(0);
  r = Fetch(port, outside, {});
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.members.size(), 1u);
  EXPECT_EQ(r.members[0].code(), static_cast<int>(absl::StatusCode::kPermissionDenied))
      << r.members[0].error();
  EXPECT_TRUE(r.members[0].data().empty());
  EXPECT_EQ(Metric(server.metrics_port(),
                   "tutti_stager_path_refusals_total{reason=\"name\",root=\"source\"}"),
            1);
  EXPECT_EQ(
      Metric(server.metrics_port(), "tutti_stager_peer_served_members_total{outcome=\"failed\"}"),
      1);
}

}  // namespace
}  // namespace tutti::stager
