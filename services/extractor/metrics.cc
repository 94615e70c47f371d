#include "services/extractor/metrics.h"

#include "common/rpc/metric_families.h"

namespace specwire {
namespace {

const prometheus::Histogram::BucketBoundaries kLatencyBuckets = {
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

}  // namespace

ExtractorMetrics::ExtractorMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(CounterFamily(*registry_, "specwire_extractor_requests_total",
                              "Finished RPCs by method and gRPC status code")),
      latency_(HistogramFamily(*registry_, "specwire_extractor_request_duration_seconds",
                               "RPC latency from arrival to the last message, by method")),
      tokens_(
          CounterFamily(*registry_, "specwire_extractor_tokens_total",
                        "Tokens processed (Extract: input tokens; Generate: prompt + completion)")),
      bytes_(CounterFamily(*registry_, "specwire_extractor_streamed_bytes_total",
                           "Hidden-state and tensor payload bytes written to clients")
                 .Add({})),
      batch_requests_(
          HistogramFamily(*registry_, "specwire_extractor_batch_requests",
                          "Requests per engine batch")
              .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64})),
      batch_tokens_(HistogramFamily(*registry_, "specwire_extractor_batch_tokens",
                                    "Padded tokens per engine batch")
                        .Add({}, prometheus::Histogram::BucketBoundaries{64, 256, 1024, 4096, 16384,
                                                                         65536, 262144})),
      queue_wait_(HistogramFamily(*registry_, "specwire_extractor_queue_wait_seconds",
                                  "Time requests wait for the engine")
                      .Add({}, kLatencyBuckets)),
      queue_depth_(GaugeFamily(*registry_, "specwire_extractor_queue_depth",
                               "Requests waiting for the engine")
                       .Add({})),
      active_streams_(GaugeFamily(*registry_, "specwire_extractor_active_streams",
                                  "Open Extract / Generate / GetTensors streams")
                          .Add({})),
      running_sequences_(GaugeFamily(*registry_, "specwire_extractor_running_sequences",
                                     "Generation sequences admitted (prefilling or decoding)")
                             .Add({})),
      decode_sequences_(
          HistogramFamily(*registry_, "specwire_extractor_decode_step_sequences",
                          "Sequences one decoding step served (continuous batching)")
              .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})),
      cache_reserved_bytes_(GaugeFamily(*registry_, "specwire_extractor_cache_reserved_bytes",
                                        "Cache bytes the admitted generation sequences reserve "
                                        "(of --kv_cache_bytes)")
                                .Add({})),
      session_calls_(CounterFamily(*registry_, "specwire_extractor_session_calls_total",
                                   "Finished live-session calls by call (open, verify, commit) and "
                                   "outcome (ok, refused)")),
      open_sessions_(GaugeFamily(*registry_, "specwire_extractor_open_sessions",
                                 "Live verification sessions open (of --max_sessions)")
                         .Add({})),
      session_tokens_(CounterFamily(*registry_, "specwire_extractor_session_tokens_total",
                                    "Live-session tokens by kind: drafted (sent for verification), "
                                    "accepted, rollback (run again to restore a partial commit)")) {
}

void ExtractorMetrics::DecodeStep(int sequences) {
  decode_sequences_.Observe(static_cast<double>(sequences));
}

void ExtractorMetrics::SetGeneration(int64_t sequences, int64_t reserved_bytes) {
  running_sequences_.Set(static_cast<double>(sequences));
  cache_reserved_bytes_.Set(static_cast<double>(reserved_bytes));
}

void ExtractorMetrics::RequestDone(const std::string& method, const std::string& code,
                                   double seconds) {
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  latency_.Add({{"method", method}}, kLatencyBuckets).Observe(seconds);
}
void ExtractorMetrics::Tokens(const std::string& method, int64_t n) {
  tokens_.Add({{"method", method}}).Increment(static_cast<double>(n));
}
void ExtractorMetrics::BytesStreamed(int64_t n) { bytes_.Increment(static_cast<double>(n)); }
void ExtractorMetrics::Batch(int requests, int64_t tokens) {
  batch_requests_.Observe(requests);
  batch_tokens_.Observe(static_cast<double>(tokens));
}
void ExtractorMetrics::QueueWait(double seconds) { queue_wait_.Observe(seconds); }
void ExtractorMetrics::SetQueueDepth(int64_t n) { queue_depth_.Set(static_cast<double>(n)); }
void ExtractorMetrics::StreamOpened() { active_streams_.Increment(); }
void ExtractorMetrics::StreamClosed() { active_streams_.Decrement(); }

void ExtractorMetrics::SessionCall(const std::string& call, const std::string& outcome) {
  session_calls_.Add({{"call", call}, {"outcome", outcome}}).Increment();
}

void ExtractorMetrics::SetOpenSessions(int64_t n) { open_sessions_.Set(static_cast<double>(n)); }

void ExtractorMetrics::SessionTokens(int64_t drafted, int64_t accepted, int64_t rollback) {
  session_tokens_.Add({{"kind", "drafted"}}).Increment(static_cast<double>(drafted));
  session_tokens_.Add({{"kind", "accepted"}}).Increment(static_cast<double>(accepted));
  session_tokens_.Add({{"kind", "rollback"}}).Increment(static_cast<double>(rollback));
}

}  // namespace specwire
