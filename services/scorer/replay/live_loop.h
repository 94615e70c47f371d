// The drafter's half of the real speculative loop (ScorerBackend::Live): draft a block on the
// context the target committed, send it to a live target session, commit what the target
// accepted, append the committed rows' target states to the drafter's context, and go on from
// the token the target gave after them.
//
// Step i starts at position start_i (the pending token's) and drafts the block
// [pending, MASK × (len − 1)] with len = min(B, max_length − start_i), as the replay does
// (replay.h); it commits a_i + 1 tokens. Once the completion ends (the first stop token, or
// max_new_tokens) each step's length is cut at the end as the replay cuts it, so under greedy
// verification the step lengths equal the replay's on the same trajectory. Drafts sampled from
// q draw UniformAt(seed, 2 · start + 2, i): streams the target session (0 and 2L + 1) never uses.
// Where the family's positions condition on earlier drafts (BlockDrafter::conditions_on_drafts),
// draft i is drawn from its q given the drafts drawn before it, as the serving engines sample a
// chain (and DFlash2's selector walk).
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "absl/status/statusor.h"
#include "services/scorer/replay/replay.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

// `to_features`: target states (target_layer_ids order) → features [rows, n × H] in the
// drafter's dtype and device. Torch errors propagate as c10::Error; the target's as the status.
absl::StatusOr<LiveResult> RunLiveLoop(
    BlockDrafter* drafter, const LiveStart& start, LiveTarget& target, const LiveSettings& settings,
    const std::function<at::Tensor(const std::vector<FeatureState>&)>& to_features);

}  // namespace specwire
