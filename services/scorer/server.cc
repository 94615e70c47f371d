#include "services/scorer/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_reactor.h"
#include "common/status.h"

namespace specwire {

ScorerService::ScorerService(ScoreWorker* worker, ScorerMetrics* metrics, ScoreLimits limits,
                             double stream_idle_seconds)
    : worker_(worker),
      metrics_(metrics),
      limits_(std::move(limits)),
      idle_watchdog_(std::chrono::milliseconds(static_cast<int64_t>(stream_idle_seconds * 1000)),
                     "--stream_idle_seconds") {}

grpc::ServerWriteReactor<v1::ScoreResponse>* ScorerService::Score(grpc::CallbackServerContext* ctx,
                                                                  const v1::ScoreRequest* request) {
  ScorerMetrics* metrics = metrics_;
  auto* r = new StreamReactor<v1::ScoreResponse>(
      SteadyDeadline(ctx), [metrics](const std::string& code, double seconds) {
        metrics->RequestDone("Score", code, seconds);
      });
  r->WatchIdle(&idle_watchdog_, ctx);
  auto job = std::make_shared<ScoreJob>();
  job->spec = SpecFromProto(*request);
  absl::Status valid = ValidateSpec(job->spec, limits_);
  if (!valid.ok()) {
    r->Fail(valid);
    return r;
  }
  // The events run on the worker thread only, so their shared state needs no lock.
  struct JobState {
    ScoreLabels labels;
    int32_t block_size = 0;
    std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  };
  auto state = std::make_shared<JobState>();
  job->events.on_start = [r, state](const ScoreStart& s) {
    state->labels = s.labels;
    state->block_size = s.drafter.block_size;
    state->last = std::chrono::steady_clock::now();
    v1::ScoreResponse m;
    ContractToProto(s.contract, m.mutable_contract());
    for (const std::string& e : s.extractors) m.add_extractors(e);
    m.set_drafter_method(s.drafter.method);
    m.set_drafter_format(s.drafter.format);
    m.set_drafter_dtype(s.drafter.dtype);
    m.set_drafter_device(s.drafter.device);
    m.set_method_label(s.labels.method);
    r->SendMessage(std::move(m));
  };
  job->events.on_progress = [r, state, metrics](const ScoreProgress& p) {
    metrics->Progress(state->labels, p);
    v1::ScoreResponse m;
    ProgressToProto(p, m.mutable_progress());
    r->SendMessage(std::move(m));
  };
  job->events.on_prompt = [r, state, metrics](const PromptScore& s) {
    const auto now = std::chrono::steady_clock::now();
    // A result read back from the journal was counted when it was scored (maybe by an earlier
    // process, whose counters Prometheus already has): counting it again would double it.
    if (!s.resumed) {
      metrics->PromptScored(state->labels, s.acceptance, state->block_size,
                            std::chrono::duration<double>(now - state->last).count());
    }
    state->last = now;
    v1::ScoreResponse m;
    PromptScoreToProto(s, m.mutable_result());
    r->SendMessage(std::move(m));
  };
  job->events.on_summary = [r, state, metrics](const AcceptanceSummary& s) {
    metrics->Summary(state->labels, s);
    v1::ScoreResponse m;
    SummaryToProto(s, m.mutable_summary());
    r->SendMessage(std::move(m));
  };
  job->on_done = [r](const absl::Status& s) {
    if (s.ok()) {
      r->Complete();
    } else {
      r->Fail(s);
    }
    r->ReleaseWork();
  };
  ScoreWorker* worker = worker_;
  r->AttachWork([job, worker](const absl::Status& why) {
    job->cancelled = true;
    // A queued job leaves the queue now (its on_done fails the stream); a running one stops at
    // its next prompt.
    worker->Remove(job, why);
  });
  absl::Status submitted = worker_->Submit(job);
  if (!submitted.ok()) {
    r->Fail(submitted);
    r->ReleaseWork();  // on_done will never run
  }
  return r;
}

}  // namespace specwire
