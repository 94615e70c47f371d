#include "services/scorer/drafters/draft_weights.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/models/torch_util.h"

namespace specwire {

absl::Status LoadDraftWeights(const Checkpoint& checkpoint, const std::string& dir,
                              const std::string& family, const WeightWalk& for_each,
                              at::ScalarType dtype, std::set<std::string>& consumed,
                              const ShapeErrorMessage& shape_error) {
  std::vector<std::string> missing;
  absl::Status error;
  for_each([&](const WeightSlot& slot) {
    if (!error.ok()) return;
    const TensorView* view = checkpoint.Find(slot.name);
    if (view == nullptr) {
      missing.push_back(slot.name);
      return;
    }
    if (view->shape != slot.shape) {
      const std::string got = absl::StrCat("[", absl::StrJoin(view->shape, ", "), "]");
      const std::string want = absl::StrCat("[", absl::StrJoin(slot.shape, ", "), "]");
      std::string message = shape_error ? shape_error(slot, got, want) : "";
      if (message.empty()) {
        message = absl::StrCat("tensor \"", slot.name, "\" has shape ", got,
                               " but config.json implies ", want);
      }
      error = absl::InvalidArgumentError(message);
      return;
    }
    if (!IsFloat(view->dtype)) {
      error = absl::InvalidArgumentError(absl::StrCat("tensor \"", slot.name, "\" is ",
                                                      DTypeName(view->dtype),
                                                      "; weights must be BF16, F16 or F32"));
      return;
    }
    *slot.slot = WrapView(*view).to(dtype);
    consumed.insert(slot.name);
  });
  if (!error.ok()) return error;
  if (!missing.empty()) {
    const size_t shown = std::min<size_t>(missing.size(), 8);
    return absl::InvalidArgumentError(
        absl::StrCat(missing.size(), " ", family, " tensor(s) missing from ", dir, ": ",
                     absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
                     missing.size() > shown ? ", ..." : ""));
  }
  return absl::OkStatus();
}

}  // namespace specwire
