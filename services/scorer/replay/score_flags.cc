#include "services/scorer/replay/score_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(int64_t, max_new_tokens, 256,
          "Greedy completion budget per prompt: the target's completion of each prompt stops "
          "after this many tokens (dflash's max_new_tokens).");
ABSL_FLAG(int32_t, bootstrap_resamples, 1000,
          "Bootstrap resamples of the 95% intervals over prompts (0: no intervals).");
ABSL_FLAG(uint64_t, bootstrap_seed, 0,
          "Seed of the bootstrap resamples (same seed, same intervals).");
ABSL_FLAG(std::string, dspark_cutoff, "0.3,0.5,0.7",
          "For families that predict their own acceptance (DSpark's confidence head), reported "
          "beside tau with the calibration table: the predicted-survival cutoffs of an adaptive "
          "verify length (comma-separated in [0, 1]; \"none\" for none), each with its tau.");
