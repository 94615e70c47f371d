#include "clients/cpp/scorer_connection_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

ABSL_FLAG(std::string, scorer, "", "A running specwire-scorer (host:port).");
ABSL_FLAG(bool, scorer_tls, false,
          "Connect to the scorer with TLS; implied by --scorer_tls_ca and "
          "--scorer_tls_client_cert.");
ABSL_FLAG(std::string, scorer_tls_ca, "",
          "PEM CA that signed the scorer's certificate (default: system roots).");
ABSL_FLAG(std::string, scorer_tls_client_cert, "",
          "PEM client certificate presented to the scorer (mTLS), with --scorer_tls_client_key.");
ABSL_FLAG(std::string, scorer_tls_client_key, "", "PEM key of --scorer_tls_client_cert.");
ABSL_FLAG(std::string, scorer_tls_server_name, "",
          "Name to check the scorer's certificate against (default: the host of --scorer).");
ABSL_FLAG(std::string, scorer_auth_token_file, "",
          "Bearer token sent to the scorer; else $SPECWIRE_AUTH_TOKEN, else the file named by "
          "$SPECWIRE_AUTH_TOKEN_FILE.");
ABSL_FLAG(double, scorer_timeout, 0,
          "Deadline in seconds of what is asked of the scorer (specwire-score: the whole job, "
          "across resubmissions; specwire-cli health: the check); 0: none.");

namespace specwire {

absl::StatusOr<ScorerConnection> ScorerConnectionFromFlags() {
  ScorerConnection c;
  c.address = absl::GetFlag(FLAGS_scorer);
  c.timeout_seconds = absl::GetFlag(FLAGS_scorer_timeout);
  if (c.timeout_seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--scorer_timeout: ", c.timeout_seconds,
                                                   " is not a non-negative number of seconds"));
  }
  ClientSecurityFiles files;
  files.tls = absl::GetFlag(FLAGS_scorer_tls);
  files.ca_file = absl::GetFlag(FLAGS_scorer_tls_ca);
  files.cert_file = absl::GetFlag(FLAGS_scorer_tls_client_cert);
  files.key_file = absl::GetFlag(FLAGS_scorer_tls_client_key);
  files.server_name = absl::GetFlag(FLAGS_scorer_tls_server_name);
  files.token_file = absl::GetFlag(FLAGS_scorer_auth_token_file);
  files.flag_prefix = "--scorer_";
  SW_ASSIGN_OR_RETURN(c.security, LoadClientSecurity(files));
  return c;
}

}  // namespace specwire
