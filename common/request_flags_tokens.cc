// The request flags' tokens group (common/request_flags.h).
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/checkpoint.h"
#include "common/request_flags.h"
#include "common/status.h"

ABSL_FLAG(std::string, tokens, "",
          "Token-id sequences (prompts): ids comma-separated, ';' between sequences "
          "(\"1,2,3;4,5\").");
ABSL_FLAG(std::string, tokens_file, "",
          "JSON file holding a list of token-id lists, one per sequence (instead of --tokens).");

namespace specwire {
namespace {

absl::Status RefuseEmpty(const std::vector<std::vector<int64_t>>& seqs, absl::string_view flag) {
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": sequences[", i, "]: empty"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int TokenSourcesGiven() {
  return !absl::GetFlag(FLAGS_tokens).empty() + !absl::GetFlag(FLAGS_tokens_file).empty();
}

std::string TokensFilePath() { return absl::GetFlag(FLAGS_tokens_file); }

absl::StatusOr<std::vector<int64_t>> TokenIdsFromJson(const nlohmann::json& j,
                                                      absl::string_view what) {
  if (!j.is_array()) return absl::InvalidArgumentError(absl::StrCat(what, ": not a list of token ids"));
  std::vector<int64_t> ids;
  ids.reserve(j.size());
  for (const nlohmann::json& v : j) {
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": token ids must be integers"));
    }
    ids.push_back(v.get<int64_t>());
  }
  return ids;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> TokenSequencesFromFlags() {
  const std::string tokens = absl::GetFlag(FLAGS_tokens);
  const std::string file = absl::GetFlag(FLAGS_tokens_file);
  if (!tokens.empty() && !file.empty()) {
    return absl::InvalidArgumentError("give --tokens or --tokens_file, not both");
  }
  std::vector<std::vector<int64_t>> seqs;
  if (!tokens.empty()) {
    SW_ASSIGN_OR_RETURN(seqs, ParseIdSequences(tokens, "tokens"));
    SW_RETURN_IF_ERROR(RefuseEmpty(seqs, "--tokens"));
  } else if (!file.empty()) {
    SW_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError("--tokens_file: expected a JSON list of token-id lists");
    }
    for (size_t i = 0; i < j.size(); ++i) {
      SW_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                          TokenIdsFromJson(j[i], absl::StrCat("--tokens_file: sequences[", i, "]")));
      seqs.push_back(std::move(ids));
    }
    SW_RETURN_IF_ERROR(RefuseEmpty(seqs, "--tokens_file"));
  }
  return seqs;
}

}  // namespace specwire
