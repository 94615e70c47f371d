// How a program reaches the extractor(s): one flag set, defined once here and linked by every
// binary that talks to extractors (specwire-scorer, specwire-score in-process, specwire-cli, the
// gRPC load benchmark), so the spelling is the same everywhere:
//
//   --extractor ADDR                  host:port, a comma list, or dns:///name:port
//   --extractor_tls                   TLS with the system roots (implied by the next three)
//   --extractor_tls_ca F              PEM CA that signed the extractors' certificates
//   --extractor_tls_client_cert F     PEM client certificate (mTLS)
//   --extractor_tls_client_key F      its key
//   --extractor_tls_server_name N     name to check the certificate against
//   --extractor_auth_token_file F     bearer token (else $SPECWIRE_AUTH_TOKEN[_FILE])
//   --extractor_timeout S             deadline of each call
//
// Retries are the scorer's (--extractor_attempts, services/scorer/runner_flags.h): the CLI makes
// one call and reports its error.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "clients/cpp/extractor_client.h"

namespace specwire {

// What a program assumes for the flags it is not given; they differ by program (an interactive
// CLI wants a deadline, a scorer waiting on long generations wants none).
struct ExtractorConnectionDefaults {
  std::string address;         // "" : --extractor is required (the caller checks)
  double timeout_seconds = 0;  // 0: no deadline
};

struct ExtractorConnection {
  // --extractor as given (or the default): one address for a single client, or the spec an
  // ExtractorPool (services/scorer/extractor_pool.h) resolves into several.
  std::string address;
  // client.target = address; timeout and security (TLS material and token read from their files
  // already).
  ExtractorClientOptions client;
};

// Reads the files the flags name (INVALID_ARGUMENT / NOT_FOUND naming the flag when one cannot be
// read, or for a negative timeout).
absl::StatusOr<ExtractorConnection> ExtractorConnectionFromFlags(
    const ExtractorConnectionDefaults& defaults);

}  // namespace specwire
