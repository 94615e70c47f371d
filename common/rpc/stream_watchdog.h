// Cancels server streams whose client has stopped reading: a stream whose last write has waited
// longer than the idle limit for the client to make room (HTTP/2 flow control) is cancelled, so
// that it frees its stream slot and its work. Streams of clients that read, however slowly,
// complete a write now and then and are never touched.
//
// One thread per watchdog scans the registered streams a few times per idle period. A stream
// registers when it is created and unregisters in OnDone; the scan holds a reference to each
// stream it looks at, so neither side can outlive the other.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace specwire {

// What the watchdog needs of a stream (StreamReactor implements it).
class IdleStream {
 public:
  virtual ~IdleStream() = default;
  virtual void AddRef() = 0;
  virtual void DropRef() = 0;
  // Cancels the call when a write has been pending since before `cutoff`; `reason` becomes its
  // status message.
  virtual void CancelIfWritePendingSince(std::chrono::steady_clock::time_point cutoff,
                                         const std::string& reason) = 0;
};

class StreamWatchdog {
 public:
  // `idle` <= 0 disables the watchdog (no thread). `flag` names the setting in the status of a
  // cancelled stream ("--stream_idle_seconds").
  StreamWatchdog(std::chrono::milliseconds idle, std::string flag);
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  bool enabled() const { return idle_.count() > 0; }
  void Register(IdleStream* s);
  void Unregister(IdleStream* s);

 private:
  void Loop();

  const std::chrono::milliseconds idle_;
  const std::string reason_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<IdleStream*> streams_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything above
};

}  // namespace specwire
