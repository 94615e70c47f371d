// The checks that keep a drafter from being scored against the wrong target (the extraction
// contract, proto/specwire/v1/extractor.proto): every extractor of a job against the first (the
// drafter against the target is drafters/drafter_spec.h's CheckDrafterContract).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "common/contract.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

// Extractors serving one job must serve the same target. FAILED_PRECONDITION naming the field
// and both addresses' values.
absl::Status CheckSameTarget(const std::string& address_a, const ExtractionContract& a,
                             const std::string& address_b, const ExtractionContract& b);

}  // namespace specwire
