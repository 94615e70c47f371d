#include "common/models/qwen3_5.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/models/attention.h"
#include "common/models/delta_rule_fused.h"
#include "common/models/gated_delta_rule.h"

namespace specwire {
namespace {

// x [B, R, C] → contiguous [B, C, R], i.e. x.transpose(1, 2).contiguous(). On the CPU one 2-D
// matrix at a time: ATen copies a transposed 2-D matrix in cache-sized blocks, but a transposed
// 3-D view element by element along a stride (5-10x slower for the [T, conv_dim] activations).
at::Tensor TransposeLastTwo(const at::Tensor& x) {
  if (!x.is_cpu() || !x.is_contiguous()) return x.transpose(1, 2).contiguous();
  at::Tensor out = at::empty({x.size(0), x.size(2), x.size(1)}, x.options());
  for (int64_t b = 0; b < x.size(0); ++b) out.select(0, b).copy_(x.select(0, b).t());
  return out;
}

// Causal depthwise conv1d + silu, exactly as transformers' torch fallbacks (causal_conv1d_fn for
// a fresh prompt, causal_conv1d_update / the cached-prefill path otherwise).
//   x: [B, C, T]; w: [C, 1, K]; prev: [B, C, K-1] (the inputs before x) or undefined (zeros).
at::Tensor CausalConv1dSilu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& prev) {
  const int64_t C = x.size(1), T = x.size(2), K = w.size(2);
  at::Tensor y;
  if (!prev.defined()) {
    // causal_conv1d_fn: left-pad K-1 zeros (conv1d pads both sides; the right tail is dropped).
    y = at::conv1d(x.to(w.scalar_type()), w, /*bias=*/std::nullopt, /*stride=*/at::IntArrayRef{1},
                   /*padding=*/at::IntArrayRef{K - 1}, /*dilation=*/at::IntArrayRef{1},
                   /*groups=*/C)
            .narrow(2, 0, T);
  } else {
    // The cached inputs supply the left context; every output is a real position.
    y = at::conv1d(at::cat({prev, x}, 2).to(w.scalar_type()), w, std::nullopt, at::IntArrayRef{1},
                   at::IntArrayRef{0}, at::IntArrayRef{1}, C);
  }
  return ByBatchRow(y, [](const at::Tensor& r) { return at::silu(r); }).to(x.scalar_type());
}

// Qwen3_5RMSNormGated: plain-w RMSNorm over dv, then × silu(z). Rounded like transformers: the
// normed value is cast to the compute dtype before × w, the gate product is taken in fp32 and
// cast once at the end.   x, z: [N, dv], temporaries that are overwritten; w: [dv]
// (In-place products: the same values as the out-of-place ones, fewer fresh buffers to fault in.)
at::Tensor GatedRmsNorm(at::Tensor x, at::Tensor z, const at::Tensor& w, double eps) {
  const at::ScalarType in_dtype = x.scalar_type();
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf.mul_(at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps));
  at::Tensor scaled = normed.to(in_dtype).mul_(w);           // w · normed
  at::Tensor gate = z.to(at::kFloat);
  at::silu_(gate).mul_(scaled);  // scaled · silu(z), fp32
  return gate.to(in_dtype);
}
}  // namespace


GatedDeltaNetCache::GatedDeltaNetCache(int64_t batch, int64_t conv_dim, int64_t conv_kernel,
                                       int64_t num_v_heads, int64_t k_head_dim, int64_t v_head_dim,
                                       at::ScalarType dtype, const at::Device& device) {
  auto opts = at::TensorOptions().device(device);
  conv_state = at::zeros({batch, conv_dim, conv_kernel - 1}, opts.dtype(dtype));
  recurrent_state = at::zeros({batch, num_v_heads, k_head_dim, v_head_dim}, opts.dtype(at::kFloat));
}

// ---------------------------------------------------------------------------------------------
// Shared layer structure

Qwen3_5DecoderLayer::Qwen3_5DecoderLayer(const ModelConfig& c, at::ScalarType dtype,
                                         KernelSet kernels)
    : hidden_(c.hidden_size),
      eps_(c.rms_norm_eps),
      dtype_(dtype),
      kernels_(kernels),
      intermediate_(c.intermediate_size) {}

