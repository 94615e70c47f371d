// Push mode of continuous evaluation: specwire.v1.CheckpointScorer/SubmitDrafter.
//
// The client streams a header (run, step, every file's name, size and xxh3-128 digest) and then
// the files' chunks in order. The reactions only write the chunks to a partial directory under
// the upload directory and digest them as they arrive (bounded by --max_upload_bytes, checked
// against the header before any byte is written and against every chunk); once every file is
// whole and its digest matches, the checkpoint goes to the EvaluationLoop, which moves it to
// <upload_dir>/<run>/checkpoint-<step>, scores it on every eval set (ContinuousEvaluator, as a
// watched checkpoint) and answers. A (run, step) recorded "ok" before is answered from the
// database when the upload's digest is the recorded one, and refused (ALREADY_EXISTS) otherwise.
#pragma once

#include <string>

#include "proto/specwire/v1/scorer.grpc.pb.h"
#include "services/scorer/metrics.h"
#include "services/scorer/server.h"
#include "services/scorer/eval/watch.h"

namespace specwire {

struct SubmitOptions {
  std::string upload_dir;
  int64_t max_upload_bytes = int64_t{8} << 30;
  int64_t max_files = 1024;
};

class CheckpointScorerService final : public v1::CheckpointScorer::CallbackService {
 public:
  // Everything passed in must outlive the service (`metrics` may be null).
  CheckpointScorerService(EvaluationLoop* loop, ContinuousEvaluator* evaluator,
                          ScorerMetrics* metrics, SubmitOptions options);

  grpc::ServerReadReactor<v1::DrafterUpload>* SubmitDrafter(grpc::CallbackServerContext* ctx,
                                                            v1::SubmitDrafterReply* reply) override;

 private:
  EvaluationLoop* loop_;
  ContinuousEvaluator* evaluator_;
  ScorerMetrics* metrics_;
  SubmitOptions options_;
};

// A ScoreFn that runs each job on the service's ScoreWorker (queued with the Score calls; the
// vLLM counters and τ gauges of `metrics` are updated as for them) and waits for it.
ScoreFn MakeWorkerScoreFn(ScoreWorker* worker, ScorerMetrics* metrics);

// Everything continuous evaluation needs in the scorer service, built from its flags.
struct ContinuousEvalConfig {
  std::vector<EvalSet> eval_sets;
  EvaluatorOptions evaluator;  // eval_sets are copied in
  std::string db_path;
  std::string watch_dir;  // "" : push mode only
  WatchOptions watch;
  double poll_seconds = 5;
  std::string baseline_drafter;  // scored once as run "baseline", step 0
  SubmitOptions submit;
  // The service's limits (and --data_root): the eval settings are checked against them at
  // start-up, so a misfit is a start-up error rather than every checkpoint recorded as failed.
  ScoreLimits limits;
};

class ContinuousEval {
 public:
  // Opens the database, re-exports it to the gauges, and starts the evaluation thread.
  static absl::StatusOr<std::unique_ptr<ContinuousEval>> Start(ContinuousEvalConfig config,
                                                               ScoreWorker* worker,
                                                               ScorerMetrics* metrics);
  ~ContinuousEval();
  grpc::Service* service() { return service_.get(); }
  // Before the worker drains: no new scans or uploads.
  void RequestStop() { loop_->RequestStop(); }
  // After the worker shut down: the evaluation thread ends, queued uploads get UNAVAILABLE.
  void Stop() { loop_->Stop(); }

 private:
  ContinuousEval() = default;
  std::unique_ptr<ResultsDb> db_;
  std::unique_ptr<TrainingMetrics> training_metrics_;
  std::unique_ptr<ContinuousEvaluator> evaluator_;
  std::unique_ptr<CheckpointWatcher> watcher_;
  std::unique_ptr<EvaluationLoop> loop_;
  std::unique_ptr<CheckpointScorerService> service_;
};

// A run label usable as a directory name and metric label: [A-Za-z0-9._-], 1..128 characters,
// not starting with '.'. INVALID_ARGUMENT naming `field`.
absl::Status ValidateRunName(const std::string& run, const std::string& field);

// The reply's scores from evaluator results.
void CheckpointResultToProto(const CheckpointResult& r, v1::CheckpointScore* out);

}  // namespace specwire
