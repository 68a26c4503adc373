#include "common/security_options.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_io.h"
#include "common/status.h"

namespace tutti {
namespace {

// The largest token or private key file read (a token is one line).
constexpr uint64_t kMaxSecretBytes = uint64_t{1} << 20;

// An environment variable's value, or empty.
std::string Env(const std::function<const char*(const char*)>& getenv, const char* name) {
  const char* v = getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The host part of "host:port", "[v6]:port" or "dns:///host:port".
std::string HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "dns:///")) address.remove_prefix(7);
  if (absl::StartsWith(address, "ipv4:") || absl::StartsWith(address, "ipv6:")) {
    address.remove_prefix(5);
  }
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    return std::string(
        address.substr(1, close == absl::string_view::npos ? address.npos : close - 1));
  }
  const size_t colon = address.rfind(':');
  return std::string(colon == absl::string_view::npos ? address : address.substr(0, colon));
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const char* what) {
  uint64_t size = 0;
  absl::StatusOr<int> fd = OpenRegularFile(path, &size);
  if (!fd.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the ", what, " '", path, "': ", fd.status().message()));
  }
  struct stat st {};
  absl::Status status;
  if (::fstat(*fd, &st) != 0) {
    status = ErrnoStatus(errno, absl::StrCat("stat ", path));
  } else if ((st.st_mode & S_IRWXO) != 0) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "the ", what, " '", path, "' is open to every user of this host (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777),
        "): whoever reads it can act as the job. Make it private: chmod 600 '", path,
        "' (640 to share it with the job's group; a Kubernetes Secret volume: defaultMode "
        "0400, or 0440 with fsGroup)"));
  } else if (size > kMaxSecretBytes) {
    status = absl::InvalidArgumentError(absl::StrCat("the ", what, " '", path, "' is ", size,
                                                     " bytes, more than a secret's ",
                                                     kMaxSecretBytes, "; is it the right file?"));
  }
  std::string text(status.ok() ? size : 0, '\0');
  for (size_t done = 0; status.ok() && done < text.size();) {
    const ssize_t n = ::pread(*fd, text.data() + done, text.size() - done, done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      status = n < 0 ? ErrnoStatus(errno, absl::StrCat("read ", path))
                     : absl::DataLossError(absl::StrCat(path, " shrank while it was read"));
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(*fd);
  if (!status.ok()) return status;
  return text;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what, bool secret) {
  if (secret) {
    ASSIGN_OR_RETURN(std::string text, ReadSecretFile(path, what));
    if (!absl::StrContains(text, "-----BEGIN ")) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", what, " '", path, "' is not PEM (no -----BEGIN line)"));
    }
    return text;
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the ", what, " '", path, "': ", text.status().message()));
  }
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " '", path, "' is not PEM (no -----BEGIN line)"));
  }
  return text;
}

absl::StatusOr<SecurityOptions> ResolveSecurityOptions(
    SecurityOptions o, const std::function<const char*(const char*)>& getenv_fn) {
  const std::function<const char*(const char*)> getenv =
      getenv_fn ? getenv_fn : [](const char* n) -> const char* { return std::getenv(n); };
  if (o.tls_cert_file.empty()) o.tls_cert_file = Env(getenv, "TUTTI_TLS_CERT");
  if (o.tls_key_file.empty()) o.tls_key_file = Env(getenv, "TUTTI_TLS_KEY");
  if (o.tls_ca_file.empty()) o.tls_ca_file = Env(getenv, "TUTTI_TLS_CA");
  if (o.tls_client_name.empty()) o.tls_client_name = Env(getenv, "TUTTI_TLS_CLIENT_NAME");
  if (o.tls_server_name.empty()) o.tls_server_name = Env(getenv, "TUTTI_TLS_SERVER_NAME");
  if (!o.tls_mutual) {
    const std::string m = absl::AsciiStrToLower(Env(getenv, "TUTTI_TLS_MUTUAL"));
    if (m == "1" || m == "true" || m == "yes") {
      o.tls_mutual = true;
    } else if (!m.empty() && m != "0" && m != "false" && m != "no") {
      return absl::InvalidArgumentError(absl::StrCat("TUTTI_TLS_MUTUAL='", m, "': use 1 or 0"));
    }
  }
  if (o.token_file.empty()) o.token_file = Env(getenv, "TUTTI_TOKEN_FILE");
  if (!o.token_file.empty()) {
    if (!o.token.empty() || !Env(getenv, "TUTTI_TOKEN").empty()) {
      return absl::InvalidArgumentError(
          "both a token and a token file are given (TUTTI_TOKEN and TUTTI_TOKEN_FILE or "
          "--token_file): give one");
    }
    ASSIGN_OR_RETURN(const std::string text, ReadSecretFile(o.token_file, "token file"));
    o.token = std::string(absl::StripAsciiWhitespace(text));
    if (o.token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the token file '", o.token_file, "' is empty"));
    }
  } else if (o.token.empty()) {
    o.token = std::string(absl::StripAsciiWhitespace(Env(getenv, "TUTTI_TOKEN")));
  }
  for (char c : o.token) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
      return absl::InvalidArgumentError(
          "the token holds a character that is not printable ASCII (it travels as gRPC "
          "metadata): generate one with `openssl rand -hex 32`");
    }
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS certificate needs its key and a key its certificate: give both --tls_cert and "
        "--tls_key (TUTTI_TLS_CERT and TUTTI_TLS_KEY)");
  }
  if (o.tls_mutual && (o.tls_ca_file.empty() || o.tls_cert_file.empty())) {
    return absl::InvalidArgumentError(
        "mutual TLS (--tls_mutual) needs the daemon's certificate and key and the CA that signs "
        "client certificates (--tls_ca)");
  }
  if (!o.tls_client_name.empty() && !o.tls_mutual) {
    return absl::InvalidArgumentError(
        "--tls_client_name needs --tls_mutual (it checks the client certificate)");
  }
  for (const auto& [path, what] :
       {std::pair{o.tls_cert_file, "TLS certificate"}, std::pair{o.tls_key_file, "TLS key"},
        std::pair{o.tls_ca_file, "TLS CA bundle"}}) {
    if (!path.empty()) {
      RETURN_IF_ERROR(ReadPemFile(path, what, path == o.tls_key_file).status());
    }
  }
  return o;
}

bool IsLocalAddress(absl::string_view address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  const std::string host = HostOf(address);
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace tutti
