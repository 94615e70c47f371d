// The checks that keep a drafter from being scored against the wrong target (the extraction
// contract, proto/specwire/v1/extractor.proto): the drafter against the target, and every
// extractor of a job against the first.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/contract.h"
#include "services/scorer/scorer_backend.h"

namespace specwire {

// The drafter against the target the extractor serves: num_target_layers, hidden size (fc
// in_features / len(target_layer_ids)), vocab_size, every target_layer_id inside the target,
// mask_token_id inside the vocabulary. FAILED_PRECONDITION naming every mismatching field with
// both values, e.g.
//   "num_target_layers: drafter expects 64, extractor serves 36".
absl::Status CheckDrafterContract(const DrafterSpec& drafter, const ExtractionContract& target);

// Extractors serving one job must serve the same target. FAILED_PRECONDITION naming the field
// and both addresses' values.
absl::Status CheckSameTarget(const std::string& address_a, const ExtractionContract& a,
                             const std::string& address_b, const ExtractionContract& b);

}  // namespace specwire
