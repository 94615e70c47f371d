// The Llama family of decoder layers: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
//
// One layer, as transformers writes it:
//   h = h + o_proj(attention(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n)))
//       where n = input_layernorm(h)
//   h = h + down_proj(silu(gate_proj(m)) * up_proj(m))   where m = post_attention_layernorm(h)
// Family differences: Qwen3 has per-head q/k RMSNorm (weight [head_dim]); Qwen2 has q/k/v biases;
// Llama has optional attention (q/k/v/o) and MLP biases.
#pragma once

#include <memory>
#include <tuple>
#include <vector>

#include "common/models/attention.h"
#include "common/models/decoder.h"
#include "common/models/kernel_set.h"
#include "common/models/linear.h"
#include "common/models/rope.h"

namespace specwire {

class LlamaDecoderLayer : public DecoderLayer {
 public:
  LlamaDecoderLayer(const ModelConfig& config, int64_t index,
                    std::shared_ptr<const RotaryEmbedding> rope, at::ScalarType dtype,
                    KernelSet kernels);

  at::Tensor Forward(const at::Tensor& h, const ForwardContext& ctx, LayerCache* cache) override;
  at::Tensor DecodeRows(const at::Tensor& h, const std::vector<DecodeRow>& rows) override;
  at::Tensor ForwardPacked(const at::Tensor& h,
                           const std::vector<PackedSegment>& segments) override;
  void ForEachWeight(const WeightVisitor& visit) override;
  void Prepare(const at::Device& device) override;
  std::unique_ptr<LayerCache> NewCache(int64_t batch, int64_t capacity) const override;
  std::string KernelVariant() const override;

 private:
  // input_layernorm, the fused q/k/v product and the q/k norms: q [B, Hq, T, D], k and v
  // [B, Hkv, T, D].
  std::tuple<at::Tensor, at::Tensor, at::Tensor> Project(const at::Tensor& h) const;
  // Rotary embedding at ctx's positions and attention over `cache`: [B, T, Hq·D].
  at::Tensor Attend(at::Tensor q, at::Tensor k, const at::Tensor& v, const ForwardContext& ctx,
                    LayerCache* cache) const;
  // o_proj and the residual, then the MLP block (SiLU per segment when packed).
  at::Tensor Finish(const at::Tensor& h, const at::Tensor& attn,
                    const std::vector<PackedSegment>* segments = nullptr) const;

  // Sizes.
  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  double eps_;
  bool qk_norm_, qkv_bias_, o_bias_, mlp_bias_;
  int64_t sliding_window_;  // 0: full attention
  at::ScalarType dtype_;
  KernelSet kernels_;
  std::shared_ptr<const RotaryEmbedding> rope_;  // shared by all layers

  // Checkpoint tensors (released after Prepare fuses them).
  at::Tensor input_norm_, post_norm_, q_norm_, k_norm_;
  at::Tensor q_w_, k_w_, v_w_, o_w_, q_b_, k_b_, v_b_, o_b_;
  at::Tensor gate_w_, up_w_, down_w_, gate_b_, up_b_, down_b_;
  // The products Prepare builds (q|k|v and gate|up fused, one GEMM each).
  Linear qkv_, o_, gate_up_, down_;
};

// The whole model for config.family kLlama / kQwen2 / kQwen3.
std::unique_ptr<class DecoderModel> BuildLlamaFamilyModel(const ModelConfig& config,
                                                          at::ScalarType dtype,
                                                          KernelSet kernels = KernelSet::kFast);

}  // namespace specwire
