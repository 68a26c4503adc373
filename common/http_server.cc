#include "common/http_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tutti {
namespace {

constexpr size_t kMaxHeader = 8192;

// "host:port" or "[v6]:port" -> (host, port); "" host = any address.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  return !port->empty();
}

std::string Render(const HttpResponse& r, bool head) {
  std::string out = absl::StrCat("HTTP/1.1 ", r.status, " ", HttpReason(r.status),
                                 "\r\nContent-Type: ", r.content_type,
                                 "\r\nContent-Length: ", r.body.size(),
                                 "\r\nConnection: close\r\n");
  if (r.status == 405) out += "Allow: GET, HEAD\r\n";
  out += "\r\n";
  if (!head) out += r.body;
  return out;
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

absl::string_view HttpReason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

struct HttpServer::Connection {
  int fd = -1;
  absl::Time deadline;
  std::string in;
  std::string out;  // the response, once there is one
  size_t sent = 0;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              HttpHandler handler,
                                                              absl::string_view flag,
                                                              HttpServerOptions options) {
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot serve HTTP on '", address, "': not HOST:PORT; fix ", flag));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve HTTP on ", address, ": ",
                                               ::gai_strerror(gai), "; fix ", flag));
  }
  int fd = -1;
  int err = 0;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // past TIME_WAIT, not shared
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      err = errno;
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve HTTP on ", address, ": ", std::strerror(err),
        err == EADDRINUSE ? "; the port is in use: stop the other process or pick another with "
                          : "; the address is invalid here: pick another with ",
        flag));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int e = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(e)));
  }
  std::unique_ptr<HttpServer> s(
      new HttpServer(fd, wake, bound_port, std::move(handler), options));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

HttpServer::HttpServer(int listen_fd, int wake_fd, int port, HttpHandler handler,
                       HttpServerOptions options)
    : listen_fd_(listen_fd), wake_fd_(wake_fd), port_(port), handler_(std::move(handler)),
      options_(options) {}

HttpServer::~HttpServer() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void HttpServer::Loop() {
  std::list<Connection> conns;  // oldest first
  std::vector<pollfd> fds;
  std::vector<std::list<Connection>::iterator> order;
  auto close_conn = [&](std::list<Connection>::iterator it) {
    ::close(it->fd);
    return conns.erase(it);
  };
  // Answers a whole request header; false when more must be read first.
  auto respond = [&](Connection& c) {
    const size_t end = c.in.find("\r\n\r\n");
    const size_t lf_end = c.in.find("\n\n");
    if (end == std::string::npos && lf_end == std::string::npos) {
      if (c.in.size() > kMaxHeader) {
        c.out = Render(Plain(431, "request header too large\n"), false);
        return true;
      }
      return false;
    }
    const absl::string_view line(c.in.data(), c.in.find_first_of("\r\n"));
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.size() < 2 || !absl::StartsWith(parts[1], "/")) {
      c.out = Render(Plain(400, "bad request\n"), false);
      return true;
    }
    const bool head = parts[0] == "HEAD";
    if (parts[0] != "GET" && !head) {
      c.out = Render(Plain(405, "only GET and HEAD\n"), false);
      return true;
    }
    absl::string_view path = parts[1];
    if (const size_t q = path.find('?'); q != absl::string_view::npos) path = path.substr(0, q);
    c.out = Render(handler_(path), head);
    return true;
  };
  while (true) {
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Seconds(1);
    for (auto it = conns.begin(); it != conns.end();) {
      if (it->deadline <= now) {
        it = close_conn(it);  // never sent a whole request, or never read the answer
        continue;
      }
      next = std::min(next, it->deadline);
      ++it;
    }
    fds.clear();
    order.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      fds.push_back({it->fd, static_cast<short>(it->out.empty() ? POLLIN : POLLOUT), 0});
      order.push_back(it);
    }
    const int timeout_ms =
        static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(next - now) + 1));
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) break;
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = order[i - 2];
      Connection& c = *it;
      const short ev = fds[i].revents;
      if (ev == 0) continue;
      if (c.out.empty() && (ev & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        bool closed = false;
        while (true) {
          const ssize_t r = ::recv(c.fd, buf, sizeof(buf), 0);
          if (r > 0) {
            c.in.append(buf, static_cast<size_t>(r));
            if (c.in.size() > kMaxHeader + sizeof(buf)) break;
            continue;
          }
          if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
          closed = true;  // end of file or error before a whole request
          break;
        }
        if (!respond(c) && closed) {
          close_conn(it);
          continue;
        }
      }
      if (!c.out.empty()) {
        while (c.sent < c.out.size()) {
          const ssize_t w =
              ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
          if (w > 0) {
            c.sent += static_cast<size_t>(w);
            continue;
          }
          if (w < 0 && (errno == EAGAIN || errno == EINTR)) break;
          c.sent = c.out.size();  // the client is gone
        }
        if (c.sent == c.out.size()) {
          ::shutdown(c.fd, SHUT_WR);
          close_conn(it);
        }
      }
    }
    if (fds[1].revents & POLLIN) {
      while (true) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        if (static_cast<int>(conns.size()) >= options_.max_connections) close_conn(conns.begin());
        Connection c;
        c.fd = fd;
        c.deadline = absl::Now() + options_.timeout;
        conns.push_back(std::move(c));
      }
    }
  }
  for (auto& c : conns) ::close(c.fd);
}

}  // namespace tutti
