#include "services/scorer/drafters/drafter_spec.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace specwire {

absl::Status CheckDrafterContract(const DrafterSpec& d, const ExtractionContract& t) {
  std::vector<std::string> problems;
  if (d.num_target_layers > 0 && d.num_target_layers != t.num_layers) {
    problems.push_back(absl::StrCat("num_target_layers: drafter expects ", d.num_target_layers,
                                    ", extractor serves ", t.num_layers));
  }
  if (d.target_hidden_size != t.hidden_size) {
    problems.push_back(absl::StrCat("hidden_size: drafter expects ", d.target_hidden_size,
                                    " (fc in_features ", d.fc_in_features, " / ",
                                    d.target_layer_ids.size(), " target layers), extractor serves ",
                                    t.hidden_size));
  }
  if (d.vocab_size != t.vocab_size) {
    problems.push_back(absl::StrCat("vocab_size: drafter expects ", d.vocab_size,
                                    ", extractor serves ", t.vocab_size));
  }
  for (size_t i = 0; i < d.target_layer_ids.size(); ++i) {
    const int64_t id = d.target_layer_ids[i];
    if (id < 0 || id >= t.num_layers) {
      problems.push_back(absl::StrCat("target_layer_ids[", i, "]: drafter uses layer ", id,
                                      ", extractor serves layers [0, ", t.num_layers, ")"));
    }
  }
  if (d.uses_mask_token && (d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size)) {
    problems.push_back(absl::StrCat("mask_token_id: drafter uses ", d.mask_token_id,
                                    ", extractor's vocabulary is [0, ", t.vocab_size, ")"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("drafter ", d.path, " does not fit the extractor's target (", t.architecture,
                   ", ", t.weights_digest, "): ", absl::StrJoin(problems, "; ")));
}

}  // namespace specwire
