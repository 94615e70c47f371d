// Prometheus metrics of the scorer (served on their own port by prometheus-cpp's exposer).
//
// Acceptance counters mirror vLLM's speculative-decoding metrics so existing dashboards port
// (vLLM: vllm:spec_decode_num_drafts, ..._num_draft_tokens, ..._num_accepted_tokens,
// ..._num_accepted_tokens_per_pos{position}); here with Prometheus' _total suffix and labelled
// by drafter, dataset and method:
//   specwire_spec_decode_num_drafts_total                   one per drafting step
//   specwire_spec_decode_num_draft_tokens_total             steps × (B − 1)
//   specwire_spec_decode_num_accepted_tokens_total          Σ a (bonus token not counted)
//   specwire_spec_decode_num_accepted_tokens_per_pos_total  {position="k"}: steps whose a ≥ k,
//                                                           k = 1..B−1: the draft position,
//                                                           1-based as in every report and
//                                                           specwire_checkpoint_acceptance
//                                                           (vLLM's list index is k − 1)
// Gauges (the job in progress, then its final values):
//   specwire_spec_decode_mean_acceptance_length{kind="mean_of_means"|"pooled"}   τ
//   specwire_spec_decode_ddtree_mean_acceptance_length{budget="N", kind=...}       DDTree-N τ
// Service metrics: requests by code, request latency, prompts scored, tokens, queue depth,
// per-prompt latency.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/job/score_job.h"

namespace specwire {

class ScorerMetrics {
 public:
  ScorerMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // One finished RPC: method ("Score"), gRPC status code name ("OK", "FAILED_PRECONDITION").
  void RequestDone(const std::string& method, const std::string& code, double seconds);
  void SetQueueDepth(int64_t n);
  void SetRunning(bool running);
  // One prompt replayed: the vLLM counters and prompt / token counts.
  void PromptScored(const ScoreLabels& labels, const ResponseAcceptance& r, int32_t block_size,
                    double seconds);
  // τ so far (the gauges), during a job.
  void Progress(const ScoreLabels& labels, const ScoreProgress& p);
  // The job's final values (τ and DDTree-N τ).
  void Summary(const ScoreLabels& labels, const AcceptanceSummary& s);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& num_drafts_;
  prometheus::Family<prometheus::Counter>& num_draft_tokens_;
  prometheus::Family<prometheus::Counter>& num_accepted_tokens_;
  prometheus::Family<prometheus::Counter>& num_accepted_tokens_per_pos_;
  prometheus::Family<prometheus::Gauge>& mean_acceptance_length_;
  prometheus::Family<prometheus::Gauge>& ddtree_mean_acceptance_length_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Counter>& prompts_;
  prometheus::Family<prometheus::Counter>& tokens_;
  prometheus::Family<prometheus::Histogram>& prompt_latency_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& running_;
};

}  // namespace specwire
