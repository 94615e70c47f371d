// The command-line flags every specwire server shares, defined once here and linked into
// specwire-extractor and specwire-scorer: where it listens (gRPC and metrics), how it is secured
// (TLS, mTLS, bearer token), its queue, its stream and text limits, and how long it drains on
// SIGTERM. Where the two servers' defaults differ (their ports, their queues) a flag's default
// is "auto" (−1 for a number) and each server passes its own (ServerDefaults); the help text
// names both. Each main hands the result to StartServer (server_startup.h) and its services.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/security.h"

namespace specwire {

// A server's own defaults for the flags whose default is "auto".
struct ServerDefaults {
  std::string listen;          // e.g. "127.0.0.1:50051"
  std::string metrics_listen;  // e.g. "127.0.0.1:9464"
  int64_t max_queue = 16;
};

struct ServerFlagOptions {
  ServerSecurityOptions security;  // --tls_cert, --tls_key, --tls_client_ca, --auth_token_file,
                                   // --auth_open_health
  // The listening credentials `security` makes (MakeServerCredentials): the certificates and
  // the token file are read with the flags, so a wrong path fails before any slow start-up.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  int drain_seconds = 30;          // --drain_seconds
  std::string listen;              // --listen
  std::string metrics_listen;      // --metrics_listen; empty: no exporter
  int64_t max_queue = 16;          // --max_queue: requests (jobs) waiting at most
  double stream_idle_seconds = 60;  // --stream_idle_seconds; 0: never
  int64_t max_text_bytes = 1 << 20;      // --max_text_bytes
  int64_t max_new_tokens_limit = 4096;   // --max_new_tokens_limit
};

// The flags' values, "auto" resolved from `defaults`, and the credentials they make.
// INVALID_ARGUMENT naming the flag for a negative queue, idle time or limit; the security flags'
// errors name the flag and the file.
absl::StatusOr<ServerFlagOptions> ServerOptionsFromFlags(const ServerDefaults& defaults);

}  // namespace specwire
