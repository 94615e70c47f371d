// The pre-tokenizer: Split steps, then one ByteLevel step, cutting normalized text into the pieces
// BPE encodes one by one (tokenizers/src/pre_tokenizers/split.rs and byte_level.rs, with
// NormalizedString::split of tokenizers/src/tokenizer/normalizer.rs).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/split_regex.h"

namespace specwire::tokenizer_internal {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::unique_ptr<SplitRegex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

struct PreTokenizer {
  std::vector<SplitStep> splits;  // steps before the final ByteLevel
  bool byte_level_prefix_space = false;
  std::unique_ptr<SplitRegex> byte_level_regex;  // GPT-2 regex when ByteLevel use_regex

  // Appends the pieces of `text`, as raw bytes (before the byte-level mapping). Error:
  // RESOURCE_EXHAUSTED when the regex engine runs out of its limits.
  absl::Status PreTokenize(std::string text, std::vector<std::string>* pieces) const;
};

}  // namespace specwire::tokenizer_internal
