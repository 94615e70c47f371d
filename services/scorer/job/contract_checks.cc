#include "services/scorer/job/contract_checks.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace specwire {

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
