// A scoring job as plain values (from a ScoreRequest or the CLI's flags), the limits a scorer
// puts on it, and its prompts: validation (ValidateSpec), the JSONL dataset reader and the
// prompts as token ids (ResolvePrompts: text through the extractor's tokenizer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/cpp/extractor_client.h"
#include "common/contract.h"
#include "services/scorer/acceptance/acceptance.h"

namespace specwire {

class ExtractorEndpoint;

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
  std::vector<int32_t> ddtree_budgets = {8};  // node budgets of the family's tree
  // EAGLE's top-k tree (EAGLE-3 drafters; TreeSettings): levels (0: the drafter's whole chain)
  // and breadth (0: TreeSettings::kDefaultEagleTopK).
  int32_t tree_depth = 0;
  int32_t tree_top_k = 0;
  ScoreLabels labels;
  bool add_special_tokens = false;  // for text prompts
  // Names the job for resumption (ScoreRequest.job_id): with a results journal, a job
  // submitted again under the same id and spec skips the prompts it completed before. "": none.
  // At most 128 characters of [A-Za-z0-9._-].
  std::string job_id;
  // Intervals and token windows of the summary.
  SummaryOptions summary;
  // Teacher-forced acceptance at these settings (both rules each); empty: none.
  std::vector<SamplingSetting> sampling;
  // A family that predicts its acceptance (DSpark) reports its predictions against the observed
  // and the τ of an adaptive verify length at each of these cutoffs (ascending, in [0, 1]).
  std::vector<double> predicted_cutoffs;
  // The chat template record the prompts were prepared under (specwire_client.chat's
  // TemplateRecord as JSON: {"digest", "source", "flags"}); "": none given. Dataset lines may
  // carry it too ("chat_template").
  std::string chat_template_record;
  // The real loop through extractor sessions instead of the replay (ScoreRequest.live).
  struct Live {
    bool enabled = false;
    SamplingSetting setting{0, 1, 0};
    std::string rule = kRuleArgmaxDraft;
    uint64_t seed = 0;
    int64_t self_check_prompts = 2;  // greedy only: also replayed, compared step for step
  } live;
};

// A template record as canonical JSON ({"digest": .., "flags": {..}}, keys sorted; the source
// is left out: the same template read from another file is the same template). INVALID_ARGUMENT
// naming `where` on a malformed one.
absl::StatusOr<std::string> CanonicalTemplateRecord(const std::string& json_text,
                                                    const std::string& where);

// FAILED_PRECONDITION when the drafter directory records the template its training data was
// prepared with (specwire_training.json: {"chat_template": {...}}) and `record` (canonical,
// non-empty) differs from it, naming both.
absl::Status CheckTemplateRecord(const std::string& drafter_dir, const std::string& record);

// The tree the job's budgets grow for a drafter whose family drafts `tree` (DrafterSpec::tree)
// with chains of block_size − 1 drafts: DDTree over the block's marginals, EAGLE's top-k tree
// (depth and top-k resolved), or none. INVALID_ARGUMENT naming tree_depth when it exceeds the
// drafter's chain.
absl::StatusOr<TreeSettings> ResolveTrees(const ScoreSpec& spec, const std::string& tree,
                                          int32_t block_size);

// The labels with defaults filled: the drafter directory's name, the dataset file's stem or
// "inline", "dflash".
ScoreLabels ResolveLabels(const ScoreSpec& spec);

// What a scorer accepts (INVALID_ARGUMENT beyond it, naming the flag).
struct ScoreLimits {
  int64_t max_prompts = 100000;
  int64_t max_new_tokens = 4096;
  int64_t max_ddtree_budget = 4096;
  int64_t max_ddtree_budgets = 16;
  // Bytes of one text prompt (inline or in a dataset) at most: refused before it is queued or
  // sent to an extractor.
  int64_t max_text_bytes = 1 << 20;
  int64_t max_bootstrap_resamples = 100000;
  int64_t max_sampling_settings = 8;
  // Paths in a spec (drafter, dataset) must lie under this directory ("" : anywhere).
  std::string data_root;
};

// Checks a spec against the limits (cheap; before a job is queued).
absl::Status ValidateSpec(const ScoreSpec& spec, const ScoreLimits& limits);

// One prompt's replay.
struct PromptScore {
  int64_t prompt_index = 0;
  ResponseAcceptance acceptance;  // step lengths (a + 1), DDTree-N step lengths, token counts
  std::string finish_reason;      // "stop_token" | "max_new_tokens"
  // xxh3-128 of the trajectory's token ids (prompt + completion): two scores are paired only on
  // the same trajectory (specwire-score --compare, continuous evaluation's regression check).
  std::string trajectory_digest;
  // The trajectory itself (prompt + completion token ids), in-process only (not sent, not
  // journaled): continuous evaluation keeps it to pair checkpoints on a common prefix.
  std::vector<int64_t> trajectory;
  // The completion alone, as the scorer service sends it (PromptResult.completion_token_ids),
  // where the trajectory is not known; CompletionTokens() reads whichever is there.
  std::vector<int64_t> completion_tokens;
  double tau = 0;                 // mean of the step lengths (0 without steps)
  // Read back from the results journal (scored by an earlier run of the job): reported again,
  // but not counted again in metrics.
  bool resumed = false;
};

// The response's completion token ids: the trajectory's tail past the prompt, else
// completion_tokens (a score received from the scorer service); empty when neither is known.
std::vector<int64_t> CompletionTokens(const PromptScore& s);

// xxh3-128 of token ids (little-endian int64), "xxh3-128:<hex>".
std::string TrajectoryDigest(const std::vector<int64_t>& tokens);

// τ of one list of step lengths (0 for none).
double MeanStepLength(const std::vector<int32_t>& lengths);

// A JSONL prompt file: one object per line, {"prompt": str} or {"input_ids": [int, ...]}; blank
// lines are skipped. At most max_prompts (0: all). INVALID_ARGUMENT names the file and line.
absl::StatusOr<std::vector<InputSequence>> ReadPromptDataset(const std::string& path,
                                                             int64_t max_prompts,
                                                             std::string* template_record);
absl::StatusOr<std::vector<InputSequence>> ReadPromptDataset(const std::string& path,
                                                             int64_t max_prompts);

// The job's prompts as token ids: the inline prompts or the dataset (read one prompt past the
// limit at most, so a huge file is refused without being held), text tokenized by `tokenizer`
// (the target's own tokenizer, in batches of 64), every id checked against the vocabulary.
// With `template_record`: the record the prompts were prepared under (the dataset's lines', else
// the spec's; INVALID_ARGUMENT when the two, or two lines, disagree).
absl::StatusOr<std::vector<std::vector<int64_t>>> ResolvePrompts(
    const ScoreSpec& spec, const ScoreLimits& limits, ExtractorEndpoint* tokenizer,
    const ExtractionContract& contract, std::string* template_record = nullptr);

}  // namespace specwire
