#include "common/server_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (chain); with --tls_key serves TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: clients must present a certificate it signed (mTLS). Needs --tls_cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token every call must send (\"authorization: Bearer <token>\"); "
          "others get UNAUTHENTICATED. Empty: no token.");
ABSL_FLAG(bool, auth_open_health, true, "grpc.health.v1 answers without the token.");

namespace specwire {

ServerSecurityOptions ServerSecurityFromFlags() {
  ServerSecurityOptions s;
  s.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  s.tls_key = absl::GetFlag(FLAGS_tls_key);
  s.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  s.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  s.open_health = absl::GetFlag(FLAGS_auth_open_health);
  return s;
}

bool IsSharedServerFlagsFile(absl::string_view file) {
  return file.find("common/server_flags") != absl::string_view::npos;
}

}  // namespace specwire
