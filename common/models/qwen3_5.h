// Qwen3.5 / Qwen3.6 hybrid text model (Qwen3_5ForCausalLM): Gated DeltaNet layers interleaved
// with gated full-attention layers, all with (1 + w) RMSNorms and a dense SwiGLU MLP.
//
// One layer, as transformers 5.23 writes it (models/qwen3_5/modeling_qwen3_5.py):
//   h = h + mixer(input_layernorm(h))         mixer: GatedDeltaNet or GatedAttention (layer_types)
//   h = h + down_proj(silu(gate_proj(m)) * up_proj(m))    m = post_attention_layernorm(h)
//
// The reference is transformers' torch fallback path (flash-linear-attention and causal_conv1d
// absent): every dtype cast, the l2norm eps and placement, and the triangular solve of the chunked
// delta rule are reproduced at the same points; for an unpadded sequence on CPU the states are
// bit-identical to transformers' in fp32 and bf16.
//
// Projections are NOT fused into wider GEMMs (unlike llama.cc): a fused GEMM rounds differently
// from the separate ones whenever the BLAS picks another blocking for the wider matrix, which
// on CPU happens for single-token decode steps (M = 1, gemv) and for the tiny b / a projections
// at the end of a fused GDN input projection (measured: ~5e-7 relative per layer in fp32).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/models/attention.h"
#include "common/models/decoder.h"
#include "common/models/kernel_set.h"
#include "common/models/linear.h"
#include "common/models/rope.h"

namespace specwire {

// Decoding state of one Gated DeltaNet layer.
class GatedDeltaNetCache : public LayerCache {
 public:
  GatedDeltaNetCache(int64_t batch, int64_t conv_dim, int64_t conv_kernel, int64_t num_v_heads,
                     int64_t k_head_dim, int64_t v_head_dim, at::ScalarType dtype,
                     const at::Device& device);
  GatedDeltaNetCache(at::Tensor conv, at::Tensor recurrent)
      : conv_state(std::move(conv)), recurrent_state(std::move(recurrent)) {}
  int64_t bytes() const override {
    return static_cast<int64_t>(conv_state.nbytes() + recurrent_state.nbytes());
  }
  std::unique_ptr<LayerCache> SaveState() const override {
    return std::make_unique<GatedDeltaNetCache>(conv_state.clone(), recurrent_state.clone());
  }
  void RestoreState(const LayerCache& saved) override {
    const auto& s = static_cast<const GatedDeltaNetCache&>(saved);
    conv_state.copy_(s.conv_state);
    recurrent_state.copy_(s.recurrent_state);
  }
  at::Tensor conv_state;       // [B, conv_dim, K-1], compute dtype: the last K-1 conv inputs
  at::Tensor recurrent_state;  // [B, nv, dk, dv] fp32: S after the last processed token
};

// ---------------------------------------------------------------------------------------------
// The part both layer kinds share: (1 + w) pre-norms, residuals and the SwiGLU MLP. Subclasses
// supply the token mixer.
class Qwen3_5DecoderLayer : public DecoderLayer {
 public:
  Qwen3_5DecoderLayer(const ModelConfig& config, at::ScalarType dtype, KernelSet kernels);

  at::Tensor Forward(const at::Tensor& h, const ForwardContext& ctx, LayerCache* cache) final;
  at::Tensor DecodeRows(const at::Tensor& h, const std::vector<DecodeRow>& rows) final;
  at::Tensor ForwardPacked(const at::Tensor& h, const std::vector<PackedSegment>& segments) final;
  void ForEachWeight(const WeightVisitor& visit) final;
  void Prepare(const at::Device& device) final;

 protected:
  // n: input_layernorm(h) [B, T, hidden] → the mixer's output [B, T, hidden].
  virtual at::Tensor Mix(const at::Tensor& n, const ForwardContext& ctx, LayerCache* cache) = 0;
  // The same for DecodeRows: n [M, 1, hidden], one sequence per row (padding rows give 0).
  virtual at::Tensor MixRows(const at::Tensor& n, const std::vector<DecodeRow>& rows) = 0;
  // The same for ForwardPacked: n [1, N, hidden], products over all rows, mixing per segment.
  virtual at::Tensor MixPacked(const at::Tensor& n, const std::vector<PackedSegment>& segments) = 0;
  virtual void ForEachMixerWeight(const WeightVisitor& visit) = 0;
  virtual void PrepareMixer() = 0;  // device_ is set

  const int64_t hidden_;
  const double eps_;
  const at::ScalarType dtype_;
  const KernelSet kernels_;

 private:
  // Post-norm SwiGLU block added to `out` (SiLU per segment when packed: see llama.cc's Finish).
  at::Tensor Mlp(at::Tensor out, const std::vector<PackedSegment>* segments = nullptr) const;

