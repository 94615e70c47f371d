// The BPE model over the byte-level alphabet: vocabulary, ranked merges and the merge loop that
// turns one pre-token into ids (tokenizers/src/models/bpe/model.rs and word.rs), with a cache of
// recent words.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/byte_level.h"

namespace specwire::tokenizer_internal {

// Filled by the tokenizer.json loader, then BuildByteTables; read-only afterwards except for the
// word cache, which Tokenize guards with its own mutex.
class BytePairModel {
 public:
  // Words cached per pre-token; when full the cache is cleared and refilled by what is hot now.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;  // longer pre-tokens are rarely repeated

  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::string> vocab_r;  // id -> token; empty where no token
  std::vector<bool> has_id;
  bool ignore_merges = false;
  bool fuse_unk = false;
  bool byte_fallback = false;
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;

  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  absl::flat_hash_map<uint64_t, MergeInfo> merges;  // (left id << 32 | right id) -> merge

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Fills the per-byte initial ids, one table per position in the word: [is_last][is_first].
  // HF looks up prefix + char (not first) + suffix (last) for each character; with the byte-level
  // alphabet a character is one byte, so the four combinations cover every lookup.
  void BuildByteTables();

  // Appends the ids of one pre-token, given as raw bytes (before the byte-level mapping). Error:
  // INVALID_ARGUMENT when unk_token is needed but not in the vocabulary.
  absl::Status Tokenize(absl::string_view word, std::vector<int64_t>* ids) const;

 private:
  std::string SymbolString(uint8_t b, bool first, bool last, const ByteLevelAlphabet& a) const;

  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;  // 0 once merged into its left neighbour
  };

  // BPE::merge_word + Word::merge_all without dropout.
  absl::Status MergeWord(absl::string_view word, std::vector<int32_t>* out) const;

  int32_t byte_ids_[2][2][256];
  mutable std::mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;  // guarded by cache_mu_
};

}  // namespace specwire::tokenizer_internal
