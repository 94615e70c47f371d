// Multi-token-prediction heads as drafters: a checkpoint's own `mtp.*` layers (Qwen3.5 / Qwen3.6
// hybrids ship one; the drafter directory is the target's own) and speculators' MTP format
// (`speculators_model_type: "mtp"`, the same head extracted to `mtp_layers.0.*`).
//
// The head, as vLLM serves it (qwen3_next_mtp.py, qwen3_5_mtp.py) and speculators 0.9.0 defines
// it (models/mtp): a row pairs a hidden state h_j with the embedding e of the token at j + 1;
//   x = fc([pre_fc_norm_embedding(e) ; pre_fc_norm_hidden(h_j)])      (2H → H, no bias)
//   y = norm(layer(x))                                                 one full-attention layer
//   logits = lm_head(y)                                                the target's head
// with the target's own layer architecture (a Qwen3.5 gated-attention layer and (1 + w) norms;
// plain Qwen3 layers and norms for speculators' qwen3 heads) and its RoPE at position j. Context
// rows take the target's final-normed last hidden state (HF hidden_states[L]) and fill the head's
// own KV cache; drafting a chain after the anchor feeds each step's y back as the next row's
// hidden state with the step's draft as its token, one row per draft at the next position, as
// the serving engines chain the head k times.
#pragma once

#include "services/scorer/drafters/registry.h"

namespace specwire {

// The family row (registry.h): "mtp", formats "target" (the checkpoint's own mtp.* tensors) and
// "speculators".
const DrafterFamily& MtpFamily();

}  // namespace specwire
