// Added tokens: the vocabulary of tokenizer.json's "added_tokens" and the leftmost-longest
// matcher that cuts text at them (tokenizers/src/tokenizer/added_vocabulary.rs).
#pragma once

#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"

namespace specwire::tokenizer_internal {

// Leftmost-longest matching of a set of strings, like daachorse's MatchKind::LeftmostLongest:
// the match that starts first, and of those the longest; the scan resumes after it.
class AddedTokenTrie {
 public:
  AddedTokenTrie() : nodes_(1) {}
  bool empty() const { return nodes_.size() == 1; }

  void Add(absl::string_view s, int32_t id);

  // The next match at or after `from`; false when there is none.
  bool FindNext(absl::string_view text, size_t from, size_t* start, size_t* end, int32_t* id) const;

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int32_t> next;
    int32_t id = -1;
  };
  std::vector<Node> nodes_;
  std::bitset<256> first_bytes_;
};

// A piece of the text on its way through the pipeline: either matched to an added token (id >= 0)
// or text still to be normalized / pre-tokenized / encoded.
struct Segment {
  std::string text;
  int32_t token_id = -1;
};

// The added tokens of one tokenizer, immutable once AddTokens has run.
class AddedVocabulary {
 public:
  // AddedVocabulary::add_tokens as called by the tokenizer.json deserializer (serialization.rs):
  // `tokens` in file order, their "id" ignored as by HF. A content seen before keeps its id, one
  // in `model_vocab` takes that id, every other one the next id after the model vocabulary (its
  // entry count) and the added tokens so far. `nfc`: the normalizer is NFC, so normalized tokens
  // are matched in their NFC form. Error: as Nfc.
  absl::Status AddTokens(std::vector<AddedToken> tokens,
                         const absl::flat_hash_map<std::string, int32_t>& model_vocab, bool nfc);

  // AddedVocabulary::find_matches + split_with_indices over one text segment: `text` cut at the
  // tokens matched in the raw text (normalized == false) ...
  void SplitOnRawTokens(const std::string& text, std::vector<Segment>* out) const;
  // ... and at those matched in the normalized text (normalized == true).
  void SplitOnNormalizedTokens(const std::string& text, std::vector<Segment>* out) const;

  const std::vector<AddedToken>& tokens() const { return added_; }  // id order
  std::optional<int32_t> IdOf(const std::string& content) const;
  // The content of the added token `id`, in the form NFC gives it where that differs (what HF
  // decodes); nullopt when `id` is not an added token.
  std::optional<std::string> ContentOf(int32_t id) const;
  // Whether `token` is the content of a special added token.
  bool IsSpecial(const std::string& token) const { return special_contents_.contains(token); }

 private:
  void SplitOnAddedTokens(const std::string& text, const AddedTokenTrie& trie,
                          std::vector<Segment>* out) const;

  std::vector<AddedToken> added_;  // id order
  absl::flat_hash_map<std::string, int32_t> added_by_content_;
  absl::flat_hash_map<int32_t, size_t> added_by_id_;              // -> index into `added_`
  absl::flat_hash_map<int32_t, std::string> normalized_content_;  // where NFC changes it
  absl::flat_hash_set<std::string> special_contents_;
  AddedTokenTrie raw_trie_;         // normalized == false: matched in the raw text
  AddedTokenTrie normalized_trie_;  // normalized == true: matched in the normalized text
};

}  // namespace specwire::tokenizer_internal
