#include "common/rpc/security.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/status.h"

namespace specwire {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read \"", path, "\""));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (ss.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", path, "\" is empty"));
  }
  return ss.str();
}

absl::string_view SliceView(const grpc_slice& s) {
  return absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)),
                           GRPC_SLICE_LENGTH(s));
}

// The token check, run by gRPC core's server auth filter for every call on the listener before
// the call reaches a handler.
struct TokenCheck {
  std::string token;
  bool open_health = true;

  static void Process(void* state, grpc_auth_context* /*context*/, const grpc_metadata* md,
                      size_t num_md, grpc_process_auth_metadata_done_cb cb, void* user_data) {
    const auto* self = static_cast<const TokenCheck*>(state);
    absl::string_view path;
    absl::string_view authorization;
    bool has_authorization = false;
    for (size_t i = 0; i < num_md; ++i) {
      const absl::string_view key = SliceView(md[i].key);
      if (key == ":path") path = SliceView(md[i].value);
      if (key == "authorization") {
        authorization = SliceView(md[i].value);
        has_authorization = true;
      }
    }
    if (self->open_health && absl::StartsWith(path, "/grpc.health.v1.Health/")) {
      cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    if (!has_authorization) {
      cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         "missing bearer token: send metadata \"authorization: Bearer <token>\"");
      return;
    }
    absl::string_view given = authorization;
    if (!absl::ConsumePrefix(&given, "Bearer ") && !absl::ConsumePrefix(&given, "bearer ")) {
      cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED,
         "authorization metadata is not \"Bearer <token>\"");
      return;
    }
    if (!ConstantTimeEquals(self->token, std::string(given))) {
      cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, "invalid bearer token");
      return;
    }
    cb(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
  }
  static void Destroy(void* state) { delete static_cast<TokenCheck*>(state); }
};

// Listening credentials built on gRPC core's credentials. The C++ InsecureServerCredentials()
// refuses an auth metadata processor, while core's insecure credentials run the server auth filter
// like TLS ones do; wrapping core credentials gives plaintext and TLS listeners the same check.
class CoreServerCredentials final : public grpc::ServerCredentials {
 public:
  // `make` runs after the base class initialised gRPC (core objects need grpc_init).
  explicit CoreServerCredentials(const std::function<grpc_server_credentials*()>& make)
      : creds_(make()) {}
  ~CoreServerCredentials() override {
    if (creds_ != nullptr) grpc_server_credentials_release(creds_);
  }
  bool valid() const { return creds_ != nullptr; }
  void SetTokenCheck(std::string token, bool open_health) {
    auto* check = new TokenCheck{std::move(token), open_health};
    grpc_server_credentials_set_auth_metadata_processor(
        creds_, grpc_auth_metadata_processor{&TokenCheck::Process, &TokenCheck::Destroy, check});
  }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    // Not used: the token check is attached with SetTokenCheck.
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  grpc_server_credentials* creds_;
};

// Adds the bearer token to every call's initial metadata.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // the factory lives as long as the channel
};

}  // namespace

bool ConstantTimeEquals(const std::string& expected, const std::string& given) {
  // Every byte of `expected` is compared whatever the outcome; a length mismatch only flips the
  // result, it does not shorten the loop.
  volatile unsigned char diff = expected.size() == given.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (static_cast<unsigned char>(expected[i]) ^ g);
  }
  return diff == 0;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  SW_ASSIGN_OR_RETURN(std::string raw, ReadFile(path, "auth token file"));
  const std::string token(absl::StripAsciiWhitespace(raw));
  if (token.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth token file: \"", path, "\" holds only whitespace"));
  }
  return token;
}

