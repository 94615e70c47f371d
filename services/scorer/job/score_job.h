// A scoring job: a drafter against the target one or more extractors serve, on a set of prompts.
// No torch and no protobuf here: the drafter sits behind ScorerBackend (scorer_backend.h), the
// extractors behind ExtractorEndpoint (extractor_pool.h), so the same runner serves the gRPC
// service (server.cc), the in-process CLI (score_cli_main.cc) and unit tests with fakes.
//
// ScoreRunner::Run is the job, in order, each step its own part:
//   1. ConnectTarget (extractor_pool.h): the contract of every extractor (they must serve the
//      same target: weights, tokenizer, geometry, compute dtype);
//   2. the drafter, checked against that contract (contract_checks.h) BEFORE any work;
//   3. ResolvePrompts (score_spec.h): token ids; text through the extractor's Tokenize; or a
//      JSONL dataset;
//   4. EnsureTargetHead (target_head_cache.h): the target's embed_tokens and lm_head;
//   5. the results journal (results_journal.h) of a resumable job, then per prompt the
//      extractor's greedy completion plus the features of every position (TrajectoryFetcher,
//      trajectory_fetcher.h), replayed (DFlash / DDTree-N) on the runner's thread; or, for a
//      live job (ScoreSpec::live), the real loop through an extractor session per prompt
//      (ScorerBackend::Live), with its greedy self-check against the replay;
//   6. the summary (acceptance.h's Summarize over the prompts in index order).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/contract.h"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/job/contract_checks.h"
#include "services/scorer/job/extractor_pool.h"
#include "services/scorer/job/results_journal.h"
#include "services/scorer/job/score_spec.h"
#include "services/scorer/job/scorer_backend.h"
#include "services/scorer/job/target_head_cache.h"
#include "services/scorer/job/trajectory_fetcher.h"

namespace specwire {

// After each prompt (and once before the first, with done = 0).
struct ScoreProgress {
  int64_t done = 0;
  int64_t total = 0;
  int64_t steps = 0;
  double tau_so_far = 0;         // mean of means over the prompts done
  double tau_pooled_so_far = 0;  // tokens / steps over the prompts done
};

// What the job is about to score, once everything was checked.
struct ScoreStart {
  ExtractionContract contract;
  DrafterSpec drafter;
  ScoreLabels labels;  // defaults filled
  TreeSettings trees;  // resolved for the drafter (ResolveTrees)
  int64_t prompts_total = 0;
  std::vector<std::string> extractors;  // addresses
  std::string chat_template_record;     // canonical, "" when the prompts carry none
};

// xxh3-128 of a file's bytes ("" when it cannot be read here: a path on another host).
std::string FileDigestOrEmpty(const std::string& path);

// What scores depend on beyond the numbers, as one JSON object (a report's "provenance", a
// continuous-evaluation row's): specwire's version and commit, the target's weight, tokenizer and
// template digests, the prompts' template record, both dtypes, and the digests of the prompt file
// and the drafter checkpoint where the caller could read them ("" otherwise).
std::string ScoreProvenanceJson(const ExtractionContract& contract, const std::string& drafter_dtype,
                                const std::string& chat_template_record,
                                const std::string& dataset_digest,
                                const std::string& drafter_digest);

// Callbacks, all on the runner's (calling) thread, in this order: on_start once, on_progress
// (done = 0), then per prompt on_prompt + on_progress, then on_summary. Prompts finish in any
// order when several extractors serve them; the summary is over the prompts in index order.
struct ScoreEvents {
  std::function<void(const ScoreStart&)> on_start;
  std::function<void(const ScoreProgress&)> on_progress;
  std::function<void(const PromptScore&)> on_prompt;
  std::function<void(const AcceptanceSummary&)> on_summary;
};

// A runner's settings, one struct per concern.
struct ScoreRunnerOptions {
  TargetHeadOptions head;   // where embed_tokens / lm_head come from
  TrajectoryOptions fetch;  // wire dtype, prefetch, retries of extractor calls
  ScoreLimits limits;       // what a job may ask for
  JournalOptions journal;   // where completed prompts are kept for resumption
  // Where the runner says what it did (fetched or cached the head, retried, ...).
  std::function<void(const std::string&)> log;
};

class ScoreRunner {
 public:
  // Everything passed in must outlive the runner; Run calls never overlap.
  ScoreRunner(ScorerBackend* backend, ExtractorPool* pool, ScoreRunnerOptions options);

  // Runs one job (see the file comment). `cancelled` is polled every 50 ms; a cancelled job
  // cancels its extractor calls in flight (the extractor frees their work) and returns
  // CANCELLED. A Generate that fails with a retryable code is tried again (options.fetch.retry),
  // on whichever extractor is free next. With a results journal (options.journal) prompts it
  // holds are reported as `resumed` and not scored again.
  absl::Status Run(const ScoreSpec& spec, const ScoreEvents& events,
                   const std::atomic<bool>& cancelled);

  const ScoreRunnerOptions& options() const { return options_; }

 private:
  class Tally;
  absl::StatusOr<DrafterSpec> LoadCheckedDrafter(const ScoreSpec& spec,
                                                 const ExtractionContract& contract);
  absl::StatusOr<std::unique_ptr<ResultsJournal>> OpenJournal(
      const ScoreSpec& spec, const ExtractionContract& contract, const DrafterSpec& drafter,
      const std::vector<std::vector<int64_t>>& prompts);
  absl::Status ReplayTrajectories(const ScoreSpec& spec, const TreeSettings& trees,
                                  const ConnectedTarget& target,
                                  const DrafterSpec& drafter,
                                  const std::vector<std::vector<int64_t>>& prompts,
                                  ResultsJournal* journal, Tally& tally,
                                  const std::atomic<bool>& cancelled);
  // A live job (spec.live): each prompt through an extractor session and the drafter's live
  // loop; with greedy verification, the first live.self_check_prompts prompts are also replayed
  // on their Generate trajectory and compared step for step (`live` gets the counts).
  absl::Status LiveScores(const ScoreSpec& spec, const ConnectedTarget& target,
                          const DrafterSpec& drafter,
                          const std::vector<std::vector<int64_t>>& prompts,
                          ResultsJournal* journal, Tally& tally,
                          const std::atomic<bool>& cancelled, LiveSummary* live);
  void Log(const std::string& line) const;

  ScorerBackend* backend_;
  ExtractorPool* pool_;
  ScoreRunnerOptions options_;
};

}  // namespace specwire