// Every weight, the GDN's A_log, dt_bias and norm included, is loaded in the compute dtype:
// transformers 5.23 declares no _keep_in_fp32_modules for Qwen3.5, so from_pretrained(dtype=bf16)
// casts them all to bf16 (and g is computed from bf16(A_log).float()).
void Qwen3_5DecoderLayer::ForEachWeight(const WeightVisitor& visit) {
  visit({"input_layernorm.weight", {hidden_}, &input_norm_});
  ForEachMixerWeight(visit);
  visit({"post_attention_layernorm.weight", {hidden_}, &post_norm_});
  visit({"mlp.gate_proj.weight", {intermediate_, hidden_}, &gate_w_});
  visit({"mlp.up_proj.weight", {intermediate_, hidden_}, &up_w_});
  visit({"mlp.down_proj.weight", {hidden_, intermediate_}, &down_w_});
}

void Qwen3_5DecoderLayer::Prepare(const at::Device& device) {
  device_ = device;
  for (at::Tensor* t : {&input_norm_, &post_norm_, &gate_w_, &up_w_, &down_w_}) {
    *t = t->to(device, dtype_).contiguous();
  }
  gate_ = Linear(gate_w_, {}, kernels_);
  up_ = Linear(up_w_, {}, kernels_);
  down_ = Linear(down_w_, {}, kernels_);
  gate_w_ = up_w_ = down_w_ = at::Tensor();  // the products own what they multiply by
  PrepareMixer();
}

at::Tensor Qwen3_5DecoderLayer::Forward(const at::Tensor& h, const ForwardContext& ctx,
                                        LayerCache* cache) {
  // --- token mixer block ---
  at::Tensor n = RmsNorm(h, input_norm_, eps_, NormKind::kOnePlusWeight);  // [B, T, H]
  return Mlp(h + Mix(n, ctx, cache));  // a new tensor: `h` may be a captured state
}

at::Tensor Qwen3_5DecoderLayer::DecodeRows(const at::Tensor& h,
                                           const std::vector<DecodeRow>& rows) {
  at::Tensor n = RmsNorm(h, input_norm_, eps_, NormKind::kOnePlusWeight);  // [M, 1, H]
  return Mlp(h + MixRows(n, rows));
}

at::Tensor Qwen3_5DecoderLayer::ForwardPacked(const at::Tensor& h,
                                              const std::vector<PackedSegment>& segments) {
  at::Tensor n = RmsNorm(h, input_norm_, eps_, NormKind::kOnePlusWeight);  // [1, N, H]
  return Mlp(h + MixPacked(n, segments), &segments);
}

