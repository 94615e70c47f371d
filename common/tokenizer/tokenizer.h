// Hugging Face tokenizer.json for byte-level BPE, giving the ids of the `tokenizers` library.
//
// Supported is what the Qwen2 / Qwen3 / Qwen3.5 and Llama-3 files use; anything else is refused at
// load with INVALID_ARGUMENT naming the JSON path and the type:
//   model           BPE over the byte-level alphabet (merges as "a b" strings or [a, b] pairs,
//                   ignore_merges, unk_token / fuse_unk / byte_fallback, subword prefix/suffix;
//                   dropout must be null or 0: dropout makes encoding random)
//   normalizer      null, NFC, or a Sequence of those
//   pre_tokenizer   ByteLevel (GPT-2 regex when use_regex), or a Sequence of Split steps
//                   (Regex or String pattern, any behavior, invert) ending in one ByteLevel
//   post_processor  null, ByteLevel, TemplateProcessing (its "single" template), Sequence of those
//   decoder         null or ByteLevel
//   added_tokens    special and non-special, with content / lstrip / rstrip / single_word /
//                   normalized, ids assigned the way `tokenizers` assigns them (see FromJson)
//   truncation, padding  must be null (they would change the ids of Encode)
//
// The pipeline of Encode is HF's: added tokens are found in the raw text (leftmost-longest), the
// text between them is normalized, normalized added tokens are found in that, the rest is split by
// the pre-tokenizer, and each piece goes through BPE. Split patterns are compiled with PCRE2 after
// translating the escapes whose meaning differs from Oniguruma's (the regex engine of
// `tokenizers`): \s, \S, \w, \W and \h. NFC is utf8proc's, adjusted to the older Unicode data
// of `tokenizers`' normalizer (marks it does not know act as starters). Unicode versions still
// differ in one place: PCRE2 10.42 knows Unicode 14, the Oniguruma inside `tokenizers` a newer
// one, so letters and digits first assigned after Unicode 14 may split differently; every code
// point assigned in Unicode 14 splits alike (tests/parity/test_tokenizer_parity.py).
//
// Thread safety: a Tokenizer is immutable after FromJson except for its BPE cache, which is
// guarded by a mutex; Encode and Decode may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire {

// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  std::string content;
  int64_t id = 0;            // as `tokenizers` assigns it (may differ from the file's "id")
  bool special = false;      // dropped by Decode(skip_special_tokens=true)
  bool single_word = false;  // matches only when not glued to a word character on either side
  bool lstrip = false;       // the match swallows the whitespace on its left
  bool rstrip = false;       // ... and on its right
  bool normalized = false;   // matched in the normalized text instead of the raw text
};

class Tokenizer {
 public:
  // Parses a tokenizer.json document. Errors: INVALID_ARGUMENT for malformed JSON, unsupported
  // components (the message names the JSON path, e.g. /model/type, and the type found) and merges
  // naming tokens that are not in the vocabulary.
  //
  // Added-token ids follow `tokenizers`, which ignores the "id" written in the file: a token whose
  // content is in the model vocabulary gets that id, every other one the next id after the model
  // vocabulary (its size) and after the previous added token. For files written by `tokenizers`
  // (every Qwen and Llama file) this is the id in the file.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(const std::string& json_text);
  // Reads and parses a file. Errors: NOT_FOUND if it cannot be opened, else as FromJson.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`, as `tokenizers.Tokenizer.encode(text, add_special_tokens=...).ids`.
  // add_special_tokens applies the post-processor's template (e.g. Llama-3's BOS). Errors:
  // INVALID_ARGUMENT when `text` is not valid UTF-8 (`tokenizers` only takes str, which cannot
  // hold invalid UTF-8 either); RESOURCE_EXHAUSTED if the regex engine runs out of its limits.
  absl::StatusOr<std::vector<int64_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = false) const;

  // The pieces the pre-tokenizer alone makes of `text` (no added tokens, no normalizer), written
  // in the byte-level alphabet, as `tokenizers`' `pre_tokenizer.pre_tokenize_str(text)` gives
  // them: what the parity tests compare regex semantics with. Errors as Encode.
  absl::StatusOr<std::vector<std::string>> PreTokenize(absl::string_view text) const;

  // Text of `ids`, as `tokenizers.Tokenizer.decode(ids, skip_special_tokens=...)`: byte sequences
  // that are not valid UTF-8 become U+FFFD. Error: INVALID_ARGUMENT naming the index of an id that
  // has no token (`tokenizers` silently drops such ids; here they are a caller's bug).
  absl::StatusOr<std::string> Decode(const std::vector<int64_t>& ids,
                                     bool skip_special_tokens = false) const;

  // One past the largest id (model vocabulary and added tokens): the number of ids when they are
  // dense, as in every HF file. Model embeddings may be padded beyond it.
  int64_t vocab_size() const;
  // Added tokens first, then the model vocabulary, like `tokenizers`.
  std::optional<int64_t> token_to_id(absl::string_view token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  // All added tokens, in id order.
  const std::vector<AddedToken>& added_tokens() const;
  // Contents of the special added tokens, in id order.
  std::vector<std::string> special_tokens() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;  // owns the vocabulary, the compiled regexes and the BPE cache
};

}  // namespace specwire
