// A small HTTP/1.1 server for a daemon's operational endpoints (/metrics,
// /healthz, /readyz): GET and HEAD, one response per connection
// ("Connection: close"). One thread polls every connection, so an idle or
// slow client never holds up another: a connection that has not sent its
// request and read the answer within `timeout` is closed, a request header over 8 KiB
// is refused (431), and beyond `max_connections` the oldest connection is
// dropped to make room. Stopping takes milliseconds.
//
// Thread-safe: the handler runs on the server's thread, one request at a
// time; the destructor may be called from any other thread.
#ifndef TUTTI_COMMON_HTTP_SERVER_H_
#define TUTTI_COMMON_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tutti {

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

// Answers one GET: `path` without the query string.
using HttpHandler = std::function<HttpResponse(absl::string_view path)>;

struct HttpServerOptions {
  absl::Duration timeout = absl::Seconds(10);  // from accept to the answer read
  int max_connections = 64;                            // open at once
};

class HttpServer {
 public:
  // Listens on `address` ("host:port", "[v6]:port"; port 0 = any free port).
  // A port in use or an address that does not resolve is UNAVAILABLE naming
  // the address (and `flag`, the option that set it, e.g. "--metrics").
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           HttpHandler handler,
                                                           absl::string_view flag,
                                                           HttpServerOptions options = {});
  ~HttpServer();  // stops: closes every connection and the listener

  int port() const { return port_; }

 private:
  struct Connection;
  HttpServer(int listen_fd, int wake_fd, int port, HttpHandler handler, HttpServerOptions options);
  void Loop();

  const int listen_fd_;
  const int wake_fd_;  // eventfd: written to stop the loop
  const int port_;
  const HttpHandler handler_;
  const HttpServerOptions options_;
  std::thread thread_;
};

// The reason phrase of a status code ("OK", "Not Found", ...).
absl::string_view HttpReason(int status);

}  // namespace tutti

#endif  // TUTTI_COMMON_HTTP_SERVER_H_
