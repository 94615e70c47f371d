#include "common/rpc/health_service.h"

#include <deque>

namespace specwire {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// One Watch stream: the current status first, then each change; at most one write in flight
// (the pending statuses coalesce to the latest), finished with OK when the service drains or by
// the client's cancel. Lifetime: deleted in OnDone, after it left the service's set.
class HealthService::Watcher : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name) : service_(service), name_(std::move(name)) {}

  // Under the service's mutex.
  void Update(ServingStatus status, bool last) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    pending_ = status;
    has_pending_ = true;
    finish_after_ = finish_after_ || last;
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "health watch: write failed"));
      return;
    }
    MaybeWriteLocked();
  }
  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }
  void OnDone() override {
    service_->Forget(this);
    delete this;
  }

 private:
  void MaybeWriteLocked() {
    if (writing_ || finished_) return;
    if (has_pending_) {
      has_pending_ = false;
      if (pending_ == last_sent_ && sent_any_) {
        MaybeWriteLocked();
        return;
      }
      response_.set_status(pending_);
      last_sent_ = pending_;
      sent_any_ = true;
      writing_ = true;
      StartWrite(&response_);
      return;
    }
    if (finish_after_) FinishLocked(grpc::Status::OK);
  }
  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  HealthService* const service_;
  const std::string name_;
  std::mutex mu_;
  HealthCheckResponse response_;  // the message in flight
  ServingStatus pending_ = HealthCheckResponse::UNKNOWN;
  ServingStatus last_sent_ = HealthCheckResponse::UNKNOWN;
  bool has_pending_ = false;
  bool sent_any_ = false;
  bool writing_ = false;
  bool finish_after_ = false;
  bool finished_ = false;

  friend class HealthService;
};

HealthService::HealthService() = default;
HealthService::~HealthService() = default;

HealthService::ServingStatus HealthService::StatusLocked(const std::string& service) const {
  auto it = status_.find(service);
  return it == status_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetStatus(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return;
  status_[service] = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  for (Watcher* w : watchers_) {
    if (w->name_ == service) w->Update(status_[service], /*last=*/false);
  }
}

void HealthService::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  for (auto& [name, status] : status_) status = HealthCheckResponse::NOT_SERVING;
  for (Watcher* w : watchers_) w->Update(StatusLocked(w->name_), /*last=*/true);
}

void HealthService::Forget(Watcher* w) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(w);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  auto* r = ctx->DefaultReactor();
  std::lock_guard<std::mutex> lock(mu_);
  const ServingStatus s = StatusLocked(request->service());
  if (s == HealthCheckResponse::SERVICE_UNKNOWN) {
    r->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                           "health: unknown service \"" + request->service() + "\""));
    return r;
  }
  response->set_status(s);
  r->Finish(grpc::Status::OK);
  return r;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* ctx, const HealthCheckRequest* request) {
  auto* w = new Watcher(this, request->service());
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.insert(w);
  w->Update(StatusLocked(request->service()), /*last=*/draining_);
  return w;
}

}  // namespace specwire
