#include "common/rpc/stream_watchdog.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace specwire {

StreamWatchdog::StreamWatchdog(std::chrono::milliseconds idle, std::string flag)
    : idle_(idle),
      reason_(absl::StrCat("stream cancelled: the client read nothing for ",
                           static_cast<double>(idle.count()) / 1000.0, " s (", flag, ")")) {
  if (enabled()) thread_ = std::thread([this] { Loop(); });
}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StreamWatchdog::Register(IdleStream* s) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  streams_.insert(s);
}

void StreamWatchdog::Unregister(IdleStream* s) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(s);
}

void StreamWatchdog::Loop() {
  // A few scans per idle period: a stream is cancelled between 1 and 1.25 idle periods after its
  // client stopped reading.
  const auto period = std::max(std::chrono::milliseconds(20), idle_ / 4);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, period, [&] { return stop_; });
    if (stop_) return;
    // Referenced under the lock, checked without it: a check may cancel the call, and gRPC may
    // then run the stream's reactions (OnDone unregisters, taking this lock) on this thread.
    std::vector<IdleStream*> held(streams_.begin(), streams_.end());
    for (IdleStream* s : held) s->AddRef();
    lock.unlock();
    const auto cutoff = std::chrono::steady_clock::now() - idle_;
    for (IdleStream* s : held) {
      s->CancelIfWritePendingSince(cutoff, reason_);
      s->DropRef();
    }
    lock.lock();
  }
}

}  // namespace specwire
