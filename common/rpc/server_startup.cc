#include "common/rpc/server_startup.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/reflection_service.h"
#include "absl/strings/strip.h"
#include "common/rpc/health_service.h"

namespace specwire {
namespace {

std::atomic<bool> g_stop_signal{false};
void OnStopSignal(int) { g_stop_signal = true; }

// Why `address` ("host:port", "[v6]:port") cannot be bound, as the OS says it, or "" when a
// probe bind succeeds (or the address is not host:port). Only asked after a listener failed, to
// name the cause that gRPC and civetweb keep in their own logs: a port another process holds, an
// address that is not this host's.
std::string BindFailure(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || absl::StartsWith(address, "unix:")) return "";
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  host = std::string(absl::StripSuffix(absl::StripPrefix(host, "["), "]"));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      rc != 0) {
    return absl::StrCat("the address does not resolve (", gai_strerror(rc), ")");
  }
  std::string failure;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as gRPC binds
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      failure = errno == EADDRINUSE ? "the port is already in use by another process"
                                    : std::string(strerror(errno));
    } else {
      failure.clear();
      close(fd);
      break;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return failure;
}

std::string ListenFailure(const std::string& flag, const std::string& address) {
  const std::string why = BindFailure(address);
  return absl::StrCat(flag, "=", address, ": cannot listen", why.empty() ? "" : ": ", why);
}

}  // namespace

absl::StatusOr<std::unique_ptr<RunningServer>> RunningServer::Start(ServerStartOptions options) {
  std::unique_ptr<RunningServer> s(new RunningServer());
  if (!options.metrics_listen.empty()) {
    // prometheus-cpp throws when the address cannot be bound.
    try {
      s->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      const std::string why = BindFailure(options.metrics_listen);
      return absl::UnavailableError(absl::StrCat("--metrics_listen=", options.metrics_listen,
                                                 ": cannot serve metrics: ",
                                                 why.empty() ? e.what() : why));
    }
    for (const auto& collectable : options.metrics) s->exposer_->RegisterCollectable(collectable);
  }
  // specwire's own grpc.health.v1 (health_service.h) instead of gRPC's default one.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  s->health_ = std::make_unique<HealthService>();
  std::vector<std::string> names = options.service_names;
  names.insert(names.end(), {"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                             "grpc.reflection.v1alpha.ServerReflection"});
  s->reflection_ = std::make_unique<ReflectionV1Service>(std::move(names));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, options.credentials, &s->port_);
  for (grpc::Service* service : options.services) builder.RegisterService(service);
  builder.RegisterService(s->health_.get());
  builder.RegisterService(s->reflection_.get());
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(ListenFailure("--listen", options.listen));
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

void RunningServer::SetServing(bool serving) {
  health_->SetStatus("", serving);
  if (!options_.health_service.empty()) health_->SetStatus(options_.health_service, serving);
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
