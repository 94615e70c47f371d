// Added tokens: leftmost-longest matching and the added vocabulary
// (tokenizers/src/tokenizer/added_vocabulary.rs).
#include "common/tokenizer/added_tokens.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "common/tokenizer/split_regex.h"
#include "common/tokenizer/utf8.h"

namespace specwire::tokenizer_internal {

void AddedTokenTrie::Add(absl::string_view s, int32_t id) {
  int32_t node = 0;
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    auto it = nodes_[node].next.find(b);
    if (it == nodes_[node].next.end()) {
      nodes_.emplace_back();
      it = nodes_[node].next.emplace(b, static_cast<int32_t>(nodes_.size() - 1)).first;
    }
    node = it->second;
  }
  nodes_[node].id = id;
  first_bytes_.set(static_cast<unsigned char>(s[0]));
}

bool AddedTokenTrie::FindNext(absl::string_view text, size_t from, size_t* start, size_t* end,
                              int32_t* id) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_bytes_.test(static_cast<unsigned char>(text[i]))) continue;
    int32_t node = 0;
    int32_t best_id = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto it = nodes_[node].next.find(static_cast<unsigned char>(text[j]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].id >= 0) best_id = nodes_[node].id, best_end = j + 1;
    }
    if (best_id >= 0) {
      *start = i, *end = best_end, *id = best_id;
      return true;
    }
  }
  return false;
}

absl::Status AddedVocabulary::AddTokens(
    std::vector<AddedToken> tokens, const absl::flat_hash_map<std::string, int32_t>& model_vocab,
    bool nfc) {
  // HF's next id: the model vocabulary's size (its entry count), then one per new token.
  auto next_id = static_cast<int32_t>(model_vocab.size());
  absl::flat_hash_map<int32_t, AddedToken> by_id;
  for (AddedToken& token : tokens) {
    if (token.content.empty()) continue;
    // The id: an existing one for a known content, else the next free one after the model
    // vocabulary and the added tokens so far. The file's "id" is ignored, as by HF.
    int32_t id;
    if (const auto it = added_by_content_.find(token.content); it != added_by_content_.end()) {
      id = it->second;
    } else if (const auto vit = model_vocab.find(token.content); vit != model_vocab.end()) {
      id = vit->second;
    } else {
      id = next_id++;
    }
    token.id = id;
    added_by_content_[token.content] = id;
    if (token.special) special_contents_.insert(token.content);
    by_id[id] = std::move(token);
  }
  for (auto& [id, token] : by_id) added_.push_back(token);
  std::sort(added_.begin(), added_.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& token = added_[i];
    added_by_id_[static_cast<int32_t>(token.id)] = i;
    std::string pattern = token.content;
    if (token.normalized && nfc) {
      SW_ASSIGN_OR_RETURN(pattern, Nfc(token.content));
      if (pattern != token.content) normalized_content_[static_cast<int32_t>(token.id)] = pattern;
    }
    (token.normalized ? normalized_trie_ : raw_trie_).Add(pattern, static_cast<int32_t>(token.id));
  }
  return absl::OkStatus();
}

void AddedVocabulary::SplitOnRawTokens(const std::string& text, std::vector<Segment>* out) const {
  SplitOnAddedTokens(text, raw_trie_, out);
}

void AddedVocabulary::SplitOnNormalizedTokens(const std::string& text,
                                              std::vector<Segment>* out) const {
  SplitOnAddedTokens(text, normalized_trie_, out);
}

void AddedVocabulary::SplitOnAddedTokens(const std::string& text, const AddedTokenTrie& trie,
                                         std::vector<Segment>* out) const {
  if (trie.empty()) {
    out->push_back({text, -1});
    return;
  }
  size_t start_offset = 0;  // end of the previous emitted piece
  size_t search = 0;        // the trie scan resumes after the previous match, not after strips
  size_t match_start = 0, match_end = 0;
  int32_t id = -1;
  while (trie.FindNext(text, search, &match_start, &match_end, &id)) {
    search = match_end;
    const AddedToken& token = added_[added_by_id_.at(id)];
    size_t start = match_start, stop = match_end;
    if (token.single_word) {  // `\w$` before and `^\w` after must both fail
      size_t before = start > 0 ? PrevCodePointStart(text, start) : 0;
      size_t after = stop;
      const bool start_space = start == 0 || !IsRustWordChar(NextCodePoint(text, &before));
      const bool stop_space = stop == text.size() || !IsRustWordChar(NextCodePoint(text, &after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t p = PrevCodePointStart(text, new_start);
        const size_t char_start = p;
        if (!IsWhiteSpace(NextCodePoint(text, &p))) break;
        new_start = char_start;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      size_t p = stop;
      while (p < text.size()) {
        size_t next = p;
        if (!IsWhiteSpace(NextCodePoint(text, &next))) break;
        p = next;
      }
      stop = p;
    }
    if (start_offset < start) out->push_back({text.substr(start_offset, start - start_offset), -1});
    out->push_back({std::string(), id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({text.substr(start_offset), -1});
}

std::optional<int32_t> AddedVocabulary::IdOf(const std::string& content) const {
  if (const auto it = added_by_content_.find(content); it != added_by_content_.end()) {
    return it->second;
  }
  return std::nullopt;
}

std::optional<std::string> AddedVocabulary::ContentOf(int32_t id) const {
  const auto it = added_by_id_.find(id);
  if (it == added_by_id_.end()) return std::nullopt;
  const auto norm = normalized_content_.find(id);
  return norm != normalized_content_.end() ? norm->second : added_[it->second].content;
}

}  // namespace specwire::tokenizer_internal
