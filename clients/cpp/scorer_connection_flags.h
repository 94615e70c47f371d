// How a program reaches a running specwire-scorer (specwire-score --scorer, specwire-cli health
// --scorer): the same flag set as the extractor's (extractor_connection_flags.h), with the
// scorer_ prefix, defined once here:
//
//   --scorer ADDR                  host:port of the scorer
//   --scorer_tls                   TLS with the system roots (implied by the next three)
//   --scorer_tls_ca F              PEM CA that signed the scorer's certificate
//   --scorer_tls_client_cert F     PEM client certificate (mTLS)
//   --scorer_tls_client_key F      its key
//   --scorer_tls_server_name N     name to check the certificate against
//   --scorer_auth_token_file F     bearer token (else $SPECWIRE_AUTH_TOKEN[_FILE])
//   --scorer_timeout S             deadline of the work asked of the scorer
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/security.h"

namespace specwire {

struct ScorerConnection {
  std::string address;         // --scorer; "" : not given
  ClientSecurity security;     // read from the files the flags name
  double timeout_seconds = 0;  // 0: no deadline
};

// Reads the files the flags name (errors name the flag).
absl::StatusOr<ScorerConnection> ScorerConnectionFromFlags();

}  // namespace specwire
