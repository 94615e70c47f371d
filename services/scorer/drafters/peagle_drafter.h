// The P-EAGLE drafter (AWS, 2026: parallel drafting; vLLM's eagle3 proposer with
// parallel_drafting): an EAGLE-3 drafter (eagle3_drafter.h, whose loader reads it) that drafts a
// whole block in one forward. Both formats people train it in: speculators
// (`speculators_model_type: "peagle"`) and SpecForge (`architectures: ["PEagleDraftModel"]`, with
// `mask_token_id` added to config.json as vLLM requires).
//
// Oracles: speculators 0.9.0 `models/peagle/core.py` (PEagleDraftModel.forward) and SpecForge
// 0.2.0 `modeling/draft/peagle.py` + `algorithms/peagle/model.py` (OnlinePEagleModel.forward),
// whose training forward over one chain at the last context row is the inference forward: the
// block at `start` is the last context row (the anchor traj[start] with the target's states at
// start − 1: draft 1) and len − 2 future slots (embedding of mask_token_id, fc(mask_hidden)) at
// the next RoPE positions (drafts 2 .. len − 1), all in one forward. A draft position does not
// condition on the drafts before it, so the block's per-position marginals make a DDTree as
// DFlash's do.
#pragma once

#include "services/scorer/drafters/registry.h"

namespace specwire {

// The family row (registry.h).
const DrafterFamily& PEagleFamily();

}  // namespace specwire
