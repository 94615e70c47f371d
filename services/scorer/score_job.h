// A scoring job: a drafter against the target one or more extractors serve, on a set of prompts.
// No torch and no protobuf here: the drafter sits behind ScorerBackend (scorer_backend.h), the
// extractors behind ExtractorEndpoint (the C++ extractor client), so the same runner serves the
// gRPC service (server.cc), the in-process CLI (score_cli_main.cc) and unit tests with fakes.
//
// A job, in order:
//   1. the contract of every extractor (they must serve the same target: weights, tokenizer,
//      geometry, compute dtype);
//   2. the drafter, checked against that contract (CheckDrafterContract) BEFORE any work;
//   3. the prompts (token ids; text through the extractor's Tokenize; or a JSONL dataset);
//   4. the target's embed_tokens and lm_head (a local checkpoint, a digest-keyed cache, or the
//      extractor's GetTensors);
//   5. per prompt: the extractor's greedy completion plus the features of every position
//      (Generate), then the DFlash / DDTree-N replay on the scorer's thread;
//   6. the summary (acceptance.h's Summarize over the prompts in index order).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/cli/extractor_client.h"
#include "common/contract.h"
#include "services/scorer/acceptance.h"
#include "services/scorer/scorer_backend.h"

namespace specwire {

// Metric labels of a job (see ResolveLabels for the defaults).
struct ScoreLabels {
  std::string drafter;
  std::string dataset;
  std::string method;
  bool operator==(const ScoreLabels&) const = default;
};

// A job as plain values (from a ScoreRequest, or the CLI's flags).
struct ScoreSpec {
  std::string drafter_path;            // drafter directory on the scorer host
  std::vector<InputSequence> prompts;  // token ids or text
  std::string dataset_path;            // or a JSONL file: {"prompt": str} | {"input_ids": [int]}
  int64_t max_prompts = 0;             // 0: all
  int64_t max_new_tokens = 256;
  std::vector<int32_t> ddtree_budgets = {8};
  ScoreLabels labels;
  bool add_special_tokens = false;  // for text prompts
  // Names the job for resumption (ScoreRequest.job_id): with a results journal, a job
  // submitted again under the same id and spec skips the prompts it completed before. "": none.
  // At most 128 characters of [A-Za-z0-9._-].
  std::string job_id;
};

// The labels with defaults filled: the drafter directory's name, the dataset file's stem or
// "inline", "dflash".
ScoreLabels ResolveLabels(const ScoreSpec& spec);

// One prompt's replay.
struct PromptScore {
  int64_t prompt_index = 0;
  ResponseAcceptance acceptance;  // step lengths (a + 1), DDTree-N step lengths, token counts
  std::string finish_reason;      // "stop_token" | "max_new_tokens"
  double tau = 0;                 // mean of the step lengths (0 without steps)
  // Read back from the results journal (scored by an earlier run of the job): reported again,
  // but not counted again in metrics.
  bool resumed = false;
};

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
  int64_t prompts_total = 0;
  std::vector<std::string> extractors;  // addresses
};

// Callbacks, all on the runner's (calling) thread, in this order: on_start once, on_progress
// (done = 0), then per prompt on_prompt + on_progress, then on_summary. Prompts finish in any
// order when several extractors serve them; the summary is over the prompts in index order.
struct ScoreEvents {
  std::function<void(const ScoreStart&)> on_start;
  std::function<void(const ScoreProgress&)> on_progress;
  std::function<void(const PromptScore&)> on_prompt;
  std::function<void(const AcceptanceSummary&)> on_summary;
};

// τ of one list of step lengths (0 for none).
double MeanStepLength(const std::vector<int32_t>& lengths);

// The drafter against the target the extractor serves (shared DESIGN "Extraction contract"):
// num_target_layers, hidden size (fc in_features / len(target_layer_ids)), vocab_size, every
// target_layer_id inside the target, mask_token_id inside the vocabulary. FAILED_PRECONDITION
// naming every mismatching field with both values, e.g.
//   "num_target_layers: drafter expects 64, extractor serves 36".
absl::Status CheckDrafterContract(const DrafterSpec& drafter, const ExtractionContract& target);

// Extractors serving one job must serve the same target. FAILED_PRECONDITION naming the field
// and both addresses' values.
absl::Status CheckSameTarget(const std::string& address_a, const ExtractionContract& a,
                             const std::string& address_b, const ExtractionContract& b);

