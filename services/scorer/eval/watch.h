// Continuous evaluation: drafter checkpoints scored once per eval set as training produces them.
//
// Two ways in, one path through:
//   watch mode  CheckpointWatcher scans a directory; a checkpoint is a subdirectory holding
//               config.json and *.safetensors, taken once it is complete (see Poll);
//   push mode   a training pipeline uploads a checkpoint (submit_service.h) as (run, step).
// Either way ContinuousEvaluator scores the directory on every configured eval set through the
// job runner (score_job.h: the same contract checks and replay as a Score call), records each
// result in the ResultsDb keyed (run, step, dataset) and updates the TrainingMetrics gauges. A key
// recorded "ok" is never scored again (a restart rescores nothing); a "failed" key is retried only
// when the checkpoint's files change. Errors that are not the checkpoint's fault (an extractor
// unreachable, a shutdown) are not recorded, so the checkpoint is scored on a later scan.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/scorer/eval/results_db.h"
#include "services/scorer/job/score_job.h"
#include "services/scorer/eval/training_metrics.h"

namespace specwire {

struct EvalSet {
  std::string label;
  std::string path;  // JSONL prompts (ReadPromptDataset's format)
};

// "label=path,path2,...": a label defaults to the file's stem. INVALID_ARGUMENT naming the entry
// (empty, duplicate label).
absl::StatusOr<std::vector<EvalSet>> ParseEvalSets(absl::string_view flag);

// The training step in a checkpoint directory's name: "checkpoint-1200", "step_1200", "step1200",
// "global_step1200", "1200" (nullopt otherwise).
std::optional<int64_t> StepFromName(absl::string_view name);
// The step from the name, else trainer_state.json's global_step. NOT_FOUND when neither says.
absl::StatusOr<int64_t> CheckpointStep(const std::string& dir);

// The regular files of a directory (name, size, mtime), one string: equal across two scans means
// nothing was written in between.
absl::StatusOr<std::string> DirectoryFingerprint(const std::string& dir);

// A checkpoint is complete when config.json parses as a JSON object and there is at least one
// *.safetensors whose header parses and whose tensors lie inside the file (a file still being
// written ends before its header says). DATA_LOSS / INVALID_ARGUMENT / NOT_FOUND naming the file.
absl::Status CheckCheckpointComplete(const std::string& dir);

// xxh3-128 over config.json and the safetensors files (names and contents, sorted by name).
absl::StatusOr<std::string> CheckpointDigest(const std::string& dir);

// xxh3-128 of one file ("xxh3-128:<hex>", as ContentDigest).
absl::StatusOr<std::string> FileDigest(const std::string& path);

// What scoring one eval set gives: the summary and each prompt's steps.
struct EvalScore {
  AcceptanceSummary summary;
  std::vector<PromptScore> prompts;
  CanaryFingerprint target_canary;  // the scored target's (from its contract)
  std::string provenance;           // ScoreProvenanceJson of the job (JSON object text)
};

// Scores one drafter directory on one eval set (the service runs it on its ScoreWorker, the CLI
// on its own ScoreRunner).
using ScoreFn = std::function<absl::StatusOr<EvalScore>(const ScoreSpec&)>;

struct EvaluatorOptions {
  std::vector<EvalSet> eval_sets;
  int64_t max_prompts = 0;  // per eval set, 0: all
  int64_t max_new_tokens = 256;
  std::vector<int32_t> ddtree_budgets = {8};
  RegressionOptions regression;  // the latest-vs-previous check (training_metrics.h)
  std::function<void(const std::string&)> log;
};

// One checkpoint to evaluate.
struct CheckpointRef {
  std::string run;
  int64_t step = 0;
  std::string dir;
  std::string fingerprint;  // DirectoryFingerprint (watch) or the upload's digest (push)
  std::string source;       // "watch" | "push" | "baseline"
};

// True for errors that describe the checkpoint (recorded as failed), false for errors of the
// service around it (retried later): UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED, ...
bool IsCheckpointError(const absl::Status& s);

class ContinuousEvaluator {
 public:
  // `db` and `metrics` (may be null) must outlive the evaluator.
  ContinuousEvaluator(ResultsDb* db, ScoreFn score, EvaluatorOptions options,
                      TrainingMetrics* metrics);

