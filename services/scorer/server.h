// The Scorer gRPC service (callback API). A Score call is validated in its reaction, queued on
// the ScoreWorker and streamed from there: the contract, Progress and PromptResult messages as
// prompts finish, then the AcceptanceSummary. Reactions never run the drafter or call the
// extractors; the worker thread does (one job at a time: the drafter is not shared).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "proto/convert.h"
#include "proto/specwire/v1/scorer.grpc.pb.h"
#include "services/scorer/metrics.h"
#include "services/scorer/score_job.h"

namespace specwire {

// A queued or running job. `on_done` runs exactly once: on the worker thread after the job, or
// on the thread that removes it from the queue (cancel, shutdown) or whose Submit fails.
struct ScoreJob {
  ScoreSpec spec;
  ScoreEvents events;
  std::atomic<bool> cancelled{false};
  std::function<void(const absl::Status&)> on_done;
};

// One worker thread running queued jobs in order through a ScoreRunner.
class ScoreWorker {
 public:
  // `runner` and `metrics` (may be null) must outlive the worker.
  ScoreWorker(ScoreRunner* runner, int64_t max_queue, ScorerMetrics* metrics);
  ~ScoreWorker();  // Shutdown()

  // RESOURCE_EXHAUSTED when max_queue jobs wait already; UNAVAILABLE once draining. The job's
  // on_done has not run when this fails (the caller reports the error).
  absl::Status Submit(std::shared_ptr<ScoreJob> job);
  // Takes a queued job out and completes it with `status`; false when it is not queued.
  bool Remove(const std::shared_ptr<ScoreJob>& job, const absl::Status& status);
  // Stops accepting jobs and waits up to `seconds` for queued and running ones; what is left then
  // is cancelled.
  void Drain(double seconds);
  void Shutdown();
  int64_t queue_depth() const;

 private:
  void Loop();

  ScoreRunner* runner_;
  int64_t max_queue_;
  ScorerMetrics* metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ScoreJob>> queue_;
  std::shared_ptr<ScoreJob> running_;
  bool accepting_ = true;
  bool stop_ = false;
  std::thread thread_;
};

class ScorerService final : public v1::Scorer::CallbackService {
 public:
  // Everything passed in must outlive the service. `limits` are checked in the reaction.
  ScorerService(ScoreWorker* worker, ScorerMetrics* metrics, ScoreRunnerOptions limits);

  grpc::ServerWriteReactor<v1::ScoreResponse>* Score(grpc::CallbackServerContext* ctx,
                                                     const v1::ScoreRequest* request) override;

 private:
  ScoreWorker* worker_;
  ScorerMetrics* metrics_;
  ScoreRunnerOptions limits_;
};

// Conversions between the plain job types and the proto (the server, the CLI, tests); the
// contract's are in proto/convert.h.
void PromptScoreToProto(const PromptScore& s, v1::PromptResult* out);
PromptScore PromptScoreFromProto(const v1::PromptResult& p);
void ProgressToProto(const ScoreProgress& p, v1::Progress* out);
void SummaryToProto(const AcceptanceSummary& s, v1::AcceptanceSummary* out);
AcceptanceSummary SummaryFromProto(const v1::AcceptanceSummary& p);
// Proto defaults applied: max_new_tokens 0 → 256, no ddtree_budgets → [8].
ScoreSpec SpecFromProto(const v1::ScoreRequest& r);
void SpecToProto(const ScoreSpec& s, v1::ScoreRequest* out);

}  // namespace specwire
