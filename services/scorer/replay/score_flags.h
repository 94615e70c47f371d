// The flags a scoring run reads in both specwire-score and specwire-replay, defined once so
// that each has one default and one help text in both: each prompt's completion budget
// (--max_new_tokens), the summary's bootstrap intervals (--bootstrap_resamples,
// --bootstrap_seed) and the adaptive verify-length cutoffs of families that predict their own
// acceptance (--dspark_cutoff, parsed by ParseSurvivalCutoffs).
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(int64_t, max_new_tokens);
ABSL_DECLARE_FLAG(int32_t, bootstrap_resamples);
ABSL_DECLARE_FLAG(uint64_t, bootstrap_seed);
ABSL_DECLARE_FLAG(std::string, dspark_cutoff);
