#include "common/rpc_security.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/file_io.h"
#include "common/grpc_status.h"
#include "common/status.h"

namespace tutti {
namespace {

// Equal strings in time that depends only on their lengths.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

// Adds the token and the identity to every call of a channel.
class MetadataInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetadataInterceptor(const std::string* bearer, const ClientIdentity* id)
      : bearer_(bearer), id_(id) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      auto* md = methods->GetSendInitialMetadata();
      if (!bearer_->empty()) md->insert({kAuthorizationKey, *bearer_});
      if (id_->rank >= 0) md->insert({kRankKey, absl::StrCat(id_->rank)});
      if (!id_->job_id.empty()) md->insert({kJobKey, id_->job_id});
    }
    methods->Proceed();
  }

 private:
  const std::string* bearer_;
  const ClientIdentity* id_;
};

class MetadataInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  MetadataInterceptorFactory(std::string token, ClientIdentity id)
      : bearer_(token.empty() ? std::string() : absl::StrCat("Bearer ", token)),
        id_(std::move(id)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new MetadataInterceptor(&bearer_, &id_);
  }

 private:
  const std::string bearer_;
  const ClientIdentity id_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityOptions& o, const std::string& listen,
    const std::function<void(const std::string&)>& warn) {
  const bool authenticated = o.tls_server() && (!o.token.empty() || o.tls_mutual);
  if (!authenticated && !IsLocalAddress(listen)) {
    const std::string why = absl::StrCat(
        listen, ": it is not a loopback address or a Unix socket, and ",
        o.tls_server() ? "no token or mutual TLS" : "no TLS",
        " is configured: anyone who can reach it could read the job and take its batches");
    warn(absl::StrCat("serving insecurely on ", why,
                      ". Give a certificate and key (--tls_cert, --tls_key) and the job's token "
                      "(--token_file, TUTTI_TOKEN_FILE or TUTTI_TOKEN), or mutual TLS "
                      "(--tls_mutual --tls_ca)"));
  }
  // On a Unix socket the kernel says who connects (peer credentials and the
  // socket's mode and group); TLS adds nothing there.
  if (!o.tls_server() || absl::StartsWith(listen, "unix:")) {
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(
      o.tls_mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ASSIGN_OR_RETURN(std::string cert, ReadPemFile(o.tls_cert_file, "TLS certificate"));
  ASSIGN_OR_RETURN(std::string key, ReadPemFile(o.tls_key_file, "TLS key", /*secret=*/true));
  ssl.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
  if (o.tls_mutual) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(o.tls_ca_file, "TLS CA bundle"));
  }
  return grpc::SslServerCredentials(ssl);
}

CallAuthenticator::CallAuthenticator(const SecurityOptions& o)
    : token_(o.token), client_name_(o.tls_client_name) {}

absl::Status CallAuthenticator::Check(const grpc::ServerContextBase& ctx) const {
  if (!token_.empty()) {
    const auto& md = ctx.client_metadata();
    auto it = md.find(kAuthorizationKey);
    if (it == md.end()) {
      return absl::UnauthenticatedError(
          "the call carries no job token: give the client the job's token (TUTTI_TOKEN or "
          "TUTTI_TOKEN_FILE)");
    }
    const absl::string_view value(it->second.data(), it->second.size());
    if (!absl::StartsWith(value, "Bearer ") || !SameSecret(value.substr(7), token_)) {
      return absl::UnauthenticatedError(
          "the call's job token is wrong: this daemon serves another job, or the token was "
          "rotated (check TUTTI_TOKEN / TUTTI_TOKEN_FILE)");
    }
  }
  if (!client_name_.empty()) {
    const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    bool named = false;
    if (auth != nullptr) {
      for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
        for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
          named = named || absl::string_view(v.data(), v.size()) == client_name_;
        }
      }
    }
    if (!named) {
      return absl::UnauthenticatedError(
          absl::StrCat("the client certificate does not name '", client_name_,
                       "' (--tls_client_name): it belongs to another job or client"));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> MakeSecureChannel(const std::string& address,
                                                 const SecurityOptions& o,
                                                 const ClientIdentity& identity) {
  grpc::ChannelArguments args = DefaultChannelArguments();
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (o.tls_client() && !absl::StartsWith(address, "unix:")) {
    grpc::SslCredentialsOptions ssl;
    // ResolveSecurityOptions read these already; a file gone since then
    // fails the handshake, which the client reports as UNAVAILABLE.
    ssl.pem_root_certs = ReadFileToString(o.tls_ca_file).value_or("");
    if (!o.tls_cert_file.empty()) {
      ssl.pem_cert_chain = ReadFileToString(o.tls_cert_file).value_or("");
      ssl.pem_private_key = ReadFileToString(o.tls_key_file).value_or("");
    }
    creds = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) {
      args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, o.tls_server_name);
    }
  }
  if (o.token.empty() && identity.rank < 0 && identity.job_id.empty()) {
    return grpc::CreateCustomChannel(address, creds, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> icpt;
  icpt.push_back(std::make_unique<MetadataInterceptorFactory>(o.token, identity));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args,
                                                                 std::move(icpt));
}

absl::StatusOr<ClientIdentity> CallIdentity(const grpc::ServerContextBase& ctx) {
  ClientIdentity id;
  const auto& md = ctx.client_metadata();
  auto value = [&](const char* key) -> std::optional<absl::string_view> {
    auto it = md.find(key);
    if (it == md.end()) return std::nullopt;
    return absl::string_view(it->second.data(), it->second.size());
  };
  if (auto rank = value(kRankKey)) {
    uint32_t r = 0;
    if (!absl::SimpleAtoi(*rank, &r)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata ", kRankKey, " '", *rank, "' is not a rank"));
    }
    id.rank = r;
  }
  if (auto job = value(kJobKey)) id.job_id = std::string(*job);
  return id;
}

}  // namespace tutti
