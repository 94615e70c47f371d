// Loading a drafter's weights from its checkpoint (both families): every tensor a module names
// (WeightVisitor) must be there, a float, with its shape; it is wrapped in the compute dtype.
#pragma once

#include <functional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "common/checkpoint.h"
#include "common/models/decoder.h"

namespace specwire {

// A module's walk over its weight slots.
using WeightWalk = std::function<void(const WeightVisitor&)>;
// The message for a misshapen tensor (got and want as "[a, b]"), "" for the default.
using ShapeErrorMessage =
    std::function<std::string(const WeightSlot&, const std::string& got, const std::string& want)>;

// Fills every slot `for_each` visits. `family` names the drafter in the missing-tensor error
// ("drafter", "EAGLE-3"); `shape_error` may give its own message for a misshapen tensor. The
// names loaded are added to `consumed`.
absl::Status LoadDraftWeights(const Checkpoint& checkpoint, const std::string& dir,
                              const std::string& family, const WeightWalk& for_each,
                              at::ScalarType dtype, std::set<std::string>& consumed,
                              const ShapeErrorMessage& shape_error = nullptr);

}  // namespace specwire
