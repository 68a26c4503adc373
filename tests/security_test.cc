// The access model against the real daemons on loopback, with certificates
// made by Debian's openssl for each run: TLS and mutual TLS on tutti-packerd
// and tutti-stagerd, the job token on every call, a client acting only as its
// own rank, request bounds, unparseable bytes, the warning for a non-loopback
// address served unprotected, and a Unix socket that admits its peers by
// their credentials, whatever the socket file's mode. Ranks reach their batches through
// libtutti with the settings operators give it (a CA, a token file, a
// client certificate).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "common/grpc_status.h"
#include "common/rpc_security.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/e2e_client.h"
#include "tests/e2e_support.h"
#include "tutti/v1/packer.grpc.pb.h"
#include "tutti/v1/stager.grpc.pb.h"

namespace tutti::e2e {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A CA, the daemons' certificate (localhost, 127.0.0.1 and the job id), a
// client certificate of the job, one of the same CA naming another job, one
// of another CA, the job's token and a wrong one.
struct Pki {
  std::string dir, ca, cert, key, token, wrong_token;
  std::string job_cert, job_key, other_job_cert, other_job_key, stranger_cert, stranger_key;
};

absl::StatusOr<Pki> MakePki(const std::string& dir, const std::string& job_id) {
  // umask 077: the token and the keys private, as an operator keeps them.
  const std::string script = absl::StrCat(R"(set -e
umask 077
cd ")",
                                          dir, R"("
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }
ca() { key "$1"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1"; }
leaf() {  # name CN CA extensions
  key "$1"; openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"
  printf '%s\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile "$1.ext" 2>/dev/null
}
ca ca; ca other-ca
leaf daemon localhost ca "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:)",
                                          job_id, R"("
leaf job ")",
                                          job_id, R"(" ca "extendedKeyUsage=clientAuth"
leaf other-job other-job ca "extendedKeyUsage=clientAuth"
leaf stranger ")",
                                          job_id, R"(" other-ca "extendedKeyUsage=clientAuth"
openssl rand -hex 32 > token
openssl rand -hex 32 > wrong-token
)");
  RunResult r = RunCommand({"/bin/sh", "-c", script}, absl::Seconds(60));
  if (r.status != 0) return absl::InternalError("openssl: " + r.output);
  Pki p;
  p.dir = dir;
  p.ca = dir + "/ca.pem";
  p.cert = dir + "/daemon.pem";
  p.key = dir + "/daemon.key";
  p.token = dir + "/token";
  p.wrong_token = dir + "/wrong-token";
  p.job_cert = dir + "/job.pem";
  p.job_key = dir + "/job.key";
  p.other_job_cert = dir + "/other-job.pem";
  p.other_job_key = dir + "/other-job.key";
  p.stranger_cert = dir + "/stranger.pem";
  p.stranger_key = dir + "/stranger.key";
  return p;
}

// What a client resolves from its settings (as libtutti does).
SecurityOptions ClientSecurity(const std::string& ca, const std::string& token_file,
                               const std::string& cert = "", const std::string& key = "") {
  SecurityOptions o;
  o.tls_ca_file = ca;
  o.token_file = token_file;
  o.tls_cert_file = cert;
  o.tls_key_file = key;
  auto r = ResolveSecurityOptions(o, [](const char*) -> const char* { return nullptr; });
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : o;
}

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

// Every tutti.v1.Packer method once; each call's code.
std::vector<grpc::StatusCode> CallEveryPackerMethod(const std::shared_ptr<grpc::Channel>& ch) {
  auto stub = v1::Packer::NewStub(ch);
  std::vector<grpc::StatusCode> codes;
  {
    grpc::ClientContext ctx;
    v1::JobInfo job;
    codes.push_back(stub->GetJob(WithDeadline(&ctx), v1::GetJobRequest(), &job).error_code());
  }
  {
    grpc::ClientContext ctx;
    v1::GetPlanRequest req;
    v1::StepPlan plan;
    codes.push_back(stub->GetPlan(WithDeadline(&ctx), req, &plan).error_code());
  }
  {
    grpc::ClientContext ctx;
    v1::StreamPlansRequest req;
    req.set_end_step(1);
    auto reader = stub->StreamPlans(WithDeadline(&ctx), req);
    v1::StepPlan plan;
    while (reader->Read(&plan)) {
    }
    codes.push_back(reader->Finish().error_code());
  }
  {
    grpc::ClientContext ctx;
    v1::StepTimingReport req;
    req.set_rank(0);
    v1::ReportTimingResponse resp;
    codes.push_back(stub->ReportTiming(WithDeadline(&ctx), req, &resp).error_code());
  }
  return codes;
}

// Every tutti.v1.Stager method once, as rank 0 asking for its own step 0.
std::vector<grpc::StatusCode> CallEveryStagerMethod(const std::shared_ptr<grpc::Channel>& ch,
                                                    std::string* last_message = nullptr) {
  auto stub = v1::Stager::NewStub(ch);
  std::vector<grpc::StatusCode> codes;
  {
    grpc::ClientContext ctx;
    v1::StageStatus st;
    codes.push_back(
        stub->GetStageStatus(WithDeadline(&ctx), v1::GetStageStatusRequest(), &st).error_code());
  }
  {
    grpc::ClientContext ctx;
    v1::RegisterRankRequest req;
    req.set_rank(0);
    v1::RegisterRankResponse resp;
    grpc::Status s = stub->RegisterRank(WithDeadline(&ctx), req, &resp);
    codes.push_back(s.error_code());
    if (last_message) *last_message = s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::AcquireBatchRequest req;
    req.set_rank(0);
    req.set_step(0);
    req.set_timeout_ms(100);
    v1::BatchDescriptor d;
    grpc::Status s = stub->AcquireBatch(WithDeadline(&ctx), req, &d);
    codes.push_back(s.error_code());
    if (last_message) *last_message = s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::ReleaseBatchRequest req;
    req.set_rank(0);
    req.set_step(0);
    v1::ReleaseBatchResponse resp;
    grpc::Status s = stub->ReleaseBatch(WithDeadline(&ctx), req, &resp);
    codes.push_back(s.error_code());
    if (last_message) *last_message = s.error_message();
  }
  {
    grpc::ClientContext ctx;
    v1::RenewLeasesRequest req;
    req.set_rank(0);
    req.set_incarnation(7);
    req.add_steps(0);
    v1::RenewLeasesResponse resp;
    grpc::Status s = stub->RenewLeases(WithDeadline(&ctx), req, &resp);
    codes.push_back(s.error_code());
    if (last_message) *last_message = s.error_message();
  }
  return codes;
}

// One unary call of `method` with `bytes` as its request, as any client could send.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& ch, const std::string& method,
                     const std::string& bytes) {
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  WithDeadline(&ctx);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

using Codes = std::vector<grpc::StatusCode>;
Codes All(size_t n, grpc::StatusCode c) { return Codes(n, c); }

class Security : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("security");
    source_ = dir_ + "/ds";
    index_ = dir_ + "/index.tutti";
    ASSERT_TRUE(GenerateDataset(source_).ok());
    ASSERT_TRUE(BuildIndex(source_, index_).ok());
    job_id_ = std::filesystem::path(dir_).filename().string();
    for (char& c : job_id_) {  // as JobConfigText names the job
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
    }
    auto p = MakePki(dir_, job_id_);
    ASSERT_TRUE(p.ok()) << p.status();
    pki_ = *p;
  }
  void TearDown() override {
    if (cluster_) {
      absl::Status s = cluster_->Stop();
      EXPECT_TRUE(s.ok()) << s;
    }
    RemoveTree(dir_);
  }
  void StartCluster(std::vector<std::string> packer_flags, std::vector<std::string> stager_flags,
                    int nodes = 2) {
    auto c = Cluster::Start({.dir = dir_,
                             .job_config = JobConfigText(index_, 1),
                             .source = source_,
                             .nodes = nodes,
                             .stager_flags = std::move(stager_flags),
                             .packer_flags = std::move(packer_flags)});
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = std::move(*c);
  }
  std::vector<std::string> TlsAndToken() const {
    return {"--tls_cert=" + pki_.cert, "--tls_key=" + pki_.key, "--token_file=" + pki_.token};
  }
  std::string packer() const { return cluster_->packer().address(); }
  std::string stager(int node) const { return cluster_->stager(node).address(); }
  std::string Metrics(Daemon& d) {
    auto m = HttpGet(d.metrics_port(), "/metrics");
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *m : "";
  }

  std::string dir_, source_, index_, job_id_;
  Pki pki_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(Security, TlsAndTokenOnBothDaemonsEveryRpcRefusesWhoLacksThem) {
  // Stagers serve TLS with the job's token and reach the packer the same way.
  std::vector<std::string> stager_flags = TlsAndToken();
  stager_flags.push_back("--tls_ca=" + pki_.ca);
  StartCluster(TlsAndToken(), stager_flags);

  const SecurityOptions good = ClientSecurity(pki_.ca, pki_.token);
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), good, {0, ""})),
            All(4, grpc::StatusCode::OK));

  const SecurityOptions no_token = ClientSecurity(pki_.ca, "");
  const SecurityOptions wrong_token = ClientSecurity(pki_.ca, pki_.wrong_token);
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), no_token, {0, ""})),
            All(4, grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), wrong_token, {0, ""})),
            All(4, grpc::StatusCode::UNAUTHENTICATED));
  // Plaintext to a TLS port never gets an answer.
  EXPECT_EQ(CallEveryPackerMethod(MakeChannel(packer())), All(4, grpc::StatusCode::UNAVAILABLE));
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(CallEveryStagerMethod(MakeSecureChannel(stager(node), no_token, {0, job_id_})),
              All(5, grpc::StatusCode::UNAUTHENTICATED));
    EXPECT_EQ(CallEveryStagerMethod(MakeSecureChannel(stager(node), wrong_token, {0, job_id_})),
              All(5, grpc::StatusCode::UNAUTHENTICATED));
    EXPECT_EQ(CallEveryStagerMethod(MakeChannel(stager(node))),
              All(5, grpc::StatusCode::UNAVAILABLE));
  }
  EXPECT_THAT(Metrics(cluster_->packer()),
              HasSubstr("tutti_rpc_refused_total{reason=\"unauthenticated\",service=\"tutti.v1."
                        "Packer\"} 8"));

  // The ranks of node 0 through libtutti, configured as operators do.
  for (int rank = 0; rank < 2; ++rank) {
    ClientOptions o = RankOptions(stager(0), packer(), rank, 4);
    o.security.tls_ca_file = pki_.ca;
    o.security.token_file = pki_.token;
    auto client = Client::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    for (int step = 0; step < 2; ++step) {
      auto batch = (*client)->Next();
      ASSERT_TRUE(batch.ok()) << batch.status();
      EXPECT_TRUE(batch->Release().ok());
    }
  }
}

