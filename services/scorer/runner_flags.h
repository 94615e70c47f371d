// The scoring runner's flags, shared by specwire-scorer and specwire-score (in-process and
// --watch_dir), defined once here: the drafter's backend (--dtype, --device, --threads), where
// the target's head comes from (--target_checkpoint, --cache_dir), how trajectories are fetched
// (--wire_dtype, --prefetch, --generates_per_extractor, --extractor_attempts) and where completed prompts are kept
// (--results_dir).
//
// The limits a scorer SERVICE puts on jobs (ScoreLimits: --max_prompts_per_job,
// --max_new_tokens_limit, ...) are not here: they are specwire-scorer's own flags, spelled so
// they never read like specwire-score's --max_prompts / --max_new_tokens (what ONE job asks
// for). The runner made here has ScoreLimits' defaults.
#pragma once

#include "absl/status/statusor.h"
#include "services/scorer/job/score_job.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

// --dtype, --device, --threads.
TorchScorerOptions DrafterOptionsFromFlags();

// head (--target_checkpoint; --cache_dir: its default $XDG_CACHE_HOME/specwire or
// ~/.cache/specwire, "none" for no cache), fetch (--wire_dtype, "auto" resolved against
// --dtype; --prefetch; --generates_per_extractor; --extractor_attempts), journal.results_dir (--results_dir). limits keep
// their defaults, log is unset. INVALID_ARGUMENT for a bad --wire_dtype.
absl::StatusOr<ScoreRunnerOptions> RunnerOptionsFromFlags();

}  // namespace specwire
