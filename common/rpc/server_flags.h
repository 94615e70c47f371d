// The command-line flags every specwire server shares: how it listens (TLS, mTLS, bearer token)
// and how long it drains on SIGTERM. Defined once here and linked into specwire-extractor and
// specwire-scorer; each main keeps its own --listen and --metrics_listen (their defaults differ
// per service) and hands all of it to StartServer (server_startup.h).
#pragma once

#include "common/rpc/security.h"

namespace specwire {

struct ServerFlagOptions {
  ServerSecurityOptions security;  // --tls_cert, --tls_key, --tls_client_ca, --auth_token_file,
                                   // --auth_open_health
  int drain_seconds = 30;          // --drain_seconds
};

ServerFlagOptions ServerOptionsFromFlags();

}  // namespace specwire
