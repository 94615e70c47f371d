// A drafter's draft vocabulary (EAGLE-3; DFlash in speculators' format): Vd of the target's V
// tokens, with the checkpoint's maps d2t [Vd] (I64 offsets: draft id i is target id i + d2t[i])
// and t2d [V] (BOOL: the target ids kept), as speculators and SpecForge write them.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint.h"

namespace specwire {

// The target id of every draft id, checked: d2t and t2d come together; they are required when
// Vd < V (without them the draft vocabulary is the whole one); every target id lies in [0, V),
// ascending, kept by t2d, and t2d keeps exactly Vd ids. INVALID_ARGUMENT names the tensor.
// The names read are added to `consumed`.
absl::StatusOr<std::vector<int64_t>> ReadDraftVocabulary(const Checkpoint& checkpoint,
                                                         const std::string& dir, int64_t Vd,
                                                         int64_t V,
                                                         std::set<std::string>& consumed);

}  // namespace specwire