TEST_F(Security, ARankActsOnlyAsItselfAndOnlyInItsJob) {
  StartCluster({"--token_file=" + pki_.token}, {"--token_file=" + pki_.token});
  const SecurityOptions token = ClientSecurity("", pki_.token);

  // Rank 1 of this job asks for rank 0's batch, releases it, or calls
  // without saying which rank it is; a client of another job asks as rank 0.
  std::string why;
  auto as_rank1 = CallEveryStagerMethod(MakeSecureChannel(stager(0), token, {1, job_id_}), &why);
  EXPECT_EQ(as_rank1,
            (Codes{grpc::StatusCode::OK, grpc::StatusCode::PERMISSION_DENIED,
                   grpc::StatusCode::PERMISSION_DENIED, grpc::StatusCode::PERMISSION_DENIED,
                   grpc::StatusCode::PERMISSION_DENIED}));
  EXPECT_THAT(why, HasSubstr("rank 0"));
  EXPECT_THAT(why, HasSubstr("this client is rank 1"));
  auto anonymous = CallEveryStagerMethod(MakeSecureChannel(stager(0), token, {-1, ""}), &why);
  for (size_t m = 1; m < anonymous.size(); ++m) {
    EXPECT_EQ(anonymous[m], grpc::StatusCode::PERMISSION_DENIED) << m;
  }
  auto other_job = CallEveryStagerMethod(MakeSecureChannel(stager(0), token, {0, "other"}), &why);
  for (size_t m = 1; m < other_job.size(); ++m) {
    EXPECT_EQ(other_job[m], grpc::StatusCode::PERMISSION_DENIED) << m;
  }
  EXPECT_THAT(why, HasSubstr("job 'other'"));
  // The same on the packer's per-rank call.
  {
    auto stub = v1::Packer::NewStub(MakeSecureChannel(packer(), token, {1, ""}));
    grpc::ClientContext ctx;
    v1::StepTimingReport req;
    req.set_rank(0);
    v1::ReportTimingResponse resp;
    grpc::Status s = stub->ReportTiming(WithDeadline(&ctx), req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("rank 0"));
  }
  // The attack of a stranger asking for a later step as rank 0 is refused,
  // so the real rank 0 still gets each of its steps in order.
  {
    auto stub = v1::Stager::NewStub(MakeSecureChannel(stager(0), token, {1, job_id_}));
    grpc::ClientContext ctx;
    v1::AcquireBatchRequest req;
    req.set_rank(0);
    req.set_step(2);
    v1::BatchDescriptor d;
    EXPECT_EQ(stub->AcquireBatch(WithDeadline(&ctx), req, &d).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  ClientOptions o = RankOptions(stager(0), packer(), 0, 4);
  o.security.token_file = pki_.token;
  auto rank0 = Client::Connect(o);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  for (int step = 0; step < 2; ++step) {
    auto batch = (*rank0)->Next();
    ASSERT_TRUE(batch.ok()) << "step " << step << ": " << batch.status();
    EXPECT_TRUE(batch->Release().ok());
  }
  EXPECT_THAT(Metrics(cluster_->stager(0)),
              HasSubstr("tutti_rpc_refused_total{reason=\"permission_denied\",service=\"tutti."
                        "v1.Stager\"} 13"));
}

TEST_F(Security, MutualTlsAdmitsOnlyTheJobsCertificates) {
  const std::vector<std::string> mutual = {"--tls_cert=" + pki_.cert, "--tls_key=" + pki_.key,
                                           "--tls_ca=" + pki_.ca, "--tls_mutual",
                                           "--tls_client_name=" + job_id_};
  // The stager presents the daemons' certificate (it names the job) to the packer.
  StartCluster(mutual, mutual);

  const SecurityOptions job = ClientSecurity(pki_.ca, "", pki_.job_cert, pki_.job_key);
  const SecurityOptions other_job =
      ClientSecurity(pki_.ca, "", pki_.other_job_cert, pki_.other_job_key);
  const SecurityOptions stranger =
      ClientSecurity(pki_.ca, "", pki_.stranger_cert, pki_.stranger_key);
  const SecurityOptions no_cert = ClientSecurity(pki_.ca, "");
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), job, {0, ""})),
            All(4, grpc::StatusCode::OK));
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), other_job, {0, ""})),
            All(4, grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), stranger, {0, ""})),
            All(4, grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(CallEveryPackerMethod(MakeSecureChannel(packer(), no_cert, {0, ""})),
            All(4, grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(CallEveryStagerMethod(MakeSecureChannel(stager(0), other_job, {0, job_id_})),
            All(5, grpc::StatusCode::UNAUTHENTICATED));
  EXPECT_EQ(CallEveryStagerMethod(MakeSecureChannel(stager(0), stranger, {0, job_id_})),
            All(5, grpc::StatusCode::UNAVAILABLE));

  // A rank with the job's certificate, through libtutti's environment.
  ClientOptions o = RankOptions(stager(0), packer(), 0, 4);
  const std::map<std::string, std::string> env = {{"TUTTI_TLS_CA", pki_.ca},
                                                  {"TUTTI_TLS_CERT", pki_.job_cert},
                                                  {"TUTTI_TLS_KEY", pki_.job_key}};
  auto resolved = ResolveClientOptions(o, [&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  auto client = Client::Connect(*resolved);
  ASSERT_TRUE(client.ok()) << client.status();
  auto batch = (*client)->Next();
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(batch->Release().ok());
}

TEST_F(Security, RequestsOutsideTheBoundsAreRefusedCleanlyAndCounted) {
  StartCluster({"--max_request_bytes=1024"}, {"--max_request_bytes=1024"});
  auto packer_ch = MakeChannel(packer());
  auto stager_ch = MakeChannel(stager(0));

  // Bytes that are no request at all: INVALID_ARGUMENT naming the message.
  for (const char* m :
       {"/tutti.v1.Packer/GetPlan", "/tutti.v1.Packer/GetJob", "/tutti.v1.Packer/ReportTiming"}) {
    grpc::Status s = RawCall(packer_ch, m, "\xff\xff\xff\xff\x0f");
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << m;
    EXPECT_THAT(s.error_message(), HasSubstr("is not a valid tutti.v1.")) << m;
  }
  for (const char* m : {"/tutti.v1.Stager/RegisterRank", "/tutti.v1.Stager/AcquireBatch",
                        "/tutti.v1.Stager/ReleaseBatch", "/tutti.v1.Stager/RenewLeases"}) {
    EXPECT_EQ(RawCall(stager_ch, m, "\x0a\x05\x01").error_code(),
              grpc::StatusCode::INVALID_ARGUMENT)
        << m;
  }
  // Larger than --max_request_bytes.
  v1::StepTimingReport big;
  big.add_phases()->set_phase(std::string(2000, 'x'));
  grpc::Status s = RawCall(packer_ch, "/tutti.v1.Packer/ReportTiming", big.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--max_request_bytes"));
  // More repeated entries than the job has ranks, or phases.
  v1::GetPlanRequest ranks;
  for (int r = 0; r < 5; ++r) ranks.add_ranks(r);
  s = RawCall(packer_ch, "/tutti.v1.Packer/GetPlan", ranks.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("names 5 ranks but the job has 4"));
  v1::StepTimingReport phases;
  for (int p = 0; p < 33; ++p) phases.add_phases()->set_phase("p");
  s = RawCall(packer_ch, "/tutti.v1.Packer/ReportTiming", phases.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A release of a step no batch was handed out for adds nothing to the window.
  auto stub = v1::Stager::NewStub(stager_ch);
  {
    grpc::ClientContext ctx;
    v1::AcquireBatchRequest req;
    req.set_rank(0);
    v1::BatchDescriptor d;
    ASSERT_TRUE(stub->AcquireBatch(WithDeadline(&ctx), req, &d).ok());
  }
  for (uint64_t step : {uint64_t{1000}, uint64_t{1} << 40}) {
    grpc::ClientContext ctx;
    v1::ReleaseBatchRequest req;
    req.set_rank(0);
    req.set_step(step);
    v1::ReleaseBatchResponse resp;
    grpc::Status r = stub->ReleaseBatch(WithDeadline(&ctx), req, &resp);
    EXPECT_EQ(r.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << step;
    EXPECT_THAT(r.error_message(), HasSubstr("no batch that far ahead")) << step;
  }
  const std::string pm = Metrics(cluster_->packer());
  EXPECT_THAT(pm, HasSubstr("tutti_rpc_refused_total{reason=\"unparseable\",service=\"tutti.v1."
                            "Packer\"} 3"));
  EXPECT_THAT(pm, HasSubstr("tutti_rpc_refused_total{reason=\"too_large\",service=\"tutti.v1."
                            "Packer\"} 1"));
  EXPECT_THAT(pm, HasSubstr("tutti_rpc_refused_total{reason=\"too_many_items\",service=\"tutti."
                            "v1.Packer\"} 2"));
  EXPECT_THAT(Metrics(cluster_->stager(0)),
              HasSubstr("tutti_rpc_refused_total{reason=\"release_refused\",service=\"tutti.v1."
                        "Stager\"} 2"));
}

// Runs the unprivileged client as `uid` with primary group `gid` and
// supplementary `groups` (comma-separated), taking rank `rank`'s first batch
// from `stager`; its exit status and output.
RunResult RunClientAs(uint32_t uid, uint32_t gid, const std::string& groups,
                      const std::string& stager, const std::string& packer, int rank) {
  return RunCommand({TUTTI_UNPRIVILEGED_CLIENT, absl::StrCat("--uid=", uid),
                     absl::StrCat("--gid=", gid), "--groups=" + groups, "--stager=" + stager,
                     "--packer=" + packer, absl::StrCat("--rank=", rank), "--world_size=4"},
                    absl::Seconds(90));
}

TEST_F(Security, TheUnixSocketAdmitsItsGroupAndRefusesOthersWhateverTheFileMode) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "this test runs clients as other users, which needs root";
  }
  // Numeric users and groups, as in a container (no /etc/passwd entries).
  const uint32_t group = 40000 + static_cast<uint32_t>(::getpid() % 20000);
  const uint32_t member = group, stranger = group + 1, other_group = group + 2;
  const std::string sock_dir = dir_ + "/sock";
  std::filesystem::create_directories(sock_dir);
  for (const std::string& d : {dir_, sock_dir}) ::chmod(d.c_str(), 0755);
  const std::string sock = "unix://" + sock_dir + "/stager.sock";
  StartCluster({}, {"--listen=" + sock, "--socket_group=" + std::to_string(group)}, /*nodes=*/1);
  ASSERT_EQ(stager(0), sock);

  // A member of the socket's group (a supplementary one, like a pod's
  // supplementalGroups) takes a batch end to end.
  RunResult in_group = RunClientAs(member, other_group, std::to_string(group), sock, packer(), 0);
  EXPECT_EQ(in_group.status, 0) << in_group.output;
  EXPECT_THAT(in_group.output, HasSubstr("ok step=0"));

  // An operator's mistake opens the socket file to everyone: the kernel
  // would let anyone connect, the daemon still refuses who is not admitted.
  ASSERT_EQ(::chmod((sock_dir + "/stager.sock").c_str(), 0666), 0);
  RunResult refused = RunClientAs(stranger, other_group, "", sock, packer(), 1);
  EXPECT_NE(refused.status, 0) << refused.output;
  // Refused at the door, not later by the batch segments' mode, and told why.
  EXPECT_THAT(refused.output, HasSubstr("connect: "));
  EXPECT_THAT(refused.output,
              HasSubstr(absl::StrCat("uid ", stranger, " (gid ", other_group, ", groups none")));
  EXPECT_THAT(refused.output, HasSubstr("may not use this socket"));
  EXPECT_THAT(refused.output, ::testing::Not(HasSubstr("ok step")));
  const std::string log = cluster_->stager(0).log();
  EXPECT_THAT(log, HasSubstr("connection refused by its peer's credentials"));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("uid ", stranger, " (gid ", other_group)));
  EXPECT_THAT(log, HasSubstr(absl::StrCat("members of group ", group)));
  const std::optional<double> count = MetricValue(
      Metrics(cluster_->stager(0)),
      "tutti_rpc_refused_total{reason=\"peer_credentials\",service=\"tutti.v1.Stager\"}");
  ASSERT_TRUE(count.has_value());
  EXPECT_GE(*count, 1);

  // The same user with the socket's group as its primary one gets in.
  RunResult primary = RunClientAs(stranger, group, "", sock, packer(), 1);
  EXPECT_EQ(primary.status, 0) << primary.output;
  EXPECT_THAT(primary.output, HasSubstr("ok step=0"));

  // Root, which is also the daemon's user here: the health service and every
  // RPC answer on the socket.
  auto channel = MakeChannel(sock);
  auto health = grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "tutti.v1.Stager"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(WithDeadline(&ctx), req, &resp).ok()) << service;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  grpc::ClientContext ctx;
  v1::StageStatus st;
  EXPECT_TRUE(v1::Stager::NewStub(channel)
                  ->GetStageStatus(WithDeadline(&ctx), v1::GetStageStatusRequest(), &st)
                  .ok());
}

TEST_F(Security, ANonLoopbackAddressServedUnprotectedIsWarnedAbout) {
  const std::string job = dir_ + "/job.textproto";
  std::ofstream(job) << JobConfigText(index_, 1);
  struct Case {
    std::vector<std::string> flags;
    const char* warning;  // nullptr: none
  };
  const std::vector<Case> cases = {
      {{},
       "serving insecurely on 0.0.0.0:0: it is not a loopback address or a Unix socket, "
       "and no TLS is configured"},
      {{"--token_file=" + pki_.token}, "and no TLS is configured"},
      {{"--tls_cert=" + pki_.cert, "--tls_key=" + pki_.key}, "and no token or mutual TLS"},
      {{"--tls_cert=" + pki_.cert, "--tls_key=" + pki_.key, "--token_file=" + pki_.token}, nullptr},
  };
  int n = 0;
  for (const Case& c : cases) {
    std::vector<std::string> argv = {Packerd(), "--config=" + job, "--listen=0.0.0.0:0",
                                     "--metrics=127.0.0.1:0"};
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    auto d = Daemon::Start(absl::StrCat("packer", n++), argv, dir_);
    ASSERT_TRUE(d.ok()) << d.status();
    if (c.warning != nullptr) {
      EXPECT_THAT((*d)->log(), HasSubstr(c.warning));
      EXPECT_THAT((*d)->log(), HasSubstr("--tls_cert"));
    } else {
      EXPECT_THAT((*d)->log(), ::testing::Not(HasSubstr("insecurely")));
    }
    EXPECT_TRUE((*d)->Stop().ok());
  }
  // A certificate gRPC cannot use is bad usage, before anything starts.
  RunResult r =
      RunCommand({Packerd(), "--config=" + job, "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0",
                  "--tls_cert=" + pki_.token, "--tls_key=" + pki_.key},
                 absl::Seconds(60));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("is not PEM"));
}

// A token file other users may read is refused at start by both daemons and
// by libtutti, naming the mode and `chmod 600`, as ssh refuses such a key;
// shared with the job's group (0640) it is used.
TEST_F(Security, ATokenFileOthersCanReadIsRefusedByBothDaemonsAndTheClient) {
  const std::string job = dir_ + "/job.textproto";
  std::ofstream(job) << JobConfigText(index_, 1);
  const std::string open = dir_ + "/open-token";
  fs::copy_file(pki_.token, open, fs::copy_options::overwrite_existing);
  ASSERT_EQ(::chmod(open.c_str(), 0644), 0);
  const std::string want =
      "the token file '" + open + "' is open to every user of this host " +
      "(mode 0644): whoever reads it can act as the job. Make it private: " + "chmod 600 '" + open +
      "'";
  const std::vector<std::string> packer = {Packerd(), "--config=" + job, "--listen=127.0.0.1:0",
                                           "--metrics=127.0.0.1:0"};
  const std::vector<std::string> stager = {Stagerd(),
                                           "--packer=127.0.0.1:1",
                                           "--source=" + source_,
                                           "--cache=" + dir_ + "/cache",
                                           "--listen=127.0.0.1:0",
                                           "--metrics=127.0.0.1:0"};
  for (std::vector<std::string> argv : {packer, stager}) {
    argv.push_back("--token_file=" + open);
    RunResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_EQ(r.status, 2) << CommandLine(argv) << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(want)) << CommandLine(argv);
    r = RunCommand(std::vector<std::string>(argv.begin(), argv.end() - 1), absl::Seconds(30),
                   {"TUTTI_TOKEN_FILE=" + open});
    EXPECT_EQ(r.status, 2) << CommandLine(argv) << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(want)) << CommandLine(argv);
  }
  ClientOptions o = RankOptions("127.0.0.1:1", "127.0.0.1:1", 0, 4);
  o.security.token_file = open;
  auto client = Client::Connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()), HasSubstr(want));
  // The job's group may share it.
  ASSERT_EQ(::chmod(open.c_str(), 0640), 0);
  SecurityOptions shared;
  shared.token_file = open;
  EXPECT_TRUE(
      ResolveSecurityOptions(shared, [](const char*) -> const char* { return nullptr; }).ok());
}

