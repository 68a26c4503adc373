// The pieces of the access model that need no daemon: how operators'
// settings resolve (files and environment), which addresses count as local,
// which rank a caller may act as, and the gate's bounds on calls.
#include "common/rpc_security.h"

#include <grpcpp/support/byte_buffer.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/rank_identity.h"
#include "common/rpc_gate.h"
#include "common/security_options.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tutti/v1/packer.pb.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

// A file only its owner may read, as a secret is kept (`mode`: another).
std::string TempFile(const std::string& name, const std::string& text, mode_t mode = 0600) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path =
      std::string(dir ? dir : "/tmp") + "/tutti_sec_" + std::to_string(::getpid()) + "_" + name;
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

// An environment for ResolveSecurityOptions.
struct Env {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> fn() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(SecurityOptionsTest, TokenComesFromTheFileOrTheEnvironmentNeverBoth) {
  const std::string file = TempFile("token", "  s3cret-token\n");
  Env env{{{"TUTTI_TOKEN_FILE", file}}};
  auto o = ResolveSecurityOptions({}, env.fn());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->token, "s3cret-token");

  Env plain{{{"TUTTI_TOKEN", "from-env"}}};
  o = ResolveSecurityOptions({}, plain.fn());
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->token, "from-env");

  Env both{{{"TUTTI_TOKEN", "a"}, {"TUTTI_TOKEN_FILE", file}}};
  o = ResolveSecurityOptions({}, both.fn());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);

  Env empty{{{"TUTTI_TOKEN_FILE", TempFile("empty", "\n")}}};
  o = ResolveSecurityOptions({}, empty.fn());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("is empty"));

  Env missing{{{"TUTTI_TOKEN_FILE", "/nonexistent/token"}}};
  o = ResolveSecurityOptions({}, missing.fn());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("/nonexistent/token"));

  Env binary{{{"TUTTI_TOKEN", "with space"}}};
  o = ResolveSecurityOptions({}, binary.fn());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("printable ASCII"));
}

// A token file or private key other users may read is refused, naming the
// mode and the fix, as ssh refuses such a key; the job's group may read it.
TEST(SecurityOptionsTest, ASecretOtherUsersCanReadIsRefusedNamingChmod) {
  for (const mode_t mode : {0644, 0604, 0602, 0666}) {
    const std::string file = TempFile("open-token", "s3cret-token\n", mode);
    Env env{{{"TUTTI_TOKEN_FILE", file}}};
    auto o = ResolveSecurityOptions({}, env.fn());
    ASSERT_FALSE(o.ok()) << std::oct << mode;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string m(o.status().message());
    EXPECT_THAT(m, HasSubstr("the token file '" + file + "' is open to every user"));
    EXPECT_THAT(m, HasSubstr(absl::StrFormat("(mode %04o)", mode)));
    EXPECT_THAT(m, HasSubstr("chmod 600 '" + file + "'"));
    SecurityOptions flag;
    flag.token_file = file;
    EXPECT_FALSE(ResolveSecurityOptions(flag, Env{}.fn()).ok());
  }
  for (const mode_t mode : {0600, 0640, 0400, 0440}) {
    Env env{{{"TUTTI_TOKEN_FILE", TempFile("private-token", "s3cret-token\n", mode)}}};
    auto o = ResolveSecurityOptions({}, env.fn());
    ASSERT_TRUE(o.ok()) << std::oct << mode << " " << o.status();
    EXPECT_EQ(o->token, "s3cret-token");
  }
  // A private key alike; the certificate and the CA are public.
  const std::string pem = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
  SecurityOptions tls;
  tls.tls_cert_file = TempFile("cert.pem", pem, 0644);
  tls.tls_key_file = TempFile("key.pem", pem, 0644);
  auto o = ResolveSecurityOptions(tls, Env{}.fn());
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("the TLS key '" + tls.tls_key_file + "' is open to every user"));
  ::chmod(tls.tls_key_file.c_str(), 0600);
  o = ResolveSecurityOptions(tls, Env{}.fn());
  EXPECT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(ReadPemFile(TempFile("key2.pem", pem, 0604), "TLS key", /*secret=*/true).ok());
}

TEST(SecurityOptionsTest, IncompleteTlsSettingsAreRefusedNamingTheFix) {
  const std::string pem = TempFile("x.pem", "-----BEGIN CERTIFICATE-----\nAA==\n-----END\n");
  SecurityOptions o;
  o.tls_cert_file = pem;
  auto r = ResolveSecurityOptions(o, Env{}.fn());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--tls_key"));

  o.tls_key_file = pem;
  o.tls_mutual = true;
  r = ResolveSecurityOptions(o, Env{}.fn());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("--tls_ca"));

  o.tls_ca_file = TempFile("not.pem", "hello");
  r = ResolveSecurityOptions(o, Env{}.fn());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("not PEM"));

  Env bad{{{"TUTTI_TLS_MUTUAL", "perhaps"}}};
  r = ResolveSecurityOptions({}, bad.fn());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SecurityOptionsTest, OnlyLoopbackAndUnixSocketsAreLocal) {
  for (const char* a : {"127.0.0.1:7070", "127.1.2.3:1", "[::1]:7070", "localhost:7070",
                        "unix:/run/tutti/stager.sock", "ipv4:127.0.0.1:5", "dns:///localhost:1"}) {
    EXPECT_TRUE(IsLocalAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:7070", "[::]:7070", "10.0.0.5:7070", "packer.svc:7070",
                        "128.0.0.1:1", "[::ffff:10.0.0.1]:1"}) {
    EXPECT_FALSE(IsLocalAddress(a)) << a;
  }
}

