#include "common/models/kernel_set.h"

#include "absl/strings/str_cat.h"

namespace specwire {

absl::StatusOr<std::optional<KernelSet>> ParseKernelSet(absl::string_view value,
                                                        absl::string_view flag) {
  if (value == "auto") return std::optional<KernelSet>();
  if (value == "reference") return KernelSet::kReference;
  if (value == "fast") return KernelSet::kFast;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, "=", value, ": not a kernel set (auto, reference, fast)"));
}

const char* KernelSetName(KernelSet set) {
  return set == KernelSet::kFast ? "fast" : "reference";
}

}  // namespace specwire