  const int64_t intermediate_;
  at::Tensor input_norm_, post_norm_;  // [hidden], (1 + w)
  at::Tensor gate_w_, up_w_;           // [I, hidden] (until Prepare)
  at::Tensor down_w_;                  // [hidden, I] (until Prepare)
  Linear gate_, up_, down_;            // the products Prepare builds
};

// Full-attention layer (Qwen3_5Attention): q_proj yields [query | gate] per head, q/k get a
// per-head (1 + w) RMSNorm, the first rotary_dim dims are rotated, and the attention output is
// multiplied by sigmoid(gate) before o_proj.
class GatedAttentionLayer : public Qwen3_5DecoderLayer {
 public:
  GatedAttentionLayer(const ModelConfig& config, std::shared_ptr<const RotaryEmbedding> rope,
                      at::ScalarType dtype, KernelSet kernels);
  std::unique_ptr<LayerCache> NewCache(int64_t batch, int64_t capacity) const override;
  std::string KernelVariant() const override;

 protected:
  at::Tensor Mix(const at::Tensor& n, const ForwardContext& ctx, LayerCache* cache) override;
  at::Tensor MixRows(const at::Tensor& n, const std::vector<DecodeRow>& rows) override;
  at::Tensor MixPacked(const at::Tensor& n, const std::vector<PackedSegment>& segments) override;
  void ForEachMixerWeight(const WeightVisitor& visit) override;
  void PrepareMixer() override;

 private:
  struct Projected {
    at::Tensor q, k, v;  // normed: [B, Hq, T, D], [B, Hkv, T, D]
    at::Tensor gate;     // [B, T, Hq·D]
  };
  Projected Project(const at::Tensor& n) const;
  // Rotary embedding at ctx's positions and attention over `cache`: [B, T, Hq·D].
  at::Tensor Attend(at::Tensor q, at::Tensor k, const at::Tensor& v, const ForwardContext& ctx,
                    LayerCache* cache) const;

  const int64_t heads_, kv_heads_, head_dim_;
  const bool bias_;
  std::shared_ptr<const RotaryEmbedding> rope_;  // shared by all attention layers
  at::Tensor q_w_, q_b_;                         // [2·Hq·D, hidden]: [query | gate] per head
  at::Tensor k_w_, k_b_, v_w_, v_b_;             // [Hkv·D, hidden]
  at::Tensor o_w_, o_b_;                         // [hidden, Hq·D]
  at::Tensor q_norm_, k_norm_;                   // [head_dim], (1 + w)
  Linear q_, k_, v_, o_;                         // the products PrepareMixer builds
};

// Gated DeltaNet layer (Qwen3_5GatedDeltaNet).
class GatedDeltaNetLayer : public Qwen3_5DecoderLayer {
 public:
  GatedDeltaNetLayer(const ModelConfig& config, at::ScalarType dtype, KernelSet kernels);
  std::unique_ptr<LayerCache> NewCache(int64_t batch, int64_t capacity) const override;
  std::string KernelVariant() const override;

 protected:
  at::Tensor Mix(const at::Tensor& n, const ForwardContext& ctx, LayerCache* cache) override;
  at::Tensor MixRows(const at::Tensor& n, const std::vector<DecodeRow>& rows) override;
  at::Tensor MixPacked(const at::Tensor& n, const std::vector<PackedSegment>& segments) override;
  void ForEachMixerWeight(const WeightVisitor& visit) override;
  void PrepareMixer() override;

 private:
  struct Projected {
    at::Tensor mixed;  // [B, T, conv_dim]: q | k | v before the conv
    at::Tensor z;      // [B, T, nv, dv]
    at::Tensor b, a;   // [B, T, nv]
  };
  Projected Project(const at::Tensor& n) const;
  // Whether the delta rule runs GatedDeltaRuleFused (the fast set on the CPU).
  bool FusedDeltaRule() const;
  // Conv, gated delta rule and gated norm over `cache` (updated): [B, T, value_dim].
  at::Tensor Recur(const at::Tensor& mixed_btc, const at::Tensor& z, const at::Tensor& b,
                   const at::Tensor& a, const ForwardContext& ctx, LayerCache* cache) const;

  const int64_t nk_, nv_, dk_, dv_, conv_kernel_;
  const int64_t key_dim_, value_dim_, conv_dim_;  // nk·dk, nv·dv, 2·key_dim + value_dim
  at::Tensor in_qkv_w_;                           // [conv_dim, hidden]
  at::Tensor in_z_w_;                             // [value_dim, hidden]
  at::Tensor in_b_w_;                             // [nv, hidden]
  at::Tensor in_a_w_;                             // [nv, hidden]
  at::Tensor conv_w_;                             // [conv_dim, 1, K] depthwise, no bias
  at::Tensor dt_bias_;                            // [nv]
  at::Tensor a_log_;                              // [nv]
  at::Tensor norm_w_;                             // [dv], plain w (not 1 + w)
  at::Tensor out_w_;                              // [hidden, value_dim]
  Linear in_qkv_, in_z_, in_b_, in_a_, out_;      // the products PrepareMixer builds
};

// The whole model for config.family kQwen3_5. INVALID_ARGUMENT for a layer type the hybrid
// architecture does not have (sliding_attention).
absl::StatusOr<std::unique_ptr<DecoderModel>> BuildQwen3_5Model(
    const ModelConfig& config, at::ScalarType dtype, KernelSet kernels = KernelSet::kReference);

}  // namespace specwire
