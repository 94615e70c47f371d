#include "services/scorer/metrics.h"

#include <map>

#include "common/rpc/metric_families.h"

namespace specwire {
namespace {

const prometheus::Histogram::BucketBoundaries kRequestBuckets = {
    0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200};
const prometheus::Histogram::BucketBoundaries kPromptBuckets = {0.01, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                                                5,    10,   30,  60,   120, 300};

std::map<std::string, std::string> Labels(const ScoreLabels& l) {
  return {{"drafter", l.drafter}, {"dataset", l.dataset}, {"method", l.method}};
}

}  // namespace

ScorerMetrics::ScorerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      num_drafts_(CounterFamily(*registry_, "specwire_spec_decode_num_drafts_total",
                                "Drafting steps (vLLM spec_decode_num_drafts)")),
      num_draft_tokens_(
          CounterFamily(*registry_, "specwire_spec_decode_num_draft_tokens_total",
                        "Drafted tokens, B - 1 per step (vLLM spec_decode_num_draft_tokens)")),
      num_accepted_tokens_(CounterFamily(*registry_,
                                         "specwire_spec_decode_num_accepted_tokens_total",
                                         "Accepted draft tokens, bonus not counted (vLLM "
                                         "spec_decode_num_accepted_tokens)")),
      num_accepted_tokens_per_pos_(
          CounterFamily(*registry_, "specwire_spec_decode_num_accepted_tokens_per_pos_total",
                        "Steps whose draft position `position` (0-based) was accepted (vLLM "
                        "spec_decode_num_accepted_tokens_per_pos)")),
      mean_acceptance_length_(
          GaugeFamily(*registry_, "specwire_spec_decode_mean_acceptance_length",
                      "Acceptance length tau (tokens per step, bonus counted) of "
                      "the latest job: kind mean_of_means (dflash) or pooled")),
      ddtree_mean_acceptance_length_(
          GaugeFamily(*registry_, "specwire_spec_decode_ddtree_mean_acceptance_length",
                      "Tree acceptance length tau per node budget of the latest job (DDTree-N; "
                      "EAGLE's top-k tree for method eagle3)")),
      requests_(CounterFamily(*registry_, "specwire_scorer_requests_total",
                              "Finished RPCs by method and gRPC status code")),
      latency_(HistogramFamily(*registry_, "specwire_scorer_request_duration_seconds",
                               "RPC latency from arrival to the last message, by method")),
      prompts_(
          CounterFamily(*registry_, "specwire_scorer_prompts_scored_total", "Prompts replayed")),
      tokens_(CounterFamily(*registry_, "specwire_scorer_tokens_total",
                            "Trajectory tokens replayed, by kind (prompt, completion)")),
      prompt_latency_(
          HistogramFamily(*registry_, "specwire_scorer_prompt_duration_seconds",
                          "Time from one prompt's result to the next (generation + replay, "
                          "overlapped)")),
      queue_depth_(GaugeFamily(*registry_, "specwire_scorer_queue_depth",
                               "Score jobs waiting for the worker")
                       .Add({})),
      running_(
          GaugeFamily(*registry_, "specwire_scorer_jobs_running", "Score jobs running (0 or 1)")
              .Add({})) {}

void ScorerMetrics::RequestDone(const std::string& method, const std::string& code,
                                double seconds) {
  requests_.Add({{"method", method}, {"code", code}}).Increment();
  latency_.Add({{"method", method}}, kRequestBuckets).Observe(seconds);
}

void ScorerMetrics::SetQueueDepth(int64_t n) { queue_depth_.Set(static_cast<double>(n)); }
void ScorerMetrics::SetRunning(bool running) { running_.Set(running ? 1 : 0); }

void ScorerMetrics::PromptScored(const ScoreLabels& labels, const ResponseAcceptance& r,
                                 int32_t block_size, double seconds) {
  // The same arithmetic as the job's summary (acceptance.h), so the counters add up to it.
  SummaryOptions counts_only;
  counts_only.bootstrap.resamples = 0;
  counts_only.token_window = 0;
  const AcceptanceSummary s = Summarize({r}, block_size, counts_only);
  const auto l = Labels(labels);
  num_drafts_.Add(l).Increment(static_cast<double>(s.num_drafts));
  num_draft_tokens_.Add(l).Increment(static_cast<double>(s.num_draft_tokens));
  num_accepted_tokens_.Add(l).Increment(static_cast<double>(s.num_accepted_tokens));
  for (size_t k = 0; k < s.num_accepted_tokens_per_pos.size(); ++k) {
    auto lp = l;
    lp["position"] = std::to_string(k + 1);  // draft position, 1-based as in the reports
    num_accepted_tokens_per_pos_.Add(lp).Increment(
        static_cast<double>(s.num_accepted_tokens_per_pos[k]));
  }
  prompts_.Add(l).Increment();
  auto lt = l;
  lt["kind"] = "prompt";
  tokens_.Add(lt).Increment(static_cast<double>(r.prompt_tokens));
  lt["kind"] = "completion";
  tokens_.Add(lt).Increment(static_cast<double>(r.completion_tokens));
  prompt_latency_.Add(l, kPromptBuckets).Observe(seconds);
}

void ScorerMetrics::Progress(const ScoreLabels& labels, const ScoreProgress& p) {
  if (p.done == 0) return;
  auto l = Labels(labels);
  l["kind"] = "mean_of_means";
  mean_acceptance_length_.Add(l).Set(p.tau_so_far);
  l["kind"] = "pooled";
  mean_acceptance_length_.Add(l).Set(p.tau_pooled_so_far);
}

void ScorerMetrics::Summary(const ScoreLabels& labels, const AcceptanceSummary& s) {
  auto l = Labels(labels);
  l["kind"] = "mean_of_means";
  mean_acceptance_length_.Add(l).Set(s.tau_mean_of_means);
  l["kind"] = "pooled";
  mean_acceptance_length_.Add(l).Set(s.tau_pooled);
  for (const auto& [budget, tau] : s.ddtree_tau) {
    auto lb = Labels(labels);
    lb["budget"] = std::to_string(budget);
    lb["kind"] = "mean_of_means";
    ddtree_mean_acceptance_length_.Add(lb).Set(tau.first);
    lb["kind"] = "pooled";
    ddtree_mean_acceptance_length_.Add(lb).Set(tau.second);
  }
}

}  // namespace specwire
