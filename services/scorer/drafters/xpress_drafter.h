// XPress (speculators_model_type "xpress"): DFlash's backbone plus a causal refiner head that
// adds a per-slot logit bias, resolved over the block with K parallel Jacobi passes. Oracle:
// speculators 0.9.0 `models/xpress/{core,model_definitions}.py` (XPressRefinerHead, and the
// consistency rounds of XPressDraftModel.forward: "the exact recurrence of inference-time Jacobi
// decoding"). For the S slots h_s of a block (final-normed backbone states), r = xpress_rank:
//   c_s   = [down_h(h_s) ; down_g(mean_s h_s)]                      [2r]
//   x_s   = in_proj([c_s ; token_embed(y_s)])                       [r]
//   x_s  += Σ_{j ≤ s} mix_l[:, s, j] ⊙ x_j                          causal mixer
//   x_s  += mlp_down(silu(mlp_gate(x_s)) ⊙ mlp_up(x_s))
//   logits_s = lm_head(h_s) + readout(x_s)                          over the draft vocabulary
// with y_s the token before the one slot s predicts: in the fill-in layout (slot 0 is the anchor,
// slot s predicts the token at start + s) the token at start + s − 1 (for s = 0 the one before
// the anchor); with sample_from_anchor (slot s predicts start + s + 1) the token at start + s.
// Drafting: the drafts start as the base logits' argmax; each of num_jacobi_passes passes feeds
// the drafts of the pass before as y and takes the refined argmax. Given tokens (teacher forcing,
// the live loop's drafts so far) replace the drafts they cover in every pass.
#pragma once

#include "services/scorer/drafters/registry.h"

namespace specwire {

// The family row (registry.h): "xpress", format "speculators".
const DrafterFamily& XPressFamily();

}  // namespace specwire
