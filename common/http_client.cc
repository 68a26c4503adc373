#include "common/http_client.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace tutti {

absl::StatusOr<std::string> HttpGet(int port, const std::string& target, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string where = absl::StrCat("GET http://127.0.0.1:", port, target);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, where);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, where);
  }
  const std::string req =
      absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    const int err = errno;
    ::close(fd);
    return ErrnoStatus(err, where);
  }
  std::string out;
  char buf[16384];
  for (;;) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd pfd{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0) {
      ::close(fd);
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": no complete answer within ", absl::FormatDuration(timeout)));
    }
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  if (out.rfind("HTTP/", 0) != 0 || body == std::string::npos) {
    return absl::DataLossError(absl::StrCat(where, ": not an HTTP answer: ", out.substr(0, 200)));
  }
  const std::string status_line = out.substr(0, out.find("\r\n"));
  if (status_line.find(" 200") == std::string::npos) {
    return absl::UnavailableError(
        absl::StrCat(where, ": ", status_line, "\n", out.substr(body + 4)));
  }
  return out.substr(body + 4);
}

std::optional<double> MetricValue(const std::string& exposition, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n', absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, " ")) continue;
    double v = 0;
    if (absl::SimpleAtod(line, &v)) return v;
  }
  return std::nullopt;
}

}  // namespace tutti
