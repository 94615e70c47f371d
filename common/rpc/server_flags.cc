#include "common/rpc/server_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate (chain); with --tls_key serves TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA: clients must present a certificate it signed (mTLS). Needs --tls_cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token every call must send (\"authorization: Bearer <token>\"); "
          "others get UNAUTHENTICATED. Empty: no token.");
ABSL_FLAG(bool, auth_open_health, true, "grpc.health.v1 answers without the token.");
ABSL_FLAG(std::string, listen, "auto",
          "gRPC listen address (host:port; port 0 picks one). auto: 127.0.0.1:50051 for "
          "specwire-extractor, 127.0.0.1:50061 for specwire-scorer.");
ABSL_FLAG(std::string, metrics_listen, "auto",
          "Prometheus metrics address (host:port); empty disables the exporter. auto: "
          "127.0.0.1:9464 for specwire-extractor, 127.0.0.1:9465 for specwire-scorer.");
ABSL_FLAG(int64_t, max_queue, -1,
          "Work waiting at most; more gets RESOURCE_EXHAUSTED. specwire-extractor: requests "
          "waiting for the engine (-1: 64); specwire-scorer: Score jobs waiting, one runs at a "
          "time (-1: 16).");
ABSL_FLAG(double, stream_idle_seconds, 60,
          "A stream whose client has read nothing for this long is cancelled (its slot, work or "
          "Score job freed); 0: never.");
ABSL_FLAG(int64_t, max_text_bytes, 1 << 20,
          "Bytes of one text input at most (the extractor's Extract, Generate, Tokenize; the "
          "scorer's prompts, inline or in a dataset); longer texts are refused before they are "
          "tokenized or queued.");
// Not --max_new_tokens: in every client binary that is the completion budget of a request.
ABSL_FLAG(int64_t, max_new_tokens_limit, 4096,
          "The largest max_new_tokens a request (Generate, a Score job) may ask for.");
ABSL_FLAG(int, drain_seconds, 30,
          "On SIGTERM / SIGINT: health turns NOT_SERVING and the work already accepted (calls, "
          "queued and running jobs) gets this many seconds to finish before the server stops.");

namespace specwire {

absl::StatusOr<ServerFlagOptions> ServerOptionsFromFlags(const ServerDefaults& defaults) {
  ServerFlagOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  if (o.listen == "auto") o.listen = defaults.listen;
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (o.metrics_listen == "auto") o.metrics_listen = defaults.metrics_listen;
  o.max_queue = absl::GetFlag(FLAGS_max_queue);
  if (o.max_queue == -1) o.max_queue = defaults.max_queue;
  o.stream_idle_seconds = absl::GetFlag(FLAGS_stream_idle_seconds);
  o.max_text_bytes = absl::GetFlag(FLAGS_max_text_bytes);
  o.max_new_tokens_limit = absl::GetFlag(FLAGS_max_new_tokens_limit);
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"max_queue", static_cast<double>(o.max_queue)},
        {"stream_idle_seconds", o.stream_idle_seconds},
        {"max_text_bytes", static_cast<double>(o.max_text_bytes)},
        {"max_new_tokens_limit", static_cast<double>(o.max_new_tokens_limit)}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must not be negative"));
    }
  }
  o.security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.security.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.security.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.security.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  o.security.open_health = absl::GetFlag(FLAGS_auth_open_health);
  o.drain_seconds = absl::GetFlag(FLAGS_drain_seconds);
  if (o.drain_seconds < 0) return absl::InvalidArgumentError("--drain_seconds must not be negative");
  SW_ASSIGN_OR_RETURN(o.credentials, MakeServerCredentials(o.security));
  return o;
}

}  // namespace specwire
