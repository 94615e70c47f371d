// grpc.health.v1.Health, served by specwire itself instead of gRPC's default health service:
// the same Check and Watch, plus what the default one lacks here:
//   - Drain() ends every Watch stream (a last NOT_SERVING, then OK), so an open Watch no longer
//     holds a draining server until its deadline;
//   - its schema (proto/grpc/health/v1/health.proto) is compiled in, so server reflection
//     resolves it like every other service.
// Statuses are kept per service name ("" is the server as a whole); thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "proto/grpc/health/v1/health.grpc.pb.h"

namespace specwire {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  HealthService();
  ~HealthService() override;

  // Sets a service's status and tells its watchers. Ignored after Drain().
  void SetStatus(const std::string& service, bool serving);
  // Every service NOT_SERVING, for good, and every Watch stream finished.
  void Drain();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class Watcher;
  // The status a watcher of `service` sees (SERVICE_UNKNOWN for a name never set).
  ServingStatus StatusLocked(const std::string& service) const;
  void Forget(Watcher* w);

  std::mutex mu_;
  std::map<std::string, ServingStatus> status_;
  std::set<Watcher*> watchers_;  // live Watch streams; each removes itself when done
  bool draining_ = false;
};

}  // namespace specwire
