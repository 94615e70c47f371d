// The command-line flags both services share: how they listen (TLS, mTLS, bearer token). Defined
// once here and linked into specwire-extractor and specwire-scorer.
#pragma once

#include "absl/strings/string_view.h"
#include "common/security.h"

namespace specwire {

// --tls_cert, --tls_key, --tls_client_ca, --auth_token_file, --auth_open_health.
ServerSecurityOptions ServerSecurityFromFlags();

// For absl::FlagsUsageConfig::contains_help_flags: true for this file, so a service's --help
// lists these flags next to its own.
bool IsSharedServerFlagsFile(absl::string_view file);

}  // namespace specwire
