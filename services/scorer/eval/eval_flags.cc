#include "services/scorer/eval/eval_flags.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "services/scorer/eval/submit_service.h"

ABSL_FLAG(std::string, eval_sets, "",
          "Eval sets every new drafter checkpoint is scored on (watch and push modes): "
          "label=path.jsonl or path.jsonl (label: the file's stem), comma-separated.");
ABSL_FLAG(int64_t, eval_max_prompts, 0, "Eval sets: score the first N prompts (0: all).");
ABSL_FLAG(int64_t, eval_max_new_tokens, 256, "Eval sets: greedy completion budget per prompt.");
ABSL_FLAG(std::string, eval_ddtree, "8", "Eval sets: DDTree node budgets, comma-separated.");
ABSL_FLAG(std::string, eval_db, "",
          "SQLite results database of continuous evaluation, keyed (run, step, dataset) "
          "(default: specwire-scorer <cache_dir>/eval.sqlite, specwire-score "
          "<watch_dir>/specwire-eval.sqlite).");
ABSL_FLAG(std::string, watch_dir, "",
          "Score every drafter checkpoint (a subdirectory with config.json + *.safetensors, "
          "step from its name checkpoint-N / step_N / N or trainer_state.json) appearing here, "
          "once on each of --eval_sets.");
ABSL_FLAG(std::string, watch_run, "", "Run label of --watch_dir (default: its name).");
ABSL_FLAG(double, watch_poll_seconds, 5, "Seconds between scans of --watch_dir.");
ABSL_FLAG(int, watch_stable_polls, 1,
          "Scans a checkpoint's files must stay unchanged (names, sizes, mtimes) before it is "
          "read.");
ABSL_FLAG(std::string, watch_marker, "",
          "If set, only checkpoints holding a file of this name (written last by the trainer) "
          "are read.");
ABSL_FLAG(std::string, baseline_drafter, "",
          "A reference drafter scored once on the eval sets as run \"baseline\", step 0.");
ABSL_FLAG(int64_t, regression_window_tokens, 64,
          "Regression check (specwire_checkpoint_delta_tau): compare the latest checkpoint with "
          "the previous one on the steps in completion tokens [1, N] of identical trajectories.");

namespace specwire {

absl::StatusOr<ContinuousEvalOptions> ContinuousEvalOptionsFromFlags() {
  ContinuousEvalOptions o;
  SW_ASSIGN_OR_RETURN(o.evaluator.eval_sets, ParseEvalSets(absl::GetFlag(FLAGS_eval_sets)));
  o.evaluator.max_prompts = absl::GetFlag(FLAGS_eval_max_prompts);
  o.evaluator.max_new_tokens = absl::GetFlag(FLAGS_eval_max_new_tokens);
  o.evaluator.ddtree_budgets.clear();
  for (absl::string_view b :
       absl::StrSplit(absl::GetFlag(FLAGS_eval_ddtree), ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(b, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--eval_ddtree: \"", b, "\" is not an integer"));
    }
    o.evaluator.ddtree_budgets.push_back(v);
  }
  o.db_path = absl::GetFlag(FLAGS_eval_db);
  o.watch.dir = absl::GetFlag(FLAGS_watch_dir);
  o.watch.run = absl::GetFlag(FLAGS_watch_run);
  if (!o.watch.run.empty()) SW_RETURN_IF_ERROR(ValidateRunName(o.watch.run, "--watch_run"));
  o.watch.stable_polls = std::max(1, absl::GetFlag(FLAGS_watch_stable_polls));
  o.watch.marker = absl::GetFlag(FLAGS_watch_marker);
  o.poll_seconds = std::max(0.05, absl::GetFlag(FLAGS_watch_poll_seconds));
  o.baseline_drafter = absl::GetFlag(FLAGS_baseline_drafter);
  o.evaluator.regression.window_tokens = absl::GetFlag(FLAGS_regression_window_tokens);
  if (o.evaluator.regression.window_tokens < 1) {
    return absl::InvalidArgumentError("--regression_window_tokens: must be at least 1");
  }
  return o;
}

}  // namespace specwire
