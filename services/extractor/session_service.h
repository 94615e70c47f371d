// The Extractor's Session method: live verification sessions over a bidirectional stream (the
// contract is in extractor.proto, the semantics in common/models/target_session.h).
//
// Each stream owns at most one session. Its calls (open, verify, commit) run on the Scheduler's
// worker thread like every other forward, one at a time per stream and in arrival order across
// streams; the reactor reads the next request only once the answers to the last one are written.
// Sessions are bounded in number and size, and an idle one (no request for idle_seconds while the
// server waits for one) ends with DEADLINE_EXCEEDED; a session is freed when its stream ends,
// however it ends (closed, cancelled, deadline, disconnect).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "absl/status/statusor.h"
#include "proto/specwire/v1/extractor.grpc.pb.h"
#include "services/extractor/metrics.h"
#include "services/extractor/scheduler.h"
#include "services/extractor/work.h"

namespace specwire {

struct SessionLimits {
  int64_t max_sessions = 16;           // open at once (--max_sessions)
  int64_t max_session_tokens = 16384;  // a session's capacity at most (--max_session_tokens)
  int64_t max_draft_tokens = 64;       // SessionOpen.max_draft_tokens at most
  double idle_seconds = 300;           // --session_idle_seconds; 0: never
  // Cache bytes all open sessions may hold together (--session_cache_bytes), each session
  // reserving its whole capacity when it opens.
  int64_t max_cache_bytes = int64_t{4} << 30;
  int64_t default_chunk_bytes = 1 << 20;
  int64_t max_chunk_bytes = 4 << 20;
};

class SessionService {
 public:
  // Checks an open request against the model and the server's input limits (server.cc).
  using OpenValidator = std::function<absl::StatusOr<SessionWork>(const v1::SessionOpen&)>;

  // Everything passed in must outlive the service.
  SessionService(ExtractorBackend* backend, Scheduler* scheduler, ExtractorMetrics* metrics,
                 SessionLimits limits, OpenValidator validate_open);
  ~SessionService();  // stops the idle check

  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Start(
      grpc::CallbackServerContext* ctx);

  int64_t open_sessions() const { return open_sessions_.load(); }
  // The server is draining: new sessions are refused and open ones end (UNAVAILABLE) as soon as
  // no call of theirs is running, so that shutdown does not wait for them.
  void BeginDrain();
  const SessionLimits& limits() const { return limits_; }

 private:
  class Reactor;
  friend class Reactor;
  // A session slot and `bytes` of cache: RESOURCE_EXHAUSTED naming --max_sessions or
  // --session_cache_bytes when they are not free.
  absl::Status Acquire(int64_t bytes);
  void Release(int64_t bytes);
  void Register(Reactor* r);
  void Unregister(Reactor* r);
  void IdleLoop();

  ExtractorBackend* backend_;
  Scheduler* scheduler_;
  ExtractorMetrics* metrics_;
  SessionLimits limits_;
  OpenValidator validate_open_;
  std::atomic<int64_t> open_sessions_{0};
  // Slot accounting has a lock of its own: a stream gives its slot back while it finishes, which
  // the idle check does under mu_.
  std::mutex slots_mu_;
  int64_t reserved_bytes_ = 0;  // under slots_mu_
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<bool> draining_{false};
  std::set<Reactor*> live_;  // streams not yet done (under mu_)
  std::thread idle_thread_;  // last: starts after the rest is initialised
};

}  // namespace specwire
