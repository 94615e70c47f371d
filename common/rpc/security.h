// Transport security and authentication, shared by both services and every C++ client.
//
// Server side: TLS from a certificate and key, mTLS when a client CA is given (clients must
// present a certificate that CA signed, verified in the handshake), and an optional bearer token
// ("authorization: Bearer <token>") checked for every call before any handler runs. The token is
// checked by a gRPC auth metadata processor attached to the listening credentials; it works for
// plaintext listeners too (the credentials wrap gRPC core's insecure credentials, which run the
// same server auth filter), so plaintext + token is covered without an interceptor. A wrong or
// missing token ends the call with UNAUTHENTICATED and a message that says which of the two; the
// comparison takes the same time whatever the first differing byte. grpc.health.v1 may be left
// open (load balancers and orchestrators probe it without credentials).
//
// Client side: a channel with TLS (CA, optional client certificate + key for mTLS, optional
// server-name override) and the token added to every call's metadata by a client interceptor
// (call credentials would refuse a plaintext channel, which loopback sidecars use).
//
// No gRPC type appears in the plain structs below, so torch-side code (the scorer's client
// options) can include this header; the functions that build gRPC objects only forward-declare
// them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class Channel;
class ChannelArguments;
class ServerCredentials;
}  // namespace grpc

namespace specwire {

// What a server's flags say (paths; files are read by MakeServerCredentials).
struct ServerSecurityOptions {
  std::string tls_cert;         // PEM certificate chain; with tls_key enables TLS
  std::string tls_key;          // PEM private key
  std::string tls_client_ca;    // PEM CA: requires and verifies client certificates (mTLS)
  std::string auth_token_file;  // file holding the bearer token (surrounding whitespace ignored)
  bool open_health = true;      // grpc.health.v1 without a token
};

// Listening credentials for `options`: plaintext or TLS/mTLS, with the token check attached when
// a token file is given. Errors name the flag and the file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerSecurityOptions& options);

// "TLS", "mTLS" or "plaintext", plus " + token": for start-up logs.
std::string DescribeServerSecurity(const ServerSecurityOptions& options);

// A client's credentials, already read (PEM text and the token itself), so building a channel
// cannot fail on I/O. Empty fields are unused; TLS is on when `tls` is true.
struct ClientSecurity {
  bool tls = false;
  std::string ca_pem;       // roots that signed the server's certificate; empty: system roots
  std::string cert_pem;     // client certificate chain (mTLS)
  std::string key_pem;      // client private key (mTLS)
  std::string server_name;  // overrides the name checked against the server's certificate
  std::string token;        // bearer token sent with every call
};

// The flags of a client (paths), resolved into ClientSecurity. TLS is on when any of ca/cert/key
// is given or `tls` is set. The token comes from `token_file`, else from the environment variable
// SPECWIRE_AUTH_TOKEN, else from the file named by SPECWIRE_AUTH_TOKEN_FILE.
struct ClientSecurityFiles {
  bool tls = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name;
  std::string token_file;
  // How errors name the flags: prefix + name ("--extractor_" + "tls_ca", "--scorer_" + ...).
  std::string flag_prefix = "--";
};
absl::StatusOr<ClientSecurity> LoadClientSecurity(const ClientSecurityFiles& files);

// A channel to `target` with `security` applied (TLS credentials and/or the token interceptor).
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientSecurity& security,
                                           const grpc::ChannelArguments& args);

// The token in a file: its content without surrounding whitespace; empty or unreadable → error.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// Equal strings, compared in time that depends only on the length of `expected`.
bool ConstantTimeEquals(const std::string& expected, const std::string& given);

}  // namespace specwire
