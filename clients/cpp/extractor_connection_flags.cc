#include "clients/cpp/extractor_connection_flags.h"

#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/security.h"
#include "common/status.h"

ABSL_FLAG(std::string, extractor, "",
          "The extractor: host:port, a comma list of them (specwire-scorer and specwire-score "
          "spread prompts over all), or dns:///name:port (every address of the name, resolved "
          "again for each job). All must serve the same target. Empty: the program's default "
          "(specwire-cli and the gRPC load benchmark: 127.0.0.1:50051; required by "
          "specwire-scorer; given, it selects the in-process mode of specwire-score).");
ABSL_FLAG(bool, extractor_tls, false,
          "Connect to the extractor(s) with TLS; implied by --extractor_tls_ca and "
          "--extractor_tls_client_cert.");
ABSL_FLAG(std::string, extractor_tls_ca, "",
          "PEM CA that signed the extractors' certificates (default: system roots).");
ABSL_FLAG(std::string, extractor_tls_client_cert, "",
          "PEM client certificate presented to the extractors (mTLS), with "
          "--extractor_tls_client_key.");
ABSL_FLAG(std::string, extractor_tls_client_key, "", "PEM key of --extractor_tls_client_cert.");
ABSL_FLAG(std::string, extractor_tls_server_name, "",
          "Name to check the extractors' certificates against (default: the host).");
ABSL_FLAG(std::string, extractor_auth_token_file, "",
          "Bearer token sent to the extractors; else $SPECWIRE_AUTH_TOKEN, else the file named "
          "by $SPECWIRE_AUTH_TOKEN_FILE.");
ABSL_FLAG(std::optional<double>, extractor_timeout, std::nullopt,
          "Deadline of each extractor call in seconds; 0: none. Not given: the program's "
          "default (specwire-cli: 300; the gRPC load benchmark: 600; the scorer: none).");

namespace specwire {

absl::StatusOr<ExtractorConnection> ExtractorConnectionFromFlags(
    const ExtractorConnectionDefaults& defaults) {
  ExtractorConnection c;
  c.address = absl::GetFlag(FLAGS_extractor);
  if (c.address.empty()) c.address = defaults.address;
  c.client.target = c.address;
  c.client.timeout_seconds =
      absl::GetFlag(FLAGS_extractor_timeout).value_or(defaults.timeout_seconds);
  if (c.client.timeout_seconds < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--extractor_timeout: ", c.client.timeout_seconds,
                     " is not a non-negative number of seconds"));
  }
  ClientSecurityFiles files;
  files.tls = absl::GetFlag(FLAGS_extractor_tls);
  files.ca_file = absl::GetFlag(FLAGS_extractor_tls_ca);
  files.cert_file = absl::GetFlag(FLAGS_extractor_tls_client_cert);
  files.key_file = absl::GetFlag(FLAGS_extractor_tls_client_key);
  files.server_name = absl::GetFlag(FLAGS_extractor_tls_server_name);
  files.token_file = absl::GetFlag(FLAGS_extractor_auth_token_file);
  files.flag_prefix = "--extractor_";
  SW_ASSIGN_OR_RETURN(c.client.security, LoadClientSecurity(files));
  return c;
}

}  // namespace specwire
