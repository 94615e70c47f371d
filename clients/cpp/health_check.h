// The grpc.health.v1 check as a client call: what container and Kubernetes probes run
// (`specwire-cli health`), so images need no separate probe binary.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/security.h"

namespace specwire {

// grpc.health.v1.HealthCheckResponse.ServingStatus, by value.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

const char* ServingStatusName(ServingStatus s);

// One Health/Check call to `target` for `service` ("" is the server as a whole), over a channel
// with `security` (TLS, token) applied. An RPC error (unreachable server, deadline, NOT_FOUND for
// a service the server does not know) comes back as its status; a malformed response is
// INTERNAL.
absl::StatusOr<ServingStatus> CheckHealth(const std::string& target, const std::string& service,
                                          double timeout_seconds,
                                          const ClientSecurity& security = {});

}  // namespace specwire
