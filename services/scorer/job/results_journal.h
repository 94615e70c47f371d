// A job's completed prompts on disk, so that a scorer that dies resumes the job instead of
// scoring it again (ScoreRequest.job_id, specwire-score --resume_file).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract.h"
#include "common/safetensors.h"
#include "services/scorer/job/score_spec.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

// One JSON line per prompt, appended and fsync'ed as each finishes, so a scorer that dies loses
// at most the prompt in progress. Every line carries the job's key (the job id and a digest of
// everything that decides the numbers: target weights, drafter files, prompts, max_new_tokens,
// DDTree budgets, wire dtype, drafter dtype), so results of a changed job are never reused. A
// torn last line (a crash mid-write) is ignored and cut off before the next append; lines of
// other keys are ignored.
class ResultsJournal {
 public:
  // Opens (creates) `path` and reads back the results recorded under `key`.
  static absl::StatusOr<std::unique_ptr<ResultsJournal>> Open(const std::string& path,
                                                              const std::string& key);
  ~ResultsJournal();
  ResultsJournal(const ResultsJournal&) = delete;
  ResultsJournal& operator=(const ResultsJournal&) = delete;

  // Completed prompts of this key, by index (marked resumed).
  const std::map<int64_t, PromptScore>& completed() const { return completed_; }
  int64_t ignored_lines() const { return ignored_lines_; }
  // Appends one prompt's line and fsyncs it.
  absl::Status Append(const PromptScore& score);
  const std::string& path() const { return path_; }

 private:
  ResultsJournal() = default;
  std::string path_;
  std::string key_;
  int fd_ = -1;
  std::map<int64_t, PromptScore> completed_;
  int64_t ignored_lines_ = 0;
};

// The journal key of a job (see ResultsJournal).
std::string JobKey(const ScoreSpec& spec, const ExtractionContract& contract,
                   const DrafterSpec& drafter, const std::string& drafter_digest,
                   const std::vector<std::vector<int64_t>>& prompts, DType wire_dtype);
// Digest of a drafter directory's config.json and *.safetensors files (names and bytes).
absl::StatusOr<std::string> DigestDrafterFiles(const std::string& dir);

// Where a job's journal lives: <results_dir>/<job_id>.jsonl for a job with an id ("" : none),
// or results_file for every job (the CLI's --resume_file).
struct JournalOptions {
  std::string results_dir;
  std::string results_file;
  // The journal's path for `spec` ("" : the job keeps none).
  std::string PathFor(const ScoreSpec& spec) const;
};

}  // namespace specwire
