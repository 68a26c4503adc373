#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "gtest/gtest.h"
#include <prometheus/counter.h>

namespace tutti {
namespace {

// GET /metrics over HTTP/1.0; "" when nothing listens.
std::string Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET /metrics HTTP/1.0\r\n\r\n";
  [[maybe_unused]] ssize_t w = ::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(MetricsServerTest, ServesAndStopsWithoutWaitingForTheListenerPoll) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("tutti_test_things_total").Help("things").Register(*registry).Add({}).Increment();
  int port = 0;
  auto exposer = StartMetricsServer("127.0.0.1:0", registry, &port);
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  ASSERT_GT(port, 0);
  EXPECT_NE(Scrape(port).find("tutti_test_things_total 1"), std::string::npos);
  // civetweb's idle listener polls every 2 s; a stop must not wait for it.
  const auto t0 = std::chrono::steady_clock::now();
  StopMetricsServer(std::move(*exposer), "127.0.0.1:0");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(Scrape(port), "");  // nothing listens any more
  StopMetricsServer(nullptr, "127.0.0.1:0");  // a no-op
}

TEST(MetricsServerTest, PortInUseIsAClearError) {
  auto registry = std::make_shared<prometheus::Registry>();
  int port = 0;
  auto first = StartMetricsServer("127.0.0.1:0", registry, &port);
  ASSERT_TRUE(first.ok());
  int again = 0;
  auto second = StartMetricsServer("127.0.0.1:" + std::to_string(port), registry, &again);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("--metrics"), std::string::npos) << second.status();
  StopMetricsServer(std::move(*first), "127.0.0.1:" + std::to_string(port));
}

}  // namespace
}  // namespace tutti
