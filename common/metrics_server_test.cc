#include "common/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include "gtest/gtest.h"

namespace tutti {
namespace {

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` and reads the whole answer; "" when nothing listens or no
// answer came within `timeout` (a generous deadline, not a measurement).
std::string Exchange(int port, const std::string& request, int timeout_s = 20) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  [[maybe_unused]] ssize_t w = ::write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::string Get(int port, const std::string& path, int timeout_s = 20) {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n", timeout_s);
}

struct Served {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::atomic<bool> ready{false};
  std::unique_ptr<MetricsServer> server;

  Served() {
    prometheus::BuildCounter().Name("tutti_test_things_total").Help("things").Register(*registry)
        .Add({}).Increment();
    MetricsEndpoints e;
    e.collectables = {registry};
    e.ready = [this] {
      return ready ? absl::OkStatus() : absl::UnavailableError("index: loading\nthe index");
    };
    auto s = MetricsServer::Start("127.0.0.1:0", std::move(e));
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server = std::move(*s);
  }
};

TEST(MetricsServerTest, ServesMetricsHealthAndReadiness) {
  Served s;
  ASSERT_TRUE(s.server);
  const int port = s.server->port();
  const std::string metrics = Get(port, "/metrics");
  EXPECT_EQ(metrics.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << metrics;
  EXPECT_NE(metrics.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics.find("tutti_test_things_total 1"), std::string::npos) << metrics;
  const std::string live = Get(port, "/healthz");
  EXPECT_EQ(live.rfind("HTTP/1.1 200 OK", 0), 0u) << live;
  EXPECT_NE(live.find("\r\n\r\nok\n"), std::string::npos) << live;
  const std::string not_ready = Get(port, "/readyz?verbose");
  EXPECT_EQ(not_ready.rfind("HTTP/1.1 503 Service Unavailable", 0), 0u) << not_ready;
  // One line: the reason's own line breaks are flattened.
  EXPECT_NE(not_ready.find("\r\n\r\nnot ready: index: loading the index\n"), std::string::npos)
      << not_ready;
  s.ready = true;
  EXPECT_NE(Get(port, "/readyz").find("\r\n\r\nready\n"), std::string::npos);
  EXPECT_EQ(Get(port, "/other").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  const std::string head = Exchange(port, "HEAD /healthz HTTP/1.0\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200", 0), 0u) << head;
  EXPECT_EQ(head.find("ok\n"), std::string::npos) << head;  // no body
  EXPECT_EQ(Exchange(port, std::string(9000, 'x')).rfind("HTTP/1.1 431", 0), 0u);
}

TEST(MetricsServerTest, IdleConnectionsNeverDelayAScrape) {
  // A client that connects and sends nothing (a port scanner, a stuck
  // proxy) held civetweb's only worker until it timed out.
  Served s;
  ASSERT_TRUE(s.server);
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) idle.push_back(Connect(s.server->port()));
  const std::string half_request = "GET /metr";  // and one that stops mid-request
  [[maybe_unused]] ssize_t w = ::write(idle.back(), half_request.data(), half_request.size());
  EXPECT_NE(Get(s.server->port(), "/metrics", /*timeout_s=*/10).find("tutti_test_things_total 1"),
            std::string::npos);
  for (int fd : idle) ::close(fd);
}

TEST(MetricsServerTest, ConcurrentScrapesAreAllAnswered) {
  Served s;
  ASSERT_TRUE(s.server);
  std::atomic<int> answered{0};
  std::vector<std::thread> scrapers;
  for (int t = 0; t < 8; ++t) {
    scrapers.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        answered += Get(s.server->port(), "/metrics").find("tutti_test_things_total 1") !=
                    std::string::npos;
      }
    });
  }
  for (auto& t : scrapers) t.join();
  EXPECT_EQ(answered.load(), 80);
}

TEST(MetricsServerTest, AClientThatNeverSendsIsDroppedAtTheTimeout) {
  HttpServerOptions o;
  o.timeout = absl::Milliseconds(200);
  auto http = HttpServer::Start(
      "127.0.0.1:0", [](absl::string_view) { return HttpResponse{}; }, "--metrics", o);
  ASSERT_TRUE(http.ok()) << http.status();
  const int fd = Connect((*http)->port());
  ASSERT_GE(fd, 0);
  timeval tv{20, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  EXPECT_EQ(::read(fd, &c, 1), 0);  // closed by the server, not by our read timeout
  ::close(fd);
}

TEST(MetricsServerTest, PortInUseIsAClearErrorAndStoppingFreesThePort) {
  Served first;
  ASSERT_TRUE(first.server);
  const int port = first.server->port();
  auto second = MetricsServer::Start("127.0.0.1:" + std::to_string(port), {});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << second.status();
  EXPECT_NE(second.status().message().find("in use"), std::string::npos) << second.status();
  EXPECT_NE(second.status().message().find("--metrics"), std::string::npos) << second.status();
  first.server.reset();
  EXPECT_EQ(Get(port, "/metrics"), "");  // nothing listens any more
  auto again = MetricsServer::Start("127.0.0.1:" + std::to_string(port), {});
  EXPECT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(MetricsServer::Start("no-such-host.invalid:1", {}).ok());
}

}  // namespace
}  // namespace tutti
