// The request flags' prompts group (common/request_flags.h).
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "common/request_flags.h"
#include "common/status.h"

ABSL_FLAG(std::string, text, "", "One text prompt (tokenized by the server).");
ABSL_FLAG(std::string, prompts_file, "",
          "JSON file holding a list of prompts, each a text (tokenized by the server) or a list "
          "of token ids.");

namespace specwire {

int PromptSourcesGiven() {
  return !absl::GetFlag(FLAGS_text).empty() + !absl::GetFlag(FLAGS_prompts_file).empty();
}

std::string PromptsFilePath() { return absl::GetFlag(FLAGS_prompts_file); }

absl::StatusOr<std::vector<InputSequence>> TextPromptsFromFlags() {
  std::vector<InputSequence> prompts;
  if (const std::string file = absl::GetFlag(FLAGS_prompts_file); !file.empty()) {
    SW_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(file));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError("--prompts_file: expected a JSON list of prompts");
    }
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string what = absl::StrCat("--prompts_file: prompts[", i, "]");
      if (j[i].is_string()) {
        prompts.push_back(InputSequence::Text(j[i].get<std::string>()));
        continue;
      }
      if (!j[i].is_array()) {
        return absl::InvalidArgumentError(what + ": neither a text nor a list of token ids");
      }
      SW_ASSIGN_OR_RETURN(std::vector<int64_t> ids, TokenIdsFromJson(j[i], what));
      if (ids.empty()) return absl::InvalidArgumentError(what + ": empty");
      prompts.push_back(InputSequence::Tokens(std::move(ids)));
    }
  }
  if (const std::string text = absl::GetFlag(FLAGS_text); !text.empty()) {
    prompts.push_back(InputSequence::Text(text));
  }
  return prompts;
}

}  // namespace specwire