std::string DescribeServerSecurity(const ServerSecurityOptions& o) {
  std::string s = o.tls_cert.empty() ? "plaintext" : (o.tls_client_ca.empty() ? "TLS" : "mTLS");
  if (!o.auth_token_file.empty()) {
    absl::StrAppend(&s, " + bearer token", o.open_health ? " (health open)" : "");
  }
  return s;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs --tls_cert and --tls_key (mTLS is TLS)");
  }
  std::string token;
  if (!o.auth_token_file.empty()) {
    auto t = ReadTokenFile(o.auth_token_file);
    if (!t.ok()) return Annotate(t.status(), "--auth_token_file");
    token = *std::move(t);
  }
  std::shared_ptr<CoreServerCredentials> creds;
  if (o.tls_cert.empty()) {
    creds = std::make_shared<CoreServerCredentials>(
        [] { return grpc_insecure_server_credentials_create(); });
  } else {
    SW_ASSIGN_OR_RETURN(std::string cert, ReadFile(o.tls_cert, "--tls_cert"));
    SW_ASSIGN_OR_RETURN(std::string key, ReadFile(o.tls_key, "--tls_key"));
    std::string ca;
    if (!o.tls_client_ca.empty()) {
      SW_ASSIGN_OR_RETURN(ca, ReadFile(o.tls_client_ca, "--tls_client_ca"));
    }
    creds = std::make_shared<CoreServerCredentials>([&] {
      grpc_ssl_pem_key_cert_pair pair{key.c_str(), cert.c_str()};
      return grpc_ssl_server_credentials_create_ex(
          ca.empty() ? nullptr : ca.c_str(), &pair, 1,
          ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
          nullptr);
    });
  }
  if (!creds->valid()) {
    return absl::InvalidArgumentError(
        "--tls_cert / --tls_key / --tls_client_ca: gRPC refused the certificate material");
  }
  if (!token.empty()) creds->SetTokenCheck(std::move(token), o.open_health);
  return std::shared_ptr<grpc::ServerCredentials>(std::move(creds));
}

absl::StatusOr<ClientSecurity> LoadClientSecurity(const ClientSecurityFiles& f) {
  auto flag = [&f](const std::string& name) { return f.flag_prefix + name; };
  ClientSecurity s;
  s.tls = f.tls || !f.ca_file.empty() || !f.cert_file.empty() || !f.key_file.empty();
  if (f.cert_file.empty() != f.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag("tls_client_cert"), " and ", flag("tls_client_key"), " go together"));
  }
  if (!f.ca_file.empty()) {
    SW_ASSIGN_OR_RETURN(s.ca_pem, ReadFile(f.ca_file, flag("tls_ca")));
  }
  if (!f.cert_file.empty()) {
    SW_ASSIGN_OR_RETURN(s.cert_pem, ReadFile(f.cert_file, flag("tls_client_cert")));
    SW_ASSIGN_OR_RETURN(s.key_pem, ReadFile(f.key_file, flag("tls_client_key")));
  }
  s.server_name = f.server_name;
  if (!f.token_file.empty()) {
    auto t = ReadTokenFile(f.token_file);
    if (!t.ok()) return Annotate(t.status(), flag("auth_token_file"));
    s.token = *t;
  } else if (const char* env = std::getenv("SPECWIRE_AUTH_TOKEN"); env != nullptr && *env) {
    s.token = std::string(absl::StripAsciiWhitespace(env));
  } else if (const char* file = std::getenv("SPECWIRE_AUTH_TOKEN_FILE"); file != nullptr && *file) {
    auto t = ReadTokenFile(file);
    if (!t.ok()) return Annotate(t.status(), "SPECWIRE_AUTH_TOKEN_FILE");
    s.token = *t;
  }
  return s;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const ClientSecurity& s,
                                           const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> creds;
  grpc::ChannelArguments a = args;
  if (s.tls) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = s.ca_pem;
    o.pem_cert_chain = s.cert_pem;
    o.pem_private_key = s.key_pem;
    creds = grpc::SslCredentials(o);
    if (!s.server_name.empty()) a.SetSslTargetNameOverride(s.server_name);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  if (s.token.empty()) return grpc::CreateCustomChannel(target, creds, a);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(s.token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, creds, a,
                                                                 std::move(factories));
}

}  // namespace specwire
