// Which process a rank's batches belong to, against the real daemons. A
// rank's process (libtutti) registers with its stager, which issues it an
// incarnation and a key; every later call of it names both. Another local
// process that renews, releases or asks as that rank, naming an invented
// incarnation, none at all, or the rank's real incarnation without its key,
// is refused and touches nothing the rank holds: with the job's token (and
// a false tutti-rank) or without one (any process that may connect).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"
#include "common/shm.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

// What one call of another process as rank 0 came to, and the refusal due.
struct Forged {
  std::string what;
  grpc::Status status;
  grpc::StatusCode want;
};

class RankIdentity : public ::testing::Test {
 protected:
  void Start(bool token) {
    dir_ = MakeTempDir("rank_identity");
    ASSERT_TRUE(GenerateDataset(dir_ + "/ds").ok());
    ASSERT_TRUE(BuildIndex(dir_ + "/ds", dir_ + "/index.tutti").ok());
    std::vector<std::string> flags;
    if (token) {
      token_ = dir_ + "/token";
      RunResult r = RunCommand({"/bin/sh", "-c", "umask 077; openssl rand -hex 32 > " + token_},
                               absl::Seconds(30));
      ASSERT_EQ(r.status, 0) << r.output;
      flags.push_back("--token_file=" + token_);
    }
    auto c = Cluster::Start({.dir = dir_,
                             .job_config = JobConfigText(dir_ + "/index.tutti", 4),
                             .source = dir_ + "/ds",
                             .nodes = 1,
                             .stager_flags = flags,
                             .packer_flags = flags});
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  void TearDown() override {
    if (cluster_) EXPECT_TRUE(cluster_->Stop().ok());
    if (!dir_.empty() && !HasFailure()) RemoveTree(dir_);
  }
  std::string stager() const { return cluster_->stager(0).address(); }
  // The stager's count of calls refused for the process they named.
  std::string IncarnationRefusals() {
    absl::StatusOr<std::string> page = HttpGet(cluster_->stager(0).metrics_port(), "/metrics");
    EXPECT_TRUE(page.ok()) << page.status();
    for (absl::string_view line : absl::StrSplit(page.value_or(""), '\n')) {
      if (absl::StartsWith(line, "tutti_rpc_refused_total{reason=\"incarnation\"")) {
        return std::string(line.substr(line.rfind(' ') + 1));
      }
    }
    return "none";
  }
  // The job's token, as a client resolves it.
  SecurityOptions Security() const {
    SecurityOptions o;
    o.token_file = token_;
    auto r = ResolveSecurityOptions(o, [](const char*) -> const char* { return nullptr; });
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : o;
  }
  // The incarnation the stager issued to rank 0's process, from its log.
  uint64_t IncarnationOfRank0() {
    uint64_t found = 0;
    for (absl::string_view line : absl::StrSplit(cluster_->stager(0).log(), '\n')) {
      if (!absl::StrContains(line, "registered") || !absl::StrContains(line, " rank=0 ")) continue;
      const size_t at = line.find(" incarnation=");
      if (at == absl::string_view::npos) continue;
      absl::string_view hex = line.substr(at + 13);
      hex = hex.substr(0, hex.find(' '));
      if (!absl::SimpleHexAtoi(hex, &found)) found = 0;
    }
    return found;
  }

  // While rank 0's own process holds step 0, another process on `channel`
  // renews, releases and asks as rank 0; then rank 0 goes on to step 3.
  void ExpectNothingTaken(const std::shared_ptr<grpc::Channel>& channel) {
    ClientOptions o = RankOptions(stager(), cluster_->packer().address(), 0, 4);
    o.security.token_file = token_;
    auto rank0 = Client::Connect(o);
    ASSERT_TRUE(rank0.ok()) << rank0.status();
    auto held = (*rank0)->Next();
    ASSERT_TRUE(held.ok()) << held.status();
    const std::string segment = held->descriptor().shm_name();
    const uint64_t real = IncarnationOfRank0();

    auto stub = v1::Stager::NewStub(channel);
    std::vector<Forged> forged;
    ASSERT_NE(real, 0u) << "no registration in the stager's log";
    for (uint64_t incarnation : {uint64_t{0x5eed}, uint64_t{0}, real}) {
      const std::string named = incarnation == real ? "rank 0's own incarnation without its key"
                                                    : absl::StrCat("incarnation ", incarnation);
      // Made up: the stager never issued it; none, or rank 0's without its key:
      // not rank 0's process.
      const grpc::StatusCode want =
          incarnation == 0x5eed ? grpc::StatusCode::NOT_FOUND : grpc::StatusCode::PERMISSION_DENIED;
      {
        grpc::ClientContext ctx;
        v1::RenewLeasesRequest req;
        req.set_rank(0);
        req.set_incarnation(incarnation);
        v1::RenewLeasesResponse resp;
        forged.push_back({"RenewLeases naming " + named,
                          stub->RenewLeases(WithDeadline(&ctx), req, &resp),
                          incarnation == 0 ? grpc::StatusCode::INVALID_ARGUMENT : want});
      }
      {
        grpc::ClientContext ctx;
        v1::ReleaseBatchRequest req;
        req.set_rank(0);
        req.set_step(0);
        req.set_incarnation(incarnation);
        v1::ReleaseBatchResponse resp;
        forged.push_back({"ReleaseBatch of step 0 naming " + named,
                          stub->ReleaseBatch(WithDeadline(&ctx), req, &resp), want});
      }
      {
        // Asking for step 2 would give up rank 0's steps 0 and 1.
        grpc::ClientContext ctx;
        v1::AcquireBatchRequest req;
        req.set_rank(0);
        req.set_step(2);
        req.set_timeout_ms(2000);
        req.set_incarnation(incarnation);
        v1::BatchDescriptor d;
        forged.push_back({"AcquireBatch of step 2 naming " + named,
                          stub->AcquireBatch(WithDeadline(&ctx), req, &d), want});
      }
    }
    for (const Forged& f : forged) {
      EXPECT_FALSE(f.status.ok()) << f.what << " was accepted";
      EXPECT_EQ(f.status.error_code(), f.want) << f.what << ": " << f.status.error_message();
    }
    // Rank 0 still holds its batch, and goes on.
    EXPECT_TRUE(ShmSegment::Open(segment, false).ok()) << "rank 0's step 0 was freed";
    EXPECT_TRUE(held->Release().ok());
    for (uint64_t step = 1; step < 4; ++step) {
      auto batch = (*rank0)->Next();
      ASSERT_TRUE(batch.ok()) << "step " << step << ": " << batch.status();
      EXPECT_EQ(batch->step(), step);
      EXPECT_TRUE(batch->Release().ok());
    }
  }

  std::string dir_, token_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(RankIdentity, WithoutATokenNoOtherLocalProcessTakesWhatARankHolds) {
  Start(/*token=*/false);
  // A process that says nothing about itself, and one that says it is rank 0.
  ExpectNothingTaken(MakeChannel(stager()));
  ExpectNothingTaken(MakeSecureChannel(stager(), {}, {0, ""}));
  EXPECT_EQ(IncarnationRefusals(), "16");  // 8 a process (a renewal naming none is invalid)
}

TEST_F(RankIdentity, WithTheTokenAFalseTuttiRankTakesNothingEither) {
  Start(/*token=*/true);
  ExpectNothingTaken(MakeSecureChannel(stager(), Security(), {0, ""}));
  EXPECT_EQ(IncarnationRefusals(), "8");
}

}  // namespace
}  // namespace tutti::e2e
