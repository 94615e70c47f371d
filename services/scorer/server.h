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

#include "common/rpc/stream_watchdog.h"
#include "proto/convert.h"
#include "services/scorer/scorer_convert.h"
#include "proto/specwire/v1/scorer.grpc.pb.h"
#include "services/scorer/metrics.h"
#include "services/scorer/job/score_job.h"
#include "services/scorer/score_worker.h"

namespace specwire {

class ScorerService final : public v1::Scorer::CallbackService {
 public:
  // Everything passed in must outlive the service. `limits` are checked in the reaction. A Score
  // stream whose client has read nothing for `stream_idle_seconds` is cancelled (0: never).
  ScorerService(ScoreWorker* worker, ScorerMetrics* metrics, ScoreLimits limits,
                double stream_idle_seconds = 60);

  grpc::ServerWriteReactor<v1::ScoreResponse>* Score(grpc::CallbackServerContext* ctx,
                                                     const v1::ScoreRequest* request) override;

 private:
  ScoreWorker* worker_;
  ScorerMetrics* metrics_;
  ScoreLimits limits_;
  StreamWatchdog idle_watchdog_;
};

}  // namespace specwire
