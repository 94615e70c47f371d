#include "common/rpc/server_startup.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>
#include <signal.h>

#include <atomic>
#include <exception>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/health_service.h"

namespace specwire {
namespace {

std::atomic<bool> g_stop_signal{false};
void OnStopSignal(int) { g_stop_signal = true; }

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> RunningServer::Start(ServerStartOptions options) {
  std::unique_ptr<RunningServer> s(new RunningServer());
  if (!options.metrics_listen.empty()) {
    // prometheus-cpp throws when the address cannot be bound.
    try {
      s->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics listener ", options.metrics_listen, ": ", e.what()));
    }
    for (const auto& collectable : options.metrics) s->exposer_->RegisterCollectable(collectable);
  }
  // specwire's own grpc.health.v1 (health_service.h) instead of gRPC's default one.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  s->health_ = std::make_unique<HealthService>();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, options.credentials, &s->port_);
  for (grpc::Service* service : options.services) builder.RegisterService(service);
  builder.RegisterService(s->health_.get());
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  s->health_->SetStatus("", true);
  if (!options.health_service.empty()) s->health_->SetStatus(options.health_service, true);
  s->options_ = std::move(options);
  return s;
}

RunningServer::~RunningServer() {
  if (!stopped_) Stop(std::chrono::system_clock::now());
}

std::string RunningServer::Describe() const {
  return absl::StrCat("port ", port_,
                      exposer_ ? absl::StrCat(", metrics on ", options_.metrics_listen) : "");
}

void RunningServer::BeginDrain() { health_->Drain(); }

void RunningServer::Stop(std::chrono::system_clock::time_point deadline) {
  stopped_ = true;
  if (server_) server_->Shutdown(deadline);
}

void WaitForStopSignal() {
  signal(SIGTERM, OnStopSignal);
  signal(SIGINT, OnStopSignal);
  while (!g_stop_signal) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace specwire
