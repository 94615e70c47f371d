#include "common/rpc/server_flags.h"

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
ABSL_FLAG(int, drain_seconds, 30,
          "On SIGTERM / SIGINT: health turns NOT_SERVING and the work already accepted (calls, "
          "queued and running jobs) gets this many seconds to finish before the server stops.");

namespace specwire {

ServerFlagOptions ServerOptionsFromFlags() {
  ServerFlagOptions o;
  o.security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.security.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.security.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.security.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.security.open_health = absl::GetFlag(FLAGS_auth_open_health);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  return o;
}

}  // namespace specwire