at::Tensor Qwen3_5DecoderLayer::Mlp(at::Tensor out,
                                    const std::vector<PackedSegment>* segments) const {
  at::Tensor m = RmsNorm(out, post_norm_, eps_, NormKind::kOnePlusWeight);
  at::Tensor act = gate_(m);  // [B, T, I]
  at::Tensor up = up_(m);
  ForEachRowRange(segments, act.size(1), [&](int64_t start, int64_t len) {
    // silu(gate) · up, in place; decoding rows each as alone (ByBatchRow).
    ByBatchRow(act.narrow(1, start, len), [](at::Tensor a) { return at::silu_(a); });
    act.narrow(1, start, len).mul_(up.narrow(1, start, len));
  });
  out.add_(down_(act));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Gated full attention

GatedAttentionLayer::GatedAttentionLayer(const ModelConfig& c,
                                         std::shared_ptr<const RotaryEmbedding> rope,
                                         at::ScalarType dtype, KernelSet kernels)
    : Qwen3_5DecoderLayer(c, dtype, kernels),
      heads_(c.num_heads),
      kv_heads_(c.num_kv_heads),
      head_dim_(c.head_dim),
      bias_(c.attention_bias),
      rope_(std::move(rope)) {}

void GatedAttentionLayer::ForEachMixerWeight(const WeightVisitor& visit) {
  const int64_t q_out = heads_ * head_dim_, kv_out = kv_heads_ * head_dim_;
  visit({"self_attn.q_proj.weight", {2 * q_out, hidden_}, &q_w_});  // [query | gate] per head
  visit({"self_attn.k_proj.weight", {kv_out, hidden_}, &k_w_});
  visit({"self_attn.v_proj.weight", {kv_out, hidden_}, &v_w_});
  visit({"self_attn.o_proj.weight", {hidden_, q_out}, &o_w_});
  if (bias_) {
    visit({"self_attn.q_proj.bias", {2 * q_out}, &q_b_});
    visit({"self_attn.k_proj.bias", {kv_out}, &k_b_});
    visit({"self_attn.v_proj.bias", {kv_out}, &v_b_});
    visit({"self_attn.o_proj.bias", {hidden_}, &o_b_});
  }
  visit({"self_attn.q_norm.weight", {head_dim_}, &q_norm_});
  visit({"self_attn.k_norm.weight", {head_dim_}, &k_norm_});
}

void GatedAttentionLayer::PrepareMixer() {
  for (at::Tensor* t :
       {&q_w_, &q_b_, &k_w_, &k_b_, &v_w_, &v_b_, &o_w_, &o_b_, &q_norm_, &k_norm_}) {
    if (t->defined()) *t = t->to(device_, dtype_).contiguous();
  }
  q_ = Linear(q_w_, q_b_, kernels_);
  k_ = Linear(k_w_, k_b_, kernels_);
  v_ = Linear(v_w_, v_b_, kernels_);
  o_ = Linear(o_w_, o_b_, kernels_);
  q_w_ = q_b_ = k_w_ = k_b_ = v_w_ = v_b_ = o_w_ = o_b_ = at::Tensor();
}

std::string GatedAttentionLayer::KernelVariant() const {
  return AttentionKernelName(AttentionKernelOf(kernels_), dtype_, device_) + " gated" +
         LinearKernelSuffix(kernels_, dtype_, device_);
}

std::unique_ptr<LayerCache> GatedAttentionLayer::NewCache(int64_t batch, int64_t capacity) const {
  return std::make_unique<KvCache>(batch, kv_heads_, capacity, head_dim_, dtype_, device_);
}

GatedAttentionLayer::Projected GatedAttentionLayer::Project(const at::Tensor& n) const {
  const int64_t B = n.size(0), T = n.size(1), D = head_dim_;
  const int64_t q_out = heads_ * D;
  // q_proj rows are interleaved per head: head h owns [h·2D, h·2D + D) query, then D gate rows.
  at::Tensor qg = q_(n).view({B, T, heads_, 2 * D});
  at::Tensor q = qg.narrow(-1, 0, D);                                   // [B, T, Hq, D]
  at::Tensor gate = qg.narrow(-1, D, D).reshape({B, T, q_out});         // [B, T, Hq·D]
  at::Tensor k = k_(n).view({B, T, kv_heads_, D});  // [B, T, Hkv, D]
  at::Tensor v = v_(n).view({B, T, kv_heads_, D});

  q = RmsNorm(q, q_norm_, eps_, NormKind::kOnePlusWeight).transpose(1, 2);  // [B, Hq, T, D]
  k = RmsNorm(k, k_norm_, eps_, NormKind::kOnePlusWeight).transpose(1, 2);  // [B, Hkv, T, D]
  v = v.transpose(1, 2);                                                    // [B, Hkv, T, D]
  return {q, k, v, gate};
}

at::Tensor GatedAttentionLayer::Attend(at::Tensor q, at::Tensor k, const at::Tensor& v,
                                       const ForwardContext& ctx, LayerCache* cache) const {
  // Partial rotary: only the first rotary_dim = head_dim · partial_rotary_factor dims turn.
  // Qwen3.5 declares interleaved mRoPE (sections T/H/W over the frequencies), but for text every
  // token's T, H and W positions are the same arange, so each frequency sees the same position
  // and mRoPE is exactly 1-D RoPE; transformers' text model builds those identical rows too.
  const auto& [cos, sin] = ctx.Rotary(*rope_, device_);
  q = RotaryEmbedding::Apply(q, cos, sin);
  k = RotaryEmbedding::Apply(k, cos, sin);
  return CausalAttention(q, k, v, ctx, static_cast<KvCache*>(cache), /*sliding_window=*/0,
                         1.0 / std::sqrt(static_cast<double>(head_dim_)),
                         AttentionKernelOf(kernels_));  // [B, T, Hq·D]
}

at::Tensor GatedAttentionLayer::Mix(const at::Tensor& n, const ForwardContext& ctx,
                                    LayerCache* cache) {
  Projected p = Project(n);
  at::Tensor attn = Attend(p.q, p.k, p.v, ctx, cache);
  attn = attn * at::sigmoid(p.gate);  // output gate, in the compute dtype
  return o_(attn);
}

at::Tensor GatedAttentionLayer::MixRows(const at::Tensor& n, const std::vector<DecodeRow>& rows) {
  Projected p = Project(n);  // every row's projections in one product
  std::vector<at::Tensor> attn;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i);
    attn.push_back(Attend(p.q.narrow(0, r, 1), p.k.narrow(0, r, 1), p.v.narrow(0, r, 1),
                          *rows[i].ctx, rows[i].cache));
  }
  const int64_t pad = n.size(0) - static_cast<int64_t>(rows.size());
  if (pad > 0) attn.push_back(at::zeros({pad, 1, heads_ * head_dim_}, n.options()));
  at::Tensor a =
      at::cat(attn, 0) * ByBatchRow(p.gate, [](const at::Tensor& g) { return at::sigmoid(g); });
  return o_(a);
}