// A FIFO (nobody writing) where a daemon or a command expects a file it
// reads: the job config, the index, the token, a certificate, a key. Each is
// refused at once with a message naming the path, instead of blocking in
// open(2) (each run is bounded: a blocked one times out and fails).
TEST_F(Security, AFifoGivenAsAnInputFileIsRefusedAtOnce) {
  const std::string job = dir_ + "/job.textproto";
  std::ofstream(job) << JobConfigText(index_, 1);
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::vector<std::string> packer = {Packerd(), "--listen=127.0.0.1:0",
                                           "--metrics=127.0.0.1:0"};
  const std::vector<std::string> stager = {Stagerd(), "--packer=127.0.0.1:1",
                                           "--source=" + source_, "--cache=" + dir_ + "/cache",
                                           "--listen=127.0.0.1:0", "--metrics=127.0.0.1:0"};
  const std::vector<std::vector<std::string>> cases = {
      {"--config=" + fifo},
      {"--config=" + job, "--index=" + fifo},
      {"--config=" + job, "--token_file=" + fifo},
      {"--config=" + job, "--tls_cert=" + fifo, "--tls_key=" + pki_.key},
      {"--config=" + job, "--tls_cert=" + pki_.cert, "--tls_key=" + fifo},
      {"--config=" + job, "--tls_cert=" + pki_.cert, "--tls_key=" + pki_.key, "--tls_mutual",
       "--tls_ca=" + fifo},
      {"stager", "--token_file=" + fifo},
      {"stager", "--tls_ca=" + fifo},
      {"plan", "--config=" + fifo},
      {"plan", "--config=" + job, "--index=" + fifo},
      {"stage", "--index=" + fifo, "--cache=" + dir_ + "/stage-cache"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv;
    std::vector<std::string> env;
    if (c[0] == "stager") {
      argv = stager;
      argv.insert(argv.end(), c.begin() + 1, c.end());
    } else if (c[0] == "plan" || c[0] == "stage") {
      argv = {TuttiCli(), c[0]};
      argv.insert(argv.end(), c.begin() + 1, c.end());
    } else {
      argv = packer;
      argv.insert(argv.end(), c.begin(), c.end());
    }
    RunResult r = RunCommand(argv, absl::Seconds(30));
    EXPECT_FALSE(r.timed_out) << CommandLine(argv) << " blocked reading the FIFO";
    EXPECT_NE(r.status, 0) << CommandLine(argv) << "\n" << r.output;
    EXPECT_THAT(r.output, HasSubstr(fifo + " is not a regular file (a FIFO)"))
        << CommandLine(argv) << "\n" << r.output;
  }
  // The token file named by the environment, as a Kubernetes Secret would be.
  RunResult r = RunCommand({Packerd(), "--config=" + job, "--listen=127.0.0.1:0",
                            "--metrics=127.0.0.1:0"},
                           absl::Seconds(30), {"TUTTI_TOKEN_FILE=" + fifo});
  EXPECT_FALSE(r.timed_out) << "blocked reading TUTTI_TOKEN_FILE";
  EXPECT_THAT(r.output, HasSubstr(fifo + " is not a regular file (a FIFO)")) << r.output;
}

}  // namespace
}  // namespace tutti::e2e
