// The BPE model (tokenizers/src/models/bpe/model.rs and word.rs).
#include "common/tokenizer/bpe_model.h"

#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace specwire::tokenizer_internal {

void BytePairModel::BuildByteTables() {
  const ByteLevelAlphabet& alphabet = Alphabet();
  for (int last = 0; last < 2; ++last) {
    for (int first = 0; first < 2; ++first) {
      for (int b = 0; b < 256; ++b) {
        const auto it = vocab.find(SymbolString(static_cast<uint8_t>(b), first, last, alphabet));
        byte_ids_[last][first][b] = it == vocab.end() ? -1 : it->second;
      }
    }
  }
}

absl::Status BytePairModel::Tokenize(absl::string_view word, std::vector<int64_t>* ids) const {
  if (word.empty()) return absl::OkStatus();
  if (ignore_merges) {
    const auto it = vocab.find(Alphabet().Encode(word));
    if (it != vocab.end()) {
      ids->push_back(it->second);
      return absl::OkStatus();
    }
  }
  const bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> merged;
  SW_RETURN_IF_ERROR(MergeWord(word, &merged));
  ids->insert(ids->end(), merged.begin(), merged.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(merged));
  }
  return absl::OkStatus();
}

std::string BytePairModel::SymbolString(uint8_t b, bool first, bool last,
                                        const ByteLevelAlphabet& a) const {
  std::string s = first ? "" : continuing_subword_prefix;
  s += a.utf8_of_byte[b];
  if (last) s += end_of_word_suffix;
  return s;
}

absl::Status BytePairModel::MergeWord(absl::string_view word, std::vector<int32_t>* out) const {
  const ByteLevelAlphabet& alphabet = Alphabet();
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&symbols](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back({id, n - 1, -1, len});
  };
  int32_t unk_id = -1, unk_len = 0;  // a pending unk symbol, when unk_id >= 0
  for (size_t i = 0; i < word.size(); ++i) {
    const bool first = i == 0, last = i + 1 == word.size();
    const auto b = static_cast<uint8_t>(word[i]);
    const int32_t id = byte_ids_[last][first][b];
    if (id >= 0) {
      if (unk_id >= 0) add(unk_id, unk_len), unk_id = -1;
      add(id, 1);
      continue;
    }
    if (byte_fallback) {  // <0xXX> for each UTF-8 byte of the (prefixed) symbol string
      const std::string s = SymbolString(b, first, last, alphabet);
      std::vector<int32_t> fallback;
      for (char c : s) {
        const auto it = vocab.find(absl::StrFormat("<0x%02X>", static_cast<unsigned char>(c)));
        if (it == vocab.end()) break;
        fallback.push_back(it->second);
      }
      if (fallback.size() == s.size()) {
        for (int32_t f : fallback) add(f, 1);
        continue;  // like HF, a pending unk stays pending
      }
    }
    if (unk_token) {
      const auto it = vocab.find(*unk_token);
      if (it == vocab.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("unk_token \"", *unk_token, "\" is not in the vocabulary"));
      }
      if (unk_id >= 0 && fuse_unk) {
        unk_len += 1;
      } else {
        if (unk_id >= 0) add(unk_id, unk_len);
        unk_id = it->second, unk_len = 1;
      }
    }
    // Neither in the vocabulary nor unk_token: HF drops the character.
  }
  if (unk_id >= 0) add(unk_id, unk_len);

  // Lowest rank first, then leftmost (word.rs `Ord for Merge`).
  struct Merge {
    int32_t pos, rank, new_id;
    bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    const auto it = merges.find(PairKey(symbols[i].id, symbols[i + 1].id));
    if (it != merges.end()) {
      queue.push({static_cast<int32_t>(i), it->second.rank, it->second.new_id});
    }
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& current = symbols[top.pos];
    if (current.len == 0 || current.next == -1) continue;
    const Symbol right = symbols[current.next];
    // An entry whose pair changed since it was queued is stale; HF compares only the new id.
    const auto target = merges.find(PairKey(current.id, right.id));
    if (target == merges.end() || target->second.new_id != top.new_id) continue;
    symbols[current.next].len = 0;
    current.id = top.new_id;
    current.len += right.len;
    current.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (current.prev >= 0) {
      const auto it = merges.find(PairKey(symbols[current.prev].id, current.id));
      if (it != merges.end()) queue.push({current.prev, it->second.rank, it->second.new_id});
    }
    if (current.next >= 0) {
      const auto it = merges.find(PairKey(current.id, symbols[current.next].id));
      if (it != merges.end()) queue.push({top.pos, it->second.rank, it->second.new_id});
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len != 0) out->push_back(s.id);
  }
  return absl::OkStatus();
}

}  // namespace specwire::tokenizer_internal