TEST(SecurityOptionsTest, NonLocalAddressWithoutTlsAndATokenOrMutualTlsIsWarnedAbout) {
  SecurityOptions o;
  std::string warned;
  auto warn = [&](const std::string& w) { warned = w; };
  EXPECT_TRUE(MakeServerCredentials(o, "127.0.0.1:0", warn).ok());
  EXPECT_TRUE(MakeServerCredentials(o, "unix:/tmp/x.sock", warn).ok());
  EXPECT_EQ(warned, "");
  EXPECT_TRUE(MakeServerCredentials(o, "0.0.0.0:0", warn).ok());
  EXPECT_THAT(warned, HasSubstr("serving insecurely on 0.0.0.0:0"));
  EXPECT_THAT(warned, HasSubstr("--tls_cert"));
  o.token = "t";  // a token without TLS travels in the clear
  warned.clear();
  EXPECT_TRUE(MakeServerCredentials(o, "0.0.0.0:0", warn).ok());
  EXPECT_THAT(warned, HasSubstr("no TLS"));
}

TEST(RankIdentitiesTest, ACallerActsOnlyAsItsOwnRankOfItsOwnJob) {
  RankIdentities ids(/*require=*/true);
  EXPECT_TRUE(absl::IsUnavailable(ids.Admit({0, "job"}, 0)));
  ids.SetJob("job");
  EXPECT_TRUE(ids.Admit({3, "job"}, 3).ok());
  EXPECT_TRUE(ids.Admit({3, ""}, 3).ok());

  absl::Status s = ids.Admit({1, "job"}, 0);
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0"));
  s = ids.Admit({0, "other-job"}, 0);
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("other-job"));
  s = ids.Admit({-1, "job"}, 0);
  EXPECT_TRUE(absl::IsPermissionDenied(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr(kRankKey));

  RankIdentities lax(/*require=*/false);
  lax.SetJob("job");
  EXPECT_TRUE(lax.Admit({-1, ""}, 0).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(lax.Admit({1, ""}, 0)));
}

grpc::ByteBuffer BytesOf(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(RpcGateTest, RefusesUnparseableTooLargeAndTooManyCalls) {
  RpcGateOptions o;
  o.max_request_bytes = 1024;
  o.max_calls = 16;
  auto registry = std::make_shared<prometheus::Registry>();
  RpcGate gate(o, "tutti.v1.Packer", registry.get());
  grpc::CallbackServerContext ctx;

  v1::GetPlanRequest req;
  absl::StatusOr<CallTicket> t = gate.Admit(ctx, BytesOf("\xff\xff\xff\xff"), &req);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("tutti.v1.GetPlanRequest"));

  v1::GetPlanRequest big;
  for (int i = 0; i < 600; ++i) big.add_ranks(100000 + i);
  t = gate.Admit(ctx, BytesOf(big.SerializeAsString()), &req);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("--max_request_bytes"));

  v1::GetPlanRequest ok;
  ok.set_step(7);
  std::vector<CallTicket> held;
  for (int i = 0; i < 16; ++i) {
    t = gate.Admit(ctx, BytesOf(ok.SerializeAsString()), &req);
    ASSERT_TRUE(t.ok()) << i << " " << t.status();
    held.push_back(*t);
  }
  EXPECT_EQ(req.step(), 7u);
  t = gate.Admit(ctx, BytesOf(ok.SerializeAsString()), &req);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("--max_calls"));
  held.pop_back();
  EXPECT_TRUE(gate.Admit(ctx, BytesOf(ok.SerializeAsString()), &req).ok());

  double refused = 0;
  for (const auto& family : registry->Collect()) {
    if (family.name != "tutti_rpc_refused_total") continue;
    for (const auto& m : family.metric) refused += m.counter.value;
  }
  EXPECT_EQ(refused, 3);
}

TEST(RpcGateTest, TokenIsCheckedBeforeAnythingElse) {
  RpcGateOptions o;
  o.security.token = "right";
  RpcGate gate(o, "tutti.v1.Stager", nullptr);
  grpc::CallbackServerContext ctx;  // carries no metadata
  v1::GetPlanRequest req;
  absl::StatusOr<CallTicket> t = gate.Admit(ctx, BytesOf("\xff"), &req);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("no job token"));
  EXPECT_THAT(std::string(t.status().message()), ::testing::Not(HasSubstr("right")));
}

}  // namespace
}  // namespace tutti
