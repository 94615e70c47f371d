#include "common/models/llama.h"

#include <cmath>

#include "common/models/attention.h"

namespace specwire {

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& c, int64_t index,
                                     std::shared_ptr<const RotaryEmbedding> rope,
                                     at::ScalarType dtype, KernelSet kernels)
    : hidden_(c.hidden_size),
      heads_(c.num_heads),
      kv_heads_(c.num_kv_heads),
      head_dim_(c.head_dim),
      intermediate_(c.intermediate_size),
      eps_(c.rms_norm_eps),
      qk_norm_(c.qk_norm),
      qkv_bias_(c.attention_bias),
      o_bias_(c.o_proj_bias),
      mlp_bias_(c.mlp_bias),
      sliding_window_(c.layer_types[index] == LayerType::kSlidingAttention ? c.sliding_window : 0),
      dtype_(dtype),
      kernels_(kernels),
      rope_(std::move(rope)) {}

void LlamaDecoderLayer::ForEachWeight(const WeightVisitor& visit) {
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  visit({"input_layernorm.weight", {hidden_}, &input_norm_});
  visit({"self_attn.q_proj.weight", {q_out, hidden_}, &q_w_});
  visit({"self_attn.k_proj.weight", {kv_out, hidden_}, &k_w_});
  visit({"self_attn.v_proj.weight", {kv_out, hidden_}, &v_w_});
  visit({"self_attn.o_proj.weight", {hidden_, q_out}, &o_w_});
  if (qkv_bias_) {
    visit({"self_attn.q_proj.bias", {q_out}, &q_b_});
    visit({"self_attn.k_proj.bias", {kv_out}, &k_b_});
    visit({"self_attn.v_proj.bias", {kv_out}, &v_b_});
  }
  if (o_bias_) visit({"self_attn.o_proj.bias", {hidden_}, &o_b_});
  if (qk_norm_) {
    visit({"self_attn.q_norm.weight", {head_dim_}, &q_norm_});
    visit({"self_attn.k_norm.weight", {head_dim_}, &k_norm_});
  }
  visit({"post_attention_layernorm.weight", {hidden_}, &post_norm_});
  visit({"mlp.gate_proj.weight", {intermediate_, hidden_}, &gate_w_});
  visit({"mlp.up_proj.weight", {intermediate_, hidden_}, &up_w_});
  visit({"mlp.down_proj.weight", {hidden_, intermediate_}, &down_w_});
  if (mlp_bias_) {
    visit({"mlp.gate_proj.bias", {intermediate_}, &gate_b_});
    visit({"mlp.up_proj.bias", {intermediate_}, &up_b_});
    visit({"mlp.down_proj.bias", {hidden_}, &down_b_});
  }
}

void LlamaDecoderLayer::Prepare(const at::Device& device) {
  device_ = device;
  auto to_dev = [&](at::Tensor& t) {
    if (t.defined()) t = t.to(device, dtype_).contiguous();
  };
  // One GEMM for q, k and v, and one for gate and up: fewer passes over the activations and
  // larger, more efficient matrix products. Rows are concatenated, so outputs are [q | k | v].
  auto fused = [&](std::initializer_list<at::Tensor> parts) {
    return parts.begin()->defined() ? at::cat(parts, 0).to(device, dtype_) : at::Tensor();
  };
  for (at::Tensor* t : {&input_norm_, &post_norm_, &q_norm_, &k_norm_, &o_w_, &o_b_, &down_w_, &down_b_}) {
    to_dev(*t);
  }
  qkv_ = Linear(fused({q_w_, k_w_, v_w_}), fused({q_b_, k_b_, v_b_}), kernels_);
  gate_up_ = Linear(fused({gate_w_, up_w_}), fused({gate_b_, up_b_}), kernels_);
  o_ = Linear(o_w_, o_b_, kernels_);
  down_ = Linear(down_w_, down_b_, kernels_);
  // The products own what they multiply by; the checkpoint's tensors are released.
  q_w_ = k_w_ = v_w_ = q_b_ = k_b_ = v_b_ = gate_w_ = up_w_ = gate_b_ = up_b_ = at::Tensor();
  o_w_ = o_b_ = down_w_ = down_b_ = at::Tensor();
}

std::unique_ptr<LayerCache> LlamaDecoderLayer::NewCache(int64_t batch, int64_t capacity) const {
  return std::make_unique<KvCache>(batch, kv_heads_, capacity, head_dim_, dtype_, device_);
}