at::Tensor GatedAttentionLayer::MixPacked(const at::Tensor& n,
                                          const std::vector<PackedSegment>& segments) {
  Projected p = Project(n);  // every sequence's projections in one product
  std::vector<at::Tensor> attn;
  for (const PackedSegment& s : segments) {
    at::Tensor a = Attend(p.q.narrow(2, s.start, s.length), p.k.narrow(2, s.start, s.length),
                          p.v.narrow(2, s.start, s.length), *s.ctx, nullptr);
    attn.push_back(a * at::sigmoid(p.gate.narrow(1, s.start, s.length)));
  }
  return o_(JoinSegments(std::move(attn), n.size(1)));
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet

GatedDeltaNetLayer::GatedDeltaNetLayer(const ModelConfig& c, at::ScalarType dtype,
                                       KernelSet kernels)
    : Qwen3_5DecoderLayer(c, dtype, kernels),
      nk_(c.linear_num_key_heads),
      nv_(c.linear_num_value_heads),
      dk_(c.linear_key_head_dim),
      dv_(c.linear_value_head_dim),
      conv_kernel_(c.linear_conv_kernel_dim),
      key_dim_(nk_ * dk_),
      value_dim_(nv_ * dv_),
      conv_dim_(2 * key_dim_ + value_dim_) {}

void GatedDeltaNetLayer::ForEachMixerWeight(const WeightVisitor& visit) {
  visit({"linear_attn.in_proj_qkv.weight", {conv_dim_, hidden_}, &in_qkv_w_});
  visit({"linear_attn.in_proj_z.weight", {value_dim_, hidden_}, &in_z_w_});
  visit({"linear_attn.in_proj_b.weight", {nv_, hidden_}, &in_b_w_});
  visit({"linear_attn.in_proj_a.weight", {nv_, hidden_}, &in_a_w_});
  visit({"linear_attn.conv1d.weight", {conv_dim_, 1, conv_kernel_}, &conv_w_});
  visit({"linear_attn.dt_bias", {nv_}, &dt_bias_});
  visit({"linear_attn.A_log", {nv_}, &a_log_});
  visit({"linear_attn.norm.weight", {dv_}, &norm_w_});
  visit({"linear_attn.out_proj.weight", {hidden_, value_dim_}, &out_w_});
}

void GatedDeltaNetLayer::PrepareMixer() {
  for (at::Tensor* t : {&in_qkv_w_, &in_z_w_, &in_b_w_, &in_a_w_, &conv_w_, &dt_bias_, &a_log_,
                        &norm_w_, &out_w_}) {
    *t = t->to(device_, dtype_).contiguous();
  }
  in_qkv_ = Linear(in_qkv_w_, {}, kernels_);
  in_z_ = Linear(in_z_w_, {}, kernels_);
  in_b_ = Linear(in_b_w_, {}, kernels_);
  in_a_ = Linear(in_a_w_, {}, kernels_);
  out_ = Linear(out_w_, {}, kernels_);
  in_qkv_w_ = in_z_w_ = in_b_w_ = in_a_w_ = out_w_ = at::Tensor();
}

bool GatedDeltaNetLayer::FusedDeltaRule() const {
  return kernels_ == KernelSet::kFast && device_.is_cpu();
}

std::string GatedDeltaNetLayer::KernelVariant() const {
  return std::string(FusedDeltaRule()
                         ? "gated-delta-rule recurrent fused fp32"
                         : "gated-delta-rule chunked fp32 (chunk 64) / recurrent decode") +
         LinearKernelSuffix(kernels_, dtype_, device_);
}

std::unique_ptr<LayerCache> GatedDeltaNetLayer::NewCache(int64_t batch, int64_t capacity) const {
  return std::make_unique<GatedDeltaNetCache>(batch, conv_dim_, conv_kernel_, nv_, dk_, dv_, dtype_,
                                              device_);
}

GatedDeltaNetLayer::Projected GatedDeltaNetLayer::Project(const at::Tensor& n) const {
  const int64_t B = n.size(0), T = n.size(1);
  Projected p;
  p.mixed = in_qkv_(n);                       // [B, T, conv_dim]
  p.z = in_z_(n).view({B, T, nv_, dv_});      // output gate
  p.b = in_b_(n);                             // [B, T, nv]
  p.a = in_a_(n);                             // [B, T, nv]
  return p;
}

at::Tensor GatedDeltaNetLayer::Recur(const at::Tensor& mixed_btc, const at::Tensor& z,
                                     const at::Tensor& b, const at::Tensor& a,
                                     const ForwardContext& ctx, LayerCache* layer_cache) const {
  const int64_t B = mixed_btc.size(0), T = mixed_btc.size(1);
  auto* cache = static_cast<GatedDeltaNetCache*>(layer_cache);
  const bool continues = ctx.past_len > 0;  // the cache holds the state after earlier tokens
  TORCH_CHECK(!continues || cache != nullptr, "a forward with past tokens needs a cache");
  at::Tensor mixed = mixed_btc.transpose(1, 2);  // [B, conv_dim, T]

  // Short causal conv over the concatenated [q | k | v] channels, before the split. conv1d makes
  // a non-contiguous input contiguous before its kernel; on the CPU that copy is done here, with
  // the faster transpose (the same layout reaches the kernel, so the same rounding). A view that
  // already counts as contiguous (T = 1) is passed as is: conv1d picks its kernel by the strides.
  at::Tensor conv_in =
      mixed.is_cpu() && !mixed.is_contiguous() ? TransposeLastTwo(mixed_btc) : mixed;
  at::Tensor conv = CausalConv1dSilu(conv_in, conv_w_, continues ? cache->conv_state : at::Tensor());
  if (cache != nullptr) {
    const int64_t keep = conv_kernel_ - 1;
    at::Tensor history = continues ? at::cat({cache->conv_state, mixed}, 2)
                                   : at::constant_pad_nd(mixed, {keep, 0});  // [B, C, keep + T]
    cache->conv_state.copy_(history.narrow(2, history.size(2) - keep, keep));
  }
  conv = TransposeLastTwo(conv.contiguous());  // [B, T, conv_dim]
  // Views: the delta-rule kernels copy them into their own layout.
  at::Tensor q = conv.narrow(-1, 0, key_dim_).view({B, T, nk_, dk_});
  at::Tensor k = conv.narrow(-1, key_dim_, key_dim_).view({B, T, nk_, dk_});
  at::Tensor v = conv.narrow(-1, 2 * key_dim_, value_dim_).view({B, T, nv_, dv_});

  // Write strength, compute dtype (decoding rows stacked: each row's bits as alone, ByBatchRow).
  at::Tensor beta = ByBatchRow(b, [](const at::Tensor& x) { return at::sigmoid(x); });
  // Log decay in fp32: g = −exp(A_log) · softplus(a + dt_bias)  (dt_bias promoted to fp32).
  at::Tensor g =
      -a_log_.to(at::kFloat).exp() *
      ByBatchRow(a.to(at::kFloat) + dt_bias_, [](const at::Tensor& x) { return at::softplus(x); });

  at::Tensor initial = continues ? cache->recurrent_state : at::Tensor();
  // transformers: the recurrent kernel only for one-token steps on an existing state; prompts
  // (and chunked prefill continuing a state) use the chunked kernel. The fast set runs the
  // recurrent form fused for every call (delta_rule_fused.h).
  DeltaRuleResult r =
      FusedDeltaRule() ? GatedDeltaRuleFused(q, k, v, g, beta, initial)
      : continues && T == 1
          ? GatedDeltaRuleRecurrent(q, k, v, g, beta, initial)
          : GatedDeltaRuleChunked(q, k, v, g, beta, initial, /*chunk_size=*/64);
  if (cache != nullptr) cache->recurrent_state.copy_(r.final_state);

  // Per batch row where stacked rows would round the gate's silu otherwise (ByBatchRows).
  return ByBatchRows(B, T * value_dim_, z.is_cpu(), [&](int64_t first, int64_t n) {
    return GatedRmsNorm(r.out.narrow(0, first, n).reshape({-1, dv_}),
                        z.narrow(0, first, n).reshape({-1, dv_}), norm_w_, eps_)
        .reshape({n, T, value_dim_});
  });
}

at::Tensor GatedDeltaNetLayer::Mix(const at::Tensor& n, const ForwardContext& ctx,
                                   LayerCache* cache) {
  Projected p = Project(n);
  return out_(Recur(p.mixed, p.z, p.b, p.a, ctx, cache));  // [B, T, hidden]
}

at::Tensor GatedDeltaNetLayer::MixPacked(const at::Tensor& n,
                                         const std::vector<PackedSegment>& segments) {
  Projected p = Project(n);  // every sequence's projections in one product
  std::vector<at::Tensor> out;
  for (const PackedSegment& s : segments) {
    out.push_back(Recur(p.mixed.narrow(1, s.start, s.length), p.z.narrow(1, s.start, s.length),
                        p.b.narrow(1, s.start, s.length), p.a.narrow(1, s.start, s.length), *s.ctx,
                        nullptr));
  }
  return out_(JoinSegments(std::move(out), n.size(1)));
}

at::Tensor GatedDeltaNetLayer::MixRows(const at::Tensor& n, const std::vector<DecodeRow>& rows) {
  Projected p = Project(n);  // every row's projections in one product
  const int64_t N = static_cast<int64_t>(rows.size()), M = n.size(0);
  // Every decoding row continues its own state: the rows' conv and recurrent states stacked,
  // one conv and delta-rule step for all of them (each row's arithmetic is its own: products
  // and sums along a row's state only), written back to each row's cache.
  std::vector<at::Tensor> conv, recurrent;
  for (const DecodeRow& r : rows) {
    TORCH_CHECK(r.ctx->past_len > 0, "a decoding row needs a prefilled cache");
    auto* c = static_cast<GatedDeltaNetCache*>(r.cache);
    conv.push_back(c->conv_state);
    recurrent.push_back(c->recurrent_state);
  }
  GatedDeltaNetCache stacked(at::cat(conv, 0), at::cat(recurrent, 0));
  const ForwardContext continues(/*past_len=*/1, /*seq_len=*/1, dtype_);  // positions unused
  at::Tensor o = Recur(p.mixed.narrow(0, 0, N), p.z.narrow(0, 0, N), p.b.narrow(0, 0, N),
                       p.a.narrow(0, 0, N), continues, &stacked);  // [N, 1, value_dim]
  for (int64_t i = 0; i < N; ++i) {
    auto* c = static_cast<GatedDeltaNetCache*>(rows[i].cache);
    c->conv_state.copy_(stacked.conv_state.narrow(0, i, 1));
    c->recurrent_state.copy_(stacked.recurrent_state.narrow(0, i, 1));
  }
  if (M > N) o = at::cat({o, at::zeros({M - N, 1, value_dim_}, o.options())}, 0);
  return out_(o);
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DecoderModel>> BuildQwen3_5Model(const ModelConfig& config,
                                                                at::ScalarType dtype,
                                                                KernelSet kernels) {
  auto rope = std::make_shared<const RotaryEmbedding>(config.rope, config.head_dim);
  std::vector<std::unique_ptr<DecoderLayer>> layers;
  for (int64_t i = 0; i < config.num_layers; ++i) {
    switch (config.layer_types[i]) {
      case LayerType::kLinearAttention:
        layers.push_back(std::make_unique<GatedDeltaNetLayer>(config, dtype, kernels));
        break;
      case LayerType::kFullAttention:
        layers.push_back(std::make_unique<GatedAttentionLayer>(config, rope, dtype, kernels));
        break;
      case LayerType::kSlidingAttention:
        return absl::InvalidArgumentError(
            absl::StrCat("layer_types[", i, "] is sliding_attention, which ", config.architecture,
                         " does not have (linear_attention or full_attention)"));
    }
  }
  return std::make_unique<DecoderModel>(config, dtype, NormKind::kOnePlusWeight, std::move(layers),
                                        kernels);
}

}  // namespace specwire