// A JSONL prompt file: one object per line, {"prompt": str} or {"input_ids": [int, ...]}; blank
// lines are skipped. At most max_prompts (0: all). INVALID_ARGUMENT names the file and line.
absl::StatusOr<std::vector<InputSequence>> ReadPromptDataset(const std::string& path,
                                                             int64_t max_prompts);

// The decoder states a drafter needs from the extractor, and how its features are built from
// them. dflash's extract_context_feature takes HF hidden_states[id + 1]; for id = L − 1 that is
// the final-norm output (transformers puts the normed state there), which the extractor serves
// as the final_norm tap — layer id L − 1 of the extractor is the raw, un-normed output.
RequestedStates DrafterStates(const std::vector<int64_t>& target_layer_ids, int64_t num_layers);
// The trajectory of one Generate reply (one prompt): tokens, prompt length, and the states in
// target_layer_ids order (moved out of `reply`).
absl::StatusOr<Trajectory> TrajectoryFromReply(GenerateReply& reply,
                                               const std::vector<int64_t>& target_layer_ids,
                                               int64_t num_layers, int64_t max_new_tokens);

// One extractor, as the job sees it (ExtractorClient in production, fakes in tests). Calls may
// come from several threads at once.
class ExtractorEndpoint {
 public:
  virtual ~ExtractorEndpoint() = default;
  virtual std::string address() const = 0;
  virtual absl::StatusOr<ExtractionContract> Info() = 0;
  virtual absl::StatusOr<std::vector<std::vector<int64_t>>> Tokenize(
      const std::vector<std::string>& texts, bool add_special_tokens) = 0;
  virtual absl::StatusOr<GenerateReply> Generate(const GenerateParams& params) = 0;
  virtual absl::StatusOr<std::map<std::string, ReceivedTensor>> GetTensors(
      const std::vector<std::string>& names) = 0;
};

std::unique_ptr<ExtractorEndpoint> MakeClientEndpoint(ExtractorClientOptions options);

// The extractors of a job. The spec is "host:port", a comma list of them, or "dns:///name:port"
// (every address of the name, resolved again for each job, so a scaled deployment is picked
// up). The C++ client talks to one address per channel, so each address gets its own client and
// prompts are spread over them: each extractor takes the next prompt when it is free.
class ExtractorPool {
 public:
  static absl::StatusOr<std::unique_ptr<ExtractorPool>> Create(const std::string& spec,
                                                               ExtractorClientOptions base);
  // A fixed set (tests); `as_dns` gives it the dns: behaviour (unanswering addresses left out).
  static std::unique_ptr<ExtractorPool> FromEndpoints(
      std::vector<std::unique_ptr<ExtractorEndpoint>> endpoints, bool as_dns = false);
  ~ExtractorPool();

  const std::string& spec() const { return spec_; }
  // A dns: spec: the address set may change between jobs, and a job leaves out addresses that
  // do not answer (UNAVAILABLE) as long as one does.
  bool resolves_by_dns() const { return dns_; }
  // The endpoints for one job (re-resolving a dns:/// spec). Thread-compatible.
  absl::StatusOr<std::vector<ExtractorEndpoint*>> Endpoints();

 private:
  ExtractorPool() = default;
  std::string spec_;
  ExtractorClientOptions base_;
  bool fixed_ = false;
  bool dns_ = false;
  std::map<std::string, std::unique_ptr<ExtractorEndpoint>> by_address_;
  std::vector<ExtractorEndpoint*> fixed_list_;
};

// Splits "a:1, b:2" (or resolves "dns:///name:port") into host:port addresses.
absl::StatusOr<std::vector<std::string>> ResolveExtractorAddresses(const std::string& spec);

// How a job retries an extractor call that failed for a reason a retry can fix (the extractor
// went away: UNAVAILABLE, which is also what a reset connection or a server killed in the middle
// of a stream gives; ABORTED). Greedy trajectories are deterministic, so asking again is safe.
// Other codes (INVALID_ARGUMENT, FAILED_PRECONDITION, DATA_LOSS, ...) fail the job at once.
struct ExtractorRetryPolicy {
  int max_attempts = 6;             // per prompt, the first included; 1: no retry
  double initial_backoff_s = 0.1;   // before the second attempt
  double backoff_multiplier = 2.0;  // each later wait grows by this factor
  double max_backoff_s = 2.0;       // the longest wait
  // The wait before attempt n + 1 (n >= 1 attempts made).
  double Backoff(int attempts_made) const;
};
bool IsRetryableExtractorError(const absl::Status& s);