  const EvaluatorOptions& options() const { return options_; }
  ResultsDb* db() const { return db_; }

  // Every row of the database into the metrics (start-up).
  absl::Status ExportRecorded();
  // Scores `c` on every eval set not recorded yet and records the outcomes. Returns one result
  // per eval set (recorded earlier or now); an error when one could not be scored for a reason
  // outside the checkpoint (nothing recorded for it: retried later).
  absl::StatusOr<std::vector<CheckpointResult>> Evaluate(const CheckpointRef& c);
  // Records `error` for every eval set of `c` not recorded "ok" (a checkpoint that cannot be
  // scored at all: incomplete, corrupt, no step).
  absl::StatusOr<std::vector<CheckpointResult>> RecordFailure(const CheckpointRef& c,
                                                              const absl::Status& error);
  // True when every eval set of `c` is recorded "ok", or "failed" with c's fingerprint.
  absl::StatusOr<bool> AllRecorded(const CheckpointRef& c);

 private:
  void Log(const std::string& line) const;
  absl::Status Store(const CheckpointResult& r);

  ResultsDb* db_;
  ScoreFn score_;
  EvaluatorOptions options_;
  TrainingMetrics* metrics_;
};

struct WatchOptions {
  std::string dir;
  std::string run;  // default: the watched directory's name
  // A checkpoint is taken once its fingerprint did not change across `stable_polls` + 1 scans;
  // with a marker file name, only directories holding it are considered (the fingerprint rule
  // still applies).
  int stable_polls = 1;
  std::string marker;
};

// Scans a checkpoint directory (Poll, from the caller's thread: EvaluationLoop or the CLI).
class CheckpointWatcher {
 public:
  CheckpointWatcher(ContinuousEvaluator* evaluator, WatchOptions options, TrainingMetrics* metrics);
  const WatchOptions& options() const { return options_; }
  // One scan: every subdirectory that is new or changed since the last scan waits; one whose
  // files were unchanged across the scans is checked (CheckCheckpointComplete) and evaluated, in
  // step order. Returns how many checkpoints were evaluated or recorded as failed in this scan;
  // an error when the directory itself cannot be read or the service around the job failed.
  absl::StatusOr<int> Poll(const std::atomic<bool>& stop);

 private:
  struct Seen {
    std::string fingerprint;
    int stable = 0;
    bool done = false;  // evaluated with this fingerprint
  };
  ContinuousEvaluator* evaluator_;
  WatchOptions options_;
  TrainingMetrics* metrics_;
  std::map<std::string, Seen> seen_;  // by directory name
};

// The service's evaluation thread: watch scans every poll_seconds, the baseline once, and tasks
// posted by the push RPC, one at a time (the drafter is not shared).
class EvaluationLoop {
 public:
  // `watcher` may be null (push mode only).
  EvaluationLoop(CheckpointWatcher* watcher, double poll_seconds,
                 std::function<void(const std::string&)> log);
  ~EvaluationLoop();  // Stop()

  // `first` runs on the loop thread before the first scan (the baseline drafter).
  // `first` runs on the loop thread before each scan until it returns true (the baseline
  // drafter, retried while the extractor is not reachable).
  void Start(std::function<bool(const std::atomic<bool>& stop)> first);
  // Runs `task(stopping)` on the loop thread; when the loop stops first, task(true) runs on the
  // stopping thread. False (task not run) once stopped.
  bool Post(std::function<void(bool stopping)> task);
  // No new scans or tasks from now on (the loop ends after the task or scan in progress).
  void RequestStop();
  // RequestStop, waits for the loop thread, runs the queued tasks with stopping = true.
  void Stop();
  // True while Stop was not called (score functions poll it).
  const std::atomic<bool>& stopping() const { return stop_; }

 private:
  void Loop(std::function<bool(const std::atomic<bool>&)> first);

  CheckpointWatcher* watcher_;
  double poll_seconds_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(bool)>> tasks_;
  std::atomic<bool> stop_{false};
  bool started_ = false;
  std::thread thread_;
};

// The current UTC time, ISO 8601 with seconds.
std::string UtcNow();

}  // namespace specwire
