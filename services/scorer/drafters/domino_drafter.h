// Domino (SpecForge's DominoDraftModel, dflash_config.projector_type "domino"): DFlash's backbone
// plus a GRU logit correction. Draft position k of a block (the anchor at 0) takes DFlash's
// logits lm_head(h_k) plus, past the first pure_draft_prefix_len positions,
//   embed_proj(cat[h_k, g_{k−1}])     embed_proj: Linear(H + G → E) → SiLU → Linear(E → V)
// where g_{k−1} is a GRU (one layer, no biases, hidden G) run over the target embeddings of the
// block's tokens 0 .. k − 1 (the anchor, then the drafts before k): a position conditions on the
// drafts before it. With shift_label, the block's slot k − 1 (the anchor's slot for k = 1)
// holds h_k, as SpecForge's spec_generate reads it; without, slot k. Oracle: SpecForge 0.2.0
// `modeling/draft/domino.py` (apply_logits_head, _sample_draft_tokens).
#pragma once

#include "services/scorer/drafters/registry.h"

namespace specwire {

// The family row (registry.h): "domino", format "specforge".
const DrafterFamily& DominoFamily();

}  // namespace specwire
