// Split regexes: tokenizer.json patterns compiled with PCRE2 but matched with the semantics of
// Oniguruma (Ruby syntax), the engine `tokenizers` compiles them with
// (tokenizers/src/utils/onig.rs). Match state is per thread, so one compiled regex serves every
// thread at once.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

namespace specwire::tokenizer_internal {

class SplitRegex {
 public:
  // `pattern` is a tokenizer.json Split pattern: a regex ({"Regex": ...}) or, when `literal`, a
  // plain string ({"String": ...}). `path` names the JSON field in errors (INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(absl::string_view pattern,
                                                             bool literal, const std::string& path);

  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Match ranges [start, end) in `text` (valid UTF-8), in the order and with the empty-match
  // rule of the Rust onig crate's find_iter: after an empty match that ends where the previous
  // match ended, the search restarts one character later. Error: RESOURCE_EXHAUSTED when PCRE2
  // runs out of its limits.
  absl::Status FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  explicit SplitRegex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;  // owned
};

// Rust regex `\w` (Unicode): what added_vocabulary.rs checks around single_word tokens.
bool IsRustWordChar(char32_t cp);

}  // namespace specwire::tokenizer_internal
