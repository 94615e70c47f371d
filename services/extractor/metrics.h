// Prometheus metrics of the extractor (served on their own port by prometheus-cpp's exposer).
// Names follow Prometheus conventions: base units, _total on counters.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

namespace specwire {

class ExtractorMetrics {
 public:
  ExtractorMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // One finished RPC: method ("Extract", ...), gRPC status code name ("OK", "INVALID_ARGUMENT").
  void RequestDone(const std::string& method, const std::string& code, double seconds);
  void Tokens(const std::string& method, int64_t n);
  void BytesStreamed(int64_t n);
  void Batch(int requests, int64_t tokens);
  void QueueWait(double seconds);
  void SetQueueDepth(int64_t n);
  void SetGeneration(int64_t sequences, int64_t reserved_bytes);
  void DecodeStep(int sequences);
  void StreamOpened();
  void StreamClosed();
  // Live verification sessions: one finished call ("open" | "verify" | "commit"; "ok" |
  // "refused"), the sessions open now, and what the verifications drafted, accepted and ran
  // again for rollbacks.
  void SessionCall(const std::string& call, const std::string& outcome);
  void SetOpenSessions(int64_t n);
  void SessionTokens(int64_t drafted, int64_t accepted, int64_t rollback);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Counter& bytes_;
  prometheus::Histogram& batch_requests_;
  prometheus::Histogram& batch_tokens_;
  prometheus::Histogram& queue_wait_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& active_streams_;
  prometheus::Gauge& running_sequences_;
  prometheus::Histogram& decode_sequences_;
  prometheus::Gauge& cache_reserved_bytes_;
  prometheus::Family<prometheus::Counter>& session_calls_;
  prometheus::Gauge& open_sessions_;
  prometheus::Family<prometheus::Counter>& session_tokens_;
};

}  // namespace specwire
