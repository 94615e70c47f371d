#include "services/scorer/contract_checks.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

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
  if (d.method == "dflash" && (d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size)) {
    problems.push_back(absl::StrCat("mask_token_id: drafter uses ", d.mask_token_id,
                                    ", extractor's vocabulary is [0, ", t.vocab_size, ")"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("drafter ", d.path, " does not fit the extractor's target (", t.architecture,
                   ", ", t.weights_digest, "): ", absl::StrJoin(problems, "; ")));
}

absl::Status CheckSameTarget(const std::string& address_a, const ExtractionContract& a,
                             const std::string& address_b, const ExtractionContract& b) {
  auto differ = [&](const char* field, const auto& va, const auto& vb) -> absl::Status {
    if (va == vb) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("extractors serve different targets: ", field,
                                                      ": ", address_a, " serves ", va, ", ",
                                                      address_b, " serves ", vb));
  };
  SW_RETURN_IF_ERROR(differ("weights_digest", a.weights_digest, b.weights_digest));
  SW_RETURN_IF_ERROR(differ("architecture", a.architecture, b.architecture));
  SW_RETURN_IF_ERROR(differ("num_layers", a.num_layers, b.num_layers));
  SW_RETURN_IF_ERROR(differ("hidden_size", a.hidden_size, b.hidden_size));
  SW_RETURN_IF_ERROR(differ("vocab_size", a.vocab_size, b.vocab_size));
  SW_RETURN_IF_ERROR(differ("tokenizer_digest", a.tokenizer_digest, b.tokenizer_digest));
  // Features of a bf16 and an fp32 target differ: one job would mix two sets of numbers.
  SW_RETURN_IF_ERROR(differ("compute_dtype", a.compute_dtype, b.compute_dtype));
  return absl::OkStatus();
}
}  // namespace specwire