std::string LlamaDecoderLayer::KernelVariant() const {
  return AttentionKernelName(AttentionKernelOf(kernels_), dtype_, device_) +
         (sliding_window_ > 0 ? " sliding-window" : "") +
         LinearKernelSuffix(kernels_, dtype_, device_);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> LlamaDecoderLayer::Project(
    const at::Tensor& h) const {
  const int64_t B = h.size(0), T = h.size(1);
  at::Tensor n = RmsNormFused(h, input_norm_, eps_);  // [B, T, H]
  at::Tensor qkv = qkv_(n);                         // [B, T, (Hq+2Hkv)*D]
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  at::Tensor q = qkv.narrow(-1, 0, q_out).view({B, T, heads_, head_dim_});
  at::Tensor k = qkv.narrow(-1, q_out, kv_out).view({B, T, kv_heads_, head_dim_});
  at::Tensor v = qkv.narrow(-1, q_out + kv_out, kv_out).view({B, T, kv_heads_, head_dim_});
  if (qk_norm_) {
    q = RmsNormFused(q, q_norm_, eps_);
    k = RmsNormFused(k, k_norm_, eps_);
  }
  // [B, Hq, T, D], [B, Hkv, T, D]
  return {q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)};
}

at::Tensor LlamaDecoderLayer::Attend(at::Tensor q, at::Tensor k, const at::Tensor& v,
                                     const ForwardContext& ctx, LayerCache* cache) const {
  const auto& [cos, sin] = ctx.Rotary(*rope_, device_);
  q = RotaryEmbedding::Apply(q, cos, sin);
  k = RotaryEmbedding::Apply(k, cos, sin);
  return CausalAttention(q, k, v, ctx, static_cast<KvCache*>(cache), sliding_window_,
                         1.0 / std::sqrt(static_cast<double>(head_dim_)),
                         AttentionKernelOf(kernels_));  // [B, T, Hq*D]
}

at::Tensor LlamaDecoderLayer::Finish(const at::Tensor& h, const at::Tensor& attn,
                                     const std::vector<PackedSegment>* segments) const {
  at::Tensor out = h + o_(attn);  // a new tensor: `h` may be a captured state

  // --- MLP block ---
  at::Tensor m = RmsNormFused(out, post_norm_, eps_);
  at::Tensor gu = gate_up_(m);  // [B, T, 2I]
  // silu(gate) * up, written in place over the gate half (same roundings as two out-of-place
  // ops); down_proj reads it through its row stride, without a copy. Packed, per segment: where
  // a multi-threaded elementwise loop splits its range (and which elements take the scalar tail
  // of a vectorised exp) depends on the tensor's shape.
  at::Tensor act = gu.narrow(-1, 0, intermediate_);
  at::Tensor up = gu.narrow(-1, intermediate_, intermediate_);
  ForEachRowRange(segments, gu.size(1), [&](int64_t start, int64_t len) {
    at::Tensor a = act.narrow(1, start, len);
    at::silu_(a);
    a.mul_(up.narrow(1, start, len));
  });
  out.add_(down_(act));
  return out;
}

at::Tensor LlamaDecoderLayer::Forward(const at::Tensor& h, const ForwardContext& ctx,
                                      LayerCache* cache) {
  auto [q, k, v] = Project(h);
  return Finish(h, Attend(q, k, v, ctx, cache));
}

at::Tensor LlamaDecoderLayer::ForwardPacked(const at::Tensor& h,
                                            const std::vector<PackedSegment>& segments) {
  auto [q, k, v] = Project(h);  // every sequence's projections in one product
  std::vector<at::Tensor> attn;
  for (const PackedSegment& s : segments) {
    attn.push_back(Attend(q.narrow(2, s.start, s.length), k.narrow(2, s.start, s.length),
                          v.narrow(2, s.start, s.length), *s.ctx, nullptr));
  }
  return Finish(h, JoinSegments(std::move(attn), h.size(1)), &segments);
}

at::Tensor LlamaDecoderLayer::DecodeRows(const at::Tensor& h, const std::vector<DecodeRow>& rows) {
  auto [q, k, v] = Project(h);  // every row's projections in one product
  std::vector<at::Tensor> attn;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i);
    attn.push_back(Attend(q.narrow(0, r, 1), k.narrow(0, r, 1), v.narrow(0, r, 1), *rows[i].ctx,
                          rows[i].cache));
  }
  const int64_t pad = h.size(0) - static_cast<int64_t>(rows.size());
  if (pad > 0) attn.push_back(at::zeros({pad, 1, heads_ * head_dim_}, h.options()));
  return Finish(h, at::cat(attn, 0));
}

std::unique_ptr<DecoderModel> BuildLlamaFamilyModel(const ModelConfig& config,
                                                    at::ScalarType dtype,
                                                    KernelSet kernels) {
  auto rope = std::make_shared<const RotaryEmbedding>(config.rope, config.head_dim);
  std::vector<std::unique_ptr<DecoderLayer>> layers;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    layers.push_back(std::make_unique<LlamaDecoderLayer>(config, i, rope, dtype, kernels));
  }
  return std::make_unique<DecoderModel>(config, dtype, NormKind::kPlain, std::move(layers),
                                        kernels);
}

}  // namespace specwire
