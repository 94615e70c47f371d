// The flags of continuous evaluation (services/scorer/watch.h), shared by the scorer service
// (watch and push modes) and specwire-score --watch_dir (the same evaluation in-process), defined
// once here:
//
//   --eval_sets L=F,...         the eval sets every new checkpoint is scored on
//   --eval_max_prompts N        score the first N prompts of each set (0: all)
//   --eval_max_new_tokens N     greedy completion budget per prompt
//   --eval_ddtree B,...         DDTree node budgets
//   --eval_db F                 the SQLite results database (default: the program's)
//   --watch_dir D               watch D for checkpoints ("" : no watching)
//   --watch_run R               run label (default: D's name)
//   --watch_poll_seconds S      seconds between scans
//   --watch_stable_polls N      scans a checkpoint must stay unchanged before it is read
//   --watch_marker NAME         only checkpoints holding this file are read
//   --baseline_drafter D        a reference drafter scored once as run "baseline", step 0
//
// What only one program has stays in its main: the scorer's uploads (--upload_dir,
// --max_upload_bytes), specwire-score's --watch_scans.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "services/scorer/eval/watch.h"

namespace specwire {

struct ContinuousEvalOptions {
  // eval_sets, max_prompts, max_new_tokens, ddtree_budgets; log unset.
  EvaluatorOptions evaluator;
  std::string db_path;  // "" : the program's default (the caller fills it)
  // dir ("" : no watching), run (checked with ValidateRunName), stable_polls (>= 1), marker.
  WatchOptions watch;
  double poll_seconds = 5;  // at least 0.05
  std::string baseline_drafter;
};

// INVALID_ARGUMENT naming the flag for a bad eval set list, DDTree budget or run label.
absl::StatusOr<ContinuousEvalOptions> ContinuousEvalOptionsFromFlags();

}  // namespace specwire
