// The pre-tokenizer's Split and ByteLevel steps (tokenizers/src/pre_tokenizers/split.rs,
// byte_level.rs; tokenizers/src/tokenizer/normalizer.rs NormalizedString::split).
#include "common/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include "common/status.h"

namespace specwire::tokenizer_internal {
namespace {

// Splits `piece` like NormalizedString::split(pattern, behavior); empty results are dropped, as
// PreTokenizedString::split does.
absl::Status ApplySplit(const SplitStep& step, const std::string& piece,
                        std::vector<std::string>* out) {
  // (offsets, is_match), covering the piece: Pattern::find_matches for &SysRegex (pattern.rs).
  struct Range {
    size_t begin, end;
    bool flag;  // is_match, then (after the behavior) "remove"
  };
  std::vector<std::pair<size_t, size_t>> found;
  SW_RETURN_IF_ERROR(step.regex->FindAll(piece, &found));
  std::vector<Range> matches;
  size_t prev = 0;
  for (const auto& [start, end] : found) {
    if (prev != start) matches.push_back({prev, start, false});
    matches.push_back({start, end, true});
    prev = end;
  }
  if (prev != piece.size()) matches.push_back({prev, piece.size(), false});
  if (step.invert) {
    for (Range& r : matches) r.flag = !r.flag;
  }

  std::vector<Range> splits;
  bool previous_match = false;
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (Range r : matches) splits.push_back({r.begin, r.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (Range r : matches) splits.push_back(r);
      break;
    case SplitBehavior::kContiguous:
      for (Range r : matches) {
        if (r.flag == previous_match && !splits.empty()) {
          splits.back().end = r.end;
        } else {
          splits.push_back({r.begin, r.end, false});
        }
        previous_match = r.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (Range r : matches) {
        if (r.flag && !previous_match && !splits.empty()) {
          splits.back().end = r.end;
        } else {
          splits.push_back({r.begin, r.end, false});
        }
        previous_match = r.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  for (const Range& r : splits) {
    if (!r.flag && r.end > r.begin) out->push_back(piece.substr(r.begin, r.end - r.begin));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PreTokenizer::PreTokenize(std::string text, std::vector<std::string>* pieces) const {
  std::vector<std::string> current, next;
  current.push_back(std::move(text));
  for (const SplitStep& step : splits) {
    next.clear();
    for (const std::string& piece : current) SW_RETURN_IF_ERROR(ApplySplit(step, piece, &next));
    std::swap(current, next);
  }
  // ByteLevel: the prefix space goes on every piece that does not start with one.
  if (byte_level_prefix_space) {
    for (std::string& piece : current) {
      if (!piece.starts_with(' ')) piece.insert(piece.begin(), ' ');
    }
  }
  if (byte_level_regex != nullptr) {
    next.clear();
    for (const std::string& piece : current) {
      std::vector<std::pair<size_t, size_t>> found;
      SW_RETURN_IF_ERROR(byte_level_regex->FindAll(piece, &found));
      size_t prev = 0;
      for (const auto& [start, end] : found) {  // Isolated: matches and gaps, empties dropped
        if (prev < start) next.push_back(piece.substr(prev, start - prev));
        if (start < end) next.push_back(piece.substr(start, end - start));
        prev = end;
      }
      if (prev < piece.size()) next.push_back(piece.substr(prev));
    }
    std::swap(current, next);
  }
  for (std::string& piece : current) pieces->push_back(std::move(piece));
  return absl::OkStatus();
}

}  // namespace specwire::tokenizer_internal
