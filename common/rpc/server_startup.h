// The start-up and shutdown every specwire server shares, as the steps its main takes in order:
//   1. ServerOptionsFromFlags (server_flags.h: the shared flags and the credentials they make)
//      before any slow work, so a wrong certificate or token path fails at once;
//   2. the main loads what it serves and builds its services;
//   3. RunningServer::Start: the Prometheus exporter on its own plain-HTTP address, then the gRPC
//      server with the services, grpc.health.v1 (SERVING; health_service.h) and reflection;
//   4. WaitForStopSignal: until SIGTERM or SIGINT;
//   5. BeginDrain (health NOT_SERVING and health Watch streams ended, so load balancers and
//      probes stop sending and no open Watch holds the shutdown), the main
//      drains its own work (scheduler, job queue), then Stop.
// No gRPC or Prometheus header here: the types are only forward-declared.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/server_flags.h"

namespace grpc {
class Server;
class ServerCredentials;
class Service;
}  // namespace grpc
namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace specwire {

class HealthService;
class ReflectionV1Service;

struct ServerStartOptions {
  // listen, metrics_listen and credentials as the servers' shared flags give them (step 1).
  static ServerStartOptions FromFlags(const ServerFlagOptions& flags) {
    ServerStartOptions o;
    o.listen = flags.listen;
    o.metrics_listen = flags.metrics_listen;
    o.credentials = flags.credentials;
    return o;
  }

  std::string listen;          // gRPC host:port (port 0 picks one): the main's --listen
  std::string metrics_listen;  // Prometheus host:port, "" : no exporter (--metrics_listen)
  std::shared_ptr<grpc::ServerCredentials> credentials;           // ServerFlagOptions::credentials
  std::vector<grpc::Service*> services;                           // not owned; outlive the server
  // Their fully qualified names, for reflection v1's list_services (with health and both
  // reflection services, which Start adds), e.g. {"specwire.v1.Extractor"}.
  std::vector<std::string> service_names;
  std::vector<std::shared_ptr<prometheus::Collectable>> metrics;  // what the exporter serves
  // Marked SERVING (with the server as a whole, "") once listening, e.g. "specwire.v1.Extractor".
  std::string health_service;
  int max_receive_message_bytes = 4 << 20;  // gRPC's default
  int max_send_message_bytes = -1;          // -1: gRPC's default (no limit)
};

class RunningServer {
 public:
  // Steps 3 of the file comment. Errors name the address that could not be bound.
  static absl::StatusOr<std::unique_ptr<RunningServer>> Start(ServerStartOptions options);
  ~RunningServer();  // Stop(now) if not stopped
  RunningServer(const RunningServer&) = delete;
  RunningServer& operator=(const RunningServer&) = delete;

  int port() const { return port_; }
  // "port 50051, metrics on 127.0.0.1:9464" (or without the metrics part): for start-up logs.
  std::string Describe() const;
  // Health NOT_SERVING for the server and every service, and every health Watch stream ended (so
  // none holds the shutdown); calls are still served.
  void BeginDrain();
  // Health of the server ("") and of health_service: SERVING or NOT_SERVING (a server that
  // cannot admit work now). Ignored once the drain began.
  void SetServing(bool serving);
  // grpc::Server::Shutdown: no new calls; calls in flight get until `deadline`, then are
  // cancelled. Returns when every call has ended.
  void Stop(std::chrono::system_clock::time_point deadline);

 private:
  RunningServer() = default;
  ServerStartOptions options_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // before server_: destroyed after it
  std::unique_ptr<HealthService> health_;         // registered with server_: outlives it
  std::unique_ptr<ReflectionV1Service> reflection_;  // the same
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool stopped_ = false;
};

// Blocks until the process gets SIGTERM or SIGINT (handlers installed by the first call).
void WaitForStopSignal();

}  // namespace specwire
