#include "common/daemon_host.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tutti/v1/packer.grpc.pb.h"

namespace tutti {
namespace {

std::string PortFile(const char* name) {
  return absl::StrCat(::testing::TempDir(), "/daemon_host_", ::getpid(), "_", name, ".ports");
}

std::string Read(const std::string& path) {
  auto text = ReadFileToString(path);
  return text.ok() ? *text : "";
}

// What the standard health service says about `service` (UNKNOWN when the call fails).
grpc::health::v1::HealthCheckResponse::ServingStatus Health(int port, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(MakeChannel(absl::StrCat("127.0.0.1:", port)));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, req, &resp).ok() ? resp.status()
                                            : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

TEST(DaemonHost, NeverReadyBeforeThePortFileNamesTheGrpcPort) {
  const std::string ports = PortFile("ready");
  std::filesystem::remove(ports);
  auto host = DaemonHost::Start({"test-daemon", "127.0.0.1:0", ports});
  ASSERT_TRUE(host.ok()) << host.status();
  Readiness& ready = (*host)->readiness();
  ready.Require("work", "not done yet");
  EXPECT_EQ(Read(ports), absl::StrCat("metrics=", (*host)->metrics_port(), "\n"));
  v1::Packer::Service service;  // every method UNIMPLEMENTED; health is what counts here
  ASSERT_TRUE((*host)->ServeGrpc("127.0.0.1:0", {&service}, "tutti.v1.Packer").ok());
  // Everything the daemon needs is there, but it has not said it serves:
  // a script that waits for /readyz and then reads the port file must find
  // the gRPC port in it.
  ready.Set("work", absl::OkStatus());
  EXPECT_FALSE(ready.ready());
  EXPECT_EQ(ready.Check().message(), "serving: starting to serve");
  EXPECT_EQ(Read(ports).find("grpc="), std::string::npos);
  using grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(Health((*host)->grpc_port(), "tutti.v1.Packer"), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE((*host)->Serving().ok());
  EXPECT_TRUE(ready.ready()) << ready.Check();
  EXPECT_EQ(Health((*host)->grpc_port(), "tutti.v1.Packer"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health((*host)->grpc_port(), ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Read(ports), absl::StrCat("grpc=", (*host)->grpc_port(), "\nmetrics=",
                                      (*host)->metrics_port(), "\ngrpc_address=127.0.0.1:",
                                      (*host)->grpc_port(), "\n"));
  (*host)->Stop();
  EXPECT_FALSE(ready.ready());
  std::filesystem::remove(ports);
}

// A second server (a TCP address beside a Unix socket) reports the same
// readiness on its own health service and is named in the port file.
TEST(DaemonHost, ASecondGrpcServerFollowsReadinessAndIsInThePortFile) {
  const std::string ports = PortFile("more");
  std::filesystem::remove(ports);
  auto host = DaemonHost::Start({"test-daemon", "127.0.0.1:0", ports});
  ASSERT_TRUE(host.ok()) << host.status();
  v1::Packer::Service first, second;
  EXPECT_TRUE(absl::IsFailedPrecondition(
      (*host)->ServeMoreGrpc("peer_grpc", "127.0.0.1:0", {&second}).status()));
  ASSERT_TRUE((*host)->ServeGrpc("127.0.0.1:0", {&first}, "tutti.v1.Packer").ok());
  absl::StatusOr<int> port = (*host)->ServeMoreGrpc("peer_grpc", "127.0.0.1:0", {&second});
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  EXPECT_NE(*port, (*host)->grpc_port());
  using grpc::health::v1::HealthCheckResponse;
  EXPECT_EQ(Health(*port, "tutti.v1.Packer"), HealthCheckResponse::NOT_SERVING);
  ASSERT_TRUE((*host)->Serving().ok());
  EXPECT_EQ(Health(*port, "tutti.v1.Packer"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health((*host)->grpc_port(), "tutti.v1.Packer"), HealthCheckResponse::SERVING);
  EXPECT_EQ(Read(ports),
            absl::StrCat("grpc=", (*host)->grpc_port(), "\nmetrics=", (*host)->metrics_port(),
                         "\ngrpc_address=127.0.0.1:", (*host)->grpc_port(), "\npeer_grpc=", *port,
                         "\npeer_grpc_address=127.0.0.1:", *port, "\n"));
  (*host)->readiness().Set("work", absl::UnavailableError("not now"));
  EXPECT_EQ(Health(*port, "tutti.v1.Packer"), HealthCheckResponse::NOT_SERVING);
  (*host)->Stop();
  EXPECT_EQ(Health(*port, ""), HealthCheckResponse::UNKNOWN);  // no longer served
  std::filesystem::remove(ports);
}

TEST(DaemonHost, ServingBeforeServeGrpcIsRefused) {
  auto host = DaemonHost::Start({"test-daemon", "127.0.0.1:0", ""});
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_TRUE(absl::IsFailedPrecondition((*host)->Serving()));
}

}  // namespace
}  // namespace tutti
