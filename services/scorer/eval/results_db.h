// The continuous-evaluation results database (SQLite, Debian's libsqlite3).
//
// One row per (run, step, dataset): status "ok" with the acceptance summary, or "failed" with the
// error. Every write is its own transaction in WAL mode with synchronous=FULL, so a row is on
// disk before Record returns and a crash (of the scorer or the machine) loses nothing recorded;
// readers (the dashboard exporter at start-up, sqlite3 by hand) never block the writer.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract.h"
#include "services/scorer/acceptance/acceptance.h"

struct sqlite3;

namespace specwire {

// One prompt's DFlash steps, kept with a result so that two checkpoints can be compared prompt by
// prompt on the same trajectory (the regression check, training_metrics.h).
struct PromptSteps {
  int64_t prompt_index = 0;
  std::string trajectory_digest;
  std::vector<int32_t> step_lengths;
  int64_t prompt_tokens = 0;
  std::vector<int64_t> trajectory;  // prompt + completion token ids
  bool operator==(const PromptSteps&) const = default;
};

struct CheckpointResult {
  std::string run;
  int64_t step = 0;
  std::string dataset;  // eval set label
  std::string status;   // "ok" | "failed"
  std::string error;    // for "failed"
  std::string source;   // "watch" | "push" | "baseline"
  std::string checkpoint_path;
  std::string checkpoint_digest;  // xxh3-128 over config.json + safetensors ("" when unreadable)
  // What the checkpoint looked like when scored (file names, sizes, mtimes): a failed row is
  // retried when it changes (the trainer rewrote the directory).
  std::string fingerprint;
  AcceptanceSummary summary;  // for "ok"
  std::vector<PromptSteps> prompts;  // for "ok", by prompt index (kept in the summary column)
  // The target's canary fingerprint when scored (kept in the summary column, "target_canary"):
  // rows of one run compare across extractor restarts and hosts (specwire-cli fingerprint).
  CanaryFingerprint target_canary;
  // What the scores depend on (ScoreProvenanceJson; kept in the summary column, "provenance"):
  // build, target digests, template record, eval-set file and checkpoint digests, dtypes.
  std::string provenance;
  std::string started_at;     // UTC, ISO 8601
  std::string finished_at;
  // Not stored: true when this row was read back rather than just scored.
  bool from_database = false;
};

// The summary as JSON (the database column; also the reports).
std::string SummaryToJsonText(const AcceptanceSummary& s);
absl::StatusOr<AcceptanceSummary> SummaryFromJsonText(const std::string& text);
absl::StatusOr<std::vector<PromptSteps>> PromptStepsFromJsonText(const std::string& text);

class ResultsDb {
 public:
  // Opens (creating it and its schema when absent) the database at `path`.
  static absl::StatusOr<std::unique_ptr<ResultsDb>> Open(const std::string& path);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  const std::string& path() const { return path_; }
  // Inserts or replaces the row of (run, step, dataset), in one transaction.
  absl::Status Record(const CheckpointResult& r);
  // The row of (run, step, dataset); nullopt when none.
  absl::StatusOr<std::optional<CheckpointResult>> Find(const std::string& run, int64_t step,
                                                       const std::string& dataset);
  // Every row, ordered by run, step, dataset.
  absl::StatusOr<std::vector<CheckpointResult>> All();

 private:
  ResultsDb() = default;
  absl::Status Exec(const char* sql);
  absl::StatusOr<std::vector<CheckpointResult>> Query(const std::string& where,
                                                      const std::vector<std::string>& text_args,
                                                      std::optional<int64_t> step);

  std::string path_;
  sqlite3* db_ = nullptr;
  std::mutex mu_;  // one connection, used from the evaluation thread and RPC threads
};

}  // namespace specwire