// A job's completed prompts on disk: one JSON line per prompt, appended and fsync'ed as each
// finishes, so a scorer that dies loses at most the prompt in progress. Every line carries the
// job's key (the job id and a digest of everything that decides the numbers: target weights,
// drafter files, prompts, max_new_tokens, DDTree budgets, wire dtype, drafter dtype), so results
// of a changed job are never reused. A torn last line (a crash mid-write) is ignored and cut
// off before the next append; lines of other keys are ignored.
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

struct ScoreRunnerOptions {
  // Where the target's embed_tokens / lm_head come from: a local checkpoint directory (no
  // transfer) or the extractor's GetTensors, cached under cache_dir keyed by tensor digest
  // ("" : no cache).
  std::string target_checkpoint;
  std::string cache_dir;
  // Wire dtype of the features: kF32 or kBF16.
  DType wire_dtype = DType::kF32;
  // Trajectories fetched ahead of the replay, per extractor (memory: one trajectory's features
  // each).
  int64_t prefetch_per_extractor = 1;
  // Limits on a job (INVALID_ARGUMENT beyond them).
  int64_t max_prompts = 100000;
  int64_t max_new_tokens = 4096;
  int64_t max_ddtree_budget = 4096;
  int64_t max_ddtree_budgets = 16;
  // Paths in a spec (drafter, dataset) must lie under this directory ("" : anywhere).
  std::string data_root;
  // Extractor calls (Generate) that fail with a retryable code are tried again.
  ExtractorRetryPolicy retry;
  // The results journal of a job with a job_id: <results_dir>/<job_id>.jsonl ("" : none), or
  // results_file for every job (the CLI's --resume_file).
  std::string results_dir;
  std::string results_file;
  // Where the runner says what it did (fetched or cached the head, ...).
  std::function<void(const std::string&)> log;
};

// Checks a spec against the limits (cheap; before a job is queued).
absl::Status ValidateSpec(const ScoreSpec& spec, const ScoreRunnerOptions& options);

class ScoreRunner {
 public:
  // Everything passed in must outlive the runner; Run calls never overlap.
  ScoreRunner(ScorerBackend* backend, ExtractorPool* pool, ScoreRunnerOptions options);

  // Runs one job (see the file comment). `cancelled` is polled every 50 ms; a cancelled job
  // cancels its extractor calls in flight (the extractor frees their work) and returns
  // CANCELLED. A Generate that fails with a retryable code is tried again (options.retry), on
  // whichever extractor is free next. With a results journal (options.results_dir + a job_id, or
  // options.results_file) prompts it holds are reported as `resumed` and not scored again.
  absl::Status Run(const ScoreSpec& spec, const ScoreEvents& events,
                   const std::atomic<bool>& cancelled);

 private:
  absl::StatusOr<std::vector<std::vector<int64_t>>> ResolvePrompts(
      const ScoreSpec& spec, ExtractorEndpoint* tokenizer, const ExtractionContract& contract);
  absl::Status EnsureTargetHead(ExtractorEndpoint* endpoint, const ExtractionContract& contract);
  void Log(const std::string& line) const;

  ScorerBackend* backend_;
  ExtractorPool* pool_;
  ScoreRunnerOptions options_;
};

// The target-head cache on disk: <dir>/tensors/<digest>.safetensors (one tensor, named by its
// canonical name) and <dir>/targets/<weights digest>.json ({name: digest}).
absl::StatusOr<TargetHead> LoadCachedTargetHead(const std::string& cache_dir,
                                                const std::string& weights_digest);
absl::Status StoreTargetHead(const std::string& cache_dir, const std::string& weights_digest,
                             const TargetHead& head);
// The head of a local checkpoint directory (embed_tokens; lm_head or, when tied, the
// embedding), after checking its config against the extractor's contract.
absl::StatusOr<TargetHead> LoadCheckpointTargetHead(const std::string& dir,
                                                    const ExtractionContract& contract);

}  // namespace specwire
