// The DSpark drafter (DeepSeek + PKU, 2026): DFlash's block backbone (dflash_drafter.h) plus a
// sequential (Markov) logit-bias head, so that a draft position conditions on the token drafted
// before it in the block, and a confidence head predicting each position's acceptance. Both of
// the formats people train it in: speculators (`speculators_model_type: "dspark"`) and SpecForge
// (`dflash_config.projector_type: "dspark"`).
//
// Oracles: speculators 0.9.0 `models/dspark/{core,model_definitions}.py`, SpecForge 0.2.0
// `modeling/draft/dspark.py`. For draft position k of a block at `start` (the token it drafts
// sits at start + k), h_k is the backbone's final-normed state of the slot that predicts it
// (slot k, or slot k − 1 when the checkpoint samples from the anchor) and y_k the token at
// start + k − 1 (the anchor for k = 1, else the draft before it):
//
//   e_k      = W1[y_k]                                          [r]   (markov_head.markov_w1)
//   vanilla  bias_k = W2 e_k                                    [Vd]  (markov_head.markov_w2)
//   gated    bias_k = W2 (σ(G [h_k ; e_k]) ⊙ e_k)                     (markov_head.gate_proj)
//   rnn      [g; c; o] = J [s ; e_k ; h_k],  s ← σ(g) ⊙ s + (1 − σ(g)) ⊙ tanh(c),
//            bias_k = W2 tanh(o)                                      (markov_head.joint_proj)
//   logits_k = lm_head(h_k) + bias_k        over the head's vocabulary (speculators' draft
//                                            vocabulary, or the target's)
//   c_k      = σ(w · [h_k ; e_k] + b)       (confidence_head.proj; e_k only with
//                                            confidence_head_with_markov)
//
// c_k is trained (BCE) on the analytic acceptance rate Σ_v min(p_k, q_k) of position k; its
// running product is the predicted survival an adaptive verify length cuts on. The rnn state s
// starts at zero: speculators runs it over every slot of the block, the anchor's slot 0 included
// when that slot does not predict (y = the anchor there); SpecForge from the first drafting slot.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/scorer/drafters/dflash_drafter.h"
#include "services/scorer/drafters/registry.h"

namespace specwire {

struct DSparkConfig {
  int64_t markov_rank = 0;             // 0: no Markov head (DFlash's independent positions)
  std::string markov_head_type = "vanilla";  // vanilla | gated | rnn
  bool confidence_head = false;
  bool confidence_with_markov = false;  // the head reads [h ; e] instead of h
  // speculators: the rnn state also steps over a slot 0 that does not predict.
  bool rnn_steps_anchor_slot = false;
};

// DSpark's keys: the top level of speculators' config.json, SpecForge's dflash_config
// (INVALID_ARGUMENT naming the file and key).
absl::StatusOr<DSparkConfig> ParseDSparkConfig(const std::string& json_text,
                                               const std::string& format,
                                               const std::string& source);

class DSparkDrafter : public BackboneHeads {
 public:
  // The backbone's checkpoint plus the heads' tensors, each present and shaped; any other
  // markov_head.* / confidence_head.* tensor is an error naming it.
  static absl::StatusOr<std::unique_ptr<DSparkDrafter>> Load(const std::string& dir,
                                                             at::ScalarType dtype,
                                                             const at::Device& device);

  const DFlashDrafter& backbone() const override { return *backbone_; }
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override {
    return backbone_->SetTargetHead(embed_tokens, lm_head);
  }
  const DSparkConfig& config() const { return config_; }
  const std::string& format() const { return format_; }
  // BackboneHeads (dflash_drafter.h): the slots of a block (len − 1 with sample_from_anchor),
  // and its logits over the head's vocabulary [len − 1, Vd] with, given a confidence head, c.
  int64_t Slots(int64_t len) const override;
  int32_t block_size() const override;
  bool conditions_on_drafts() const override { return config_.markov_rank > 0; }
  Block Heads(const at::Tensor& slots, int64_t anchor, int64_t before_anchor,
              std::span<const int64_t> given,
              std::vector<int64_t>* drafts = nullptr) const override;

 private:
  DSparkDrafter() = default;
  // Markov bias [Vd] of one position (advancing the rnn state), and its e.
  at::Tensor Bias(const at::Tensor& h, const at::Tensor& e, at::Tensor& state) const;

  std::unique_ptr<DFlashDrafter> backbone_;
  DSparkConfig config_;
  std::string format_;
  // Heads (the drafter's dtype and device); undefined where the config has none.
  at::Tensor w1_, w2_;          // [V_target, r], [Vd, r]
  at::Tensor gate_w_, gate_b_;  // [r, H + r], [r]
  at::Tensor joint_w_, joint_b_;  // [3r, 2r + H], [3r]
  at::Tensor conf_w_, conf_b_;  // [1, H (+ r)], [1]
};

// The family row (registry.h).
const DrafterFamily& DSparkFamily();

}  // namespace specwire
