#include "services/scorer/drafters/eagle3_drafter.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint.h"
#include "common/json_reader.h"
#include "common/models/attention.h"
#include "common/models/decoder.h"
#include "common/models/rope.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/drafters/draft_weights.h"
#include "services/scorer/drafters/block_drafter.h"
#include "services/scorer/drafters/vocab_map.h"

namespace specwire {
namespace {

using json = nlohmann::json;

constexpr char kSpecForgeArchitecture[] = "LlamaForCausalLMEagle3";
constexpr char kPEagleArchitecture[] = "PEagleDraftModel";  // SpecForge's; speculators' save too

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

// Per-layer sliding windows as speculators reads them: layer_types[i] == "sliding_attention"
// takes `sliding_window` (whatever the model_type; transformers' Llama ignores layer_types, the
// drafter does not).
absl::StatusOr<std::vector<int64_t>> SpeculatorsWindows(const JsonReader& tl, int64_t layers) {
  std::vector<int64_t> windows(layers, 0);
  if (!tl.Has("layer_types")) return windows;
  SW_ASSIGN_OR_RETURN(JsonReader types, tl.Array("layer_types"));
  if (static_cast<int64_t>(types.size()) != layers) {
    return tl.Error("layer_types", absl::StrCat("has ", types.size(), " entries for ", layers,
                                                " layers (num_hidden_layers)"));
  }
  for (int64_t i = 0; i < layers; ++i) {
    SW_ASSIGN_OR_RETURN(std::string t, types.Element(i).AsString());
    if (t == "full_attention") continue;
    if (t != "sliding_attention") {
      return types.Element(i).ErrorHere(absl::StrCat(
          "is \"", t, "\"; EAGLE-3 layers are full_attention or sliding_attention"));
    }
    auto w = tl.OptionalInt("sliding_window");
    if (!w.ok() || !w->has_value() || **w <= 0) {
      return tl.Error("sliding_window", "must be a positive integer when layer_types has "
                                        "sliding_attention layers");
    }
    windows[i] = **w;
  }
  return windows;
}

}  // namespace

const char* Eagle3FormatName(Eagle3Format f) {
  return f == Eagle3Format::kSpeculators ? "speculators" : "specforge";
}

absl::StatusOr<std::optional<Eagle3Format>> DetectEagle3(const std::string& json_text,
                                                         const std::string& source) {
  SW_ASSIGN_OR_RETURN(json doc, JsonReader::Parse(json_text, source));
  const JsonReader root(doc, source);
  bool specforge = false;
  if (doc.contains("architectures") && doc["architectures"].is_array()) {
    for (const json& a : doc["architectures"]) specforge |= a.is_string() && a == kSpecForgeArchitecture;
  }
  if (root.Has("speculators_model_type")) {
    SW_ASSIGN_OR_RETURN(std::string type, root.String("speculators_model_type"));
    if (type != "eagle3") return std::optional<Eagle3Format>();
    if (specforge) {
      return root.Error("architectures",
                        absl::StrCat("names SpecForge's ", kSpecForgeArchitecture,
                                     " while speculators_model_type says a speculators "
                                     "checkpoint; a drafter is one or the other"));
    }
    return std::optional<Eagle3Format>(Eagle3Format::kSpeculators);
  }
  if (specforge) return std::optional<Eagle3Format>(Eagle3Format::kSpecForge);
  return std::optional<Eagle3Format>();
}

absl::StatusOr<std::optional<Eagle3Format>> DetectPEagle(const std::string& json_text,
                                                         const std::string& source) {
  SW_ASSIGN_OR_RETURN(json doc, JsonReader::Parse(json_text, source));
  const JsonReader root(doc, source);
  bool named = false;
  if (doc.contains("architectures") && doc["architectures"].is_array()) {
    for (const json& a : doc["architectures"]) named |= a.is_string() && a == kPEagleArchitecture;
  }
  if (root.Has("speculators_model_type")) {
    // speculators' save_pretrained writes architectures ["PEagleDraftModel"] too.
    SW_ASSIGN_OR_RETURN(std::string type, root.String("speculators_model_type"));
    if (type != "peagle") return std::optional<Eagle3Format>();
    return std::optional<Eagle3Format>(Eagle3Format::kSpeculators);
  }
  if (named) return std::optional<Eagle3Format>(Eagle3Format::kSpecForge);
  return std::optional<Eagle3Format>();
}

absl::StatusOr<int32_t> SpeculativeTokensOf(const JsonReader& speculators_config) {
  const JsonReader& sc = speculators_config;
  if (!sc.Has("proposal_methods")) return 0;
  SW_ASSIGN_OR_RETURN(JsonReader methods, sc.Array("proposal_methods"));
  if (methods.size() == 0 || !methods.Element(0).is_object()) return 0;
  SW_ASSIGN_OR_RETURN(int64_t n, methods.Element(0).Int("speculative_tokens", 0));
  if (n < 0 || n > 64) return methods.Element(0).Error("speculative_tokens", "must be in [0, 64]");
  return static_cast<int32_t>(n);
}

absl::StatusOr<Eagle3Config> ParseEagle3Config(const std::string& json_text,
                                               const std::string& source) {
  SW_ASSIGN_OR_RETURN(std::optional<Eagle3Format> parallel, DetectPEagle(json_text, source));
  std::optional<Eagle3Format> format = parallel;
  if (!format) {
    SW_ASSIGN_OR_RETURN(format, DetectEagle3(json_text, source));
  }
  if (!format) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not an EAGLE-3 or P-EAGLE drafter (neither speculators_model_type \"eagle3\" "
                "/ \"peagle\" nor architectures [\"", kSpecForgeArchitecture, "\"] / [\"",
                kPEagleArchitecture, "\"])"));
  }
  SW_ASSIGN_OR_RETURN(json doc, JsonReader::Parse(json_text, source));
  const JsonReader root(doc, source);
  Eagle3Config c;
  c.format = *format;
  c.parallel = parallel.has_value();
  std::vector<int64_t> windows;
  if (c.format == Eagle3Format::kSpeculators) {
    SW_ASSIGN_OR_RETURN(JsonReader tl, root.Object("transformer_layer_config"));
    SW_ASSIGN_OR_RETURN(c.layers, ParseModelConfig(tl.raw().dump(),
                                                   absl::StrCat(source, " transformer_layer_config")));
    if (c.layers.family != ModelFamily::kLlama && c.layers.family != ModelFamily::kQwen3) {
      return tl.Error("model_type", absl::StrCat("is \"", c.layers.model_type,
                                                 "\"; speculators' EAGLE-3 layers are llama or "
                                                 "qwen3"));
    }
    SW_ASSIGN_OR_RETURN(windows, SpeculatorsWindows(tl, c.layers.num_layers));
    SW_ASSIGN_OR_RETURN(c.draft_vocab_size, root.Int("draft_vocab_size", 32000));
    c.aux_ids_key = "eagle_aux_hidden_state_layer_ids";
    if (root.Has(c.aux_ids_key)) {
      SW_ASSIGN_OR_RETURN(c.declared_aux_ids, root.IntList(c.aux_ids_key));
      if (c.declared_aux_ids.empty()) return root.Error(c.aux_ids_key, "must not be empty");
    }
    SW_ASSIGN_OR_RETURN(c.norm_before_fc, root.Bool("norm_before_fc", false));
    SW_ASSIGN_OR_RETURN(c.fc_norm, root.Bool("fc_norm", false));
    if (c.norm_before_fc && c.fc_norm) {
      return root.Error("fc_norm", "and norm_before_fc are both true; speculators allows one");
    }
    SW_ASSIGN_OR_RETURN(c.norm_before_residual, root.Bool("norm_before_residual", false));
    SW_ASSIGN_OR_RETURN(c.feed_normed_hidden, root.Bool("norm_output", false));
    c.norm_before_head = true;
    // P-EAGLE's slot j (the token after j, the states at j) sits at RoPE position j; speculators'
    // EAGLE-3 at j + 1. norm_output changes nothing in P-EAGLE (no step feeds a state back).
    c.position_offset = c.parallel ? 0 : 1;
    if (c.parallel) c.feed_normed_hidden = false;
    // speculators builds fc as Linear(A·H, H): the target's states must be H wide.
    c.target_hidden_size = c.layers.hidden_size;
    if (root.Has("speculators_config")) {
      SW_ASSIGN_OR_RETURN(JsonReader sc, root.Object("speculators_config"));
      SW_ASSIGN_OR_RETURN(c.speculative_tokens, SpeculativeTokensOf(sc));
      if (sc.Has("verifier")) {
        SW_ASSIGN_OR_RETURN(JsonReader v, sc.Object("verifier"));
        SW_ASSIGN_OR_RETURN(std::optional<std::string> name, v.OptionalString("name_or_path"));
        c.verifier = name.value_or("");
      }
    }
  } else {
    // SpecForge's draft config is a LlamaConfig at the top level; its EAGLE-3 always has one
    // layer (`midlayer`) and no biases, whatever num_hidden_layers / attention_bias say; its
    // P-EAGLE has num_hidden_layers layers (`layers.{i}`), no biases, and plain RoPE at
    // rope_theta (its rotary embedding ignores rope scaling).
    SW_ASSIGN_OR_RETURN(c.layers, ParseModelConfig(json_text, source));
    if (c.layers.family != ModelFamily::kLlama) {
      return root.Error("model_type", absl::StrCat("is \"", c.layers.model_type, "\"; SpecForge's ",
                                                   c.parallel ? kPEagleArchitecture
                                                              : kSpecForgeArchitecture,
                                                   " is built of llama layers"));
    }
    if (!c.parallel) c.layers.num_layers = 1;
    c.layers.layer_types.assign(c.layers.num_layers, LayerType::kFullAttention);
    c.layers.attention_bias = false;
    c.layers.mlp_bias = false;
    if (c.parallel) {
      RopeConfig plain;
      plain.theta = c.layers.rope.theta;
      c.layers.rope = plain;
      SW_ASSIGN_OR_RETURN(c.norm_before_residual, root.Bool("norm_before_residual", false));
    }
    windows.assign(c.layers.num_layers, 0);
    SW_ASSIGN_OR_RETURN(std::optional<int64_t> dv, root.OptionalInt("draft_vocab_size"));
    c.draft_vocab_size = dv.value_or(c.layers.vocab_size);
    SW_ASSIGN_OR_RETURN(std::optional<int64_t> th, root.OptionalInt("target_hidden_size"));
    c.target_hidden_size = th.value_or(c.layers.hidden_size);
    if (c.target_hidden_size <= 0) return root.Error("target_hidden_size", "must be positive");
    c.aux_ids_key = "eagle_config.eagle_aux_hidden_state_layer_ids";
    if (root.Has("eagle_config")) {
      SW_ASSIGN_OR_RETURN(JsonReader ec, root.Object("eagle_config"));
      if (ec.Has("eagle_aux_hidden_state_layer_ids")) {
        SW_ASSIGN_OR_RETURN(c.declared_aux_ids, ec.IntList("eagle_aux_hidden_state_layer_ids"));
        if (c.declared_aux_ids.size() != 3) {
          return ec.Error("eagle_aux_hidden_state_layer_ids",
                          absl::StrCat("has ", c.declared_aux_ids.size(),
                                       " entries; SpecForge's EAGLE-3 takes exactly 3"));
        }
      }
    }
    if (!c.parallel) {
      SW_ASSIGN_OR_RETURN(c.fc_norm, root.Bool("fc_norm", false));
      SW_ASSIGN_OR_RETURN(c.norm_before_head, root.Bool("norm_output", true));
    }
    c.position_offset = 0;
  }
  if (c.parallel) {
    // speculators saves it; SpecForge keeps it in its run config, and vLLM needs it in
    // config.json either way.
    if (!root.Has("mask_token_id") || doc["mask_token_id"].is_null()) {
      return root.Error("mask_token_id",
                        c.format == Eagle3Format::kSpecForge
                            ? "is missing; SpecForge keeps P-EAGLE's mask token in its run "
                              "config: add the id it trained with to config.json (vLLM's "
                              "parallel drafting reads it there too)"
                            : "is missing; P-EAGLE fills its future slots with it");
    }
    SW_ASSIGN_OR_RETURN(c.mask_token_id, root.Int("mask_token_id"));
    if (c.mask_token_id < 0 || c.mask_token_id >= c.layers.vocab_size) {
      return root.Error("mask_token_id", absl::StrCat("is ", c.mask_token_id,
                                                      "; it must be in [0, vocab_size ",
                                                      c.layers.vocab_size, ")"));
    }
  }
  if (c.draft_vocab_size <= 0 || c.draft_vocab_size > c.layers.vocab_size) {
    return root.Error("draft_vocab_size",
                      absl::StrCat("is ", c.draft_vocab_size, "; it must be in [1, vocab_size ",
                                   c.layers.vocab_size, "] (the target's vocabulary)"));
  }
  // Sliding windows live in ModelConfig's per-layer types for the forward.
  c.layers.layer_types.resize(c.layers.num_layers, LayerType::kFullAttention);
  c.layers.sliding_window = 0;
  for (int64_t i = 0; i < c.layers.num_layers; ++i) {
    if (windows[i] > 0) {
      c.layers.layer_types[i] = LayerType::kSlidingAttention;
      c.layers.sliding_window = windows[i];
    } else {
      c.layers.layer_types[i] = LayerType::kFullAttention;
    }
  }
  return c;
}

absl::Status Eagle3Config::ResolveTargetLayers(int64_t n) {
  const bool spec = format == Eagle3Format::kSpeculators;
  std::vector<int64_t> ids = declared_aux_ids;
  if (ids.empty()) {
    ids = spec ? std::vector<int64_t>{2, n / 2, n - 3} : std::vector<int64_t>{1, n / 2 - 1, n - 4};
  }
  std::vector<int64_t> mapped;
  for (int64_t id : ids) {
    const int64_t lo = spec ? 1 : 0, hi = spec ? n : n - 1;
    if (id < lo || id > hi) {
      return absl::InvalidArgumentError(absl::StrCat(
          "drafter key \"", aux_ids_key, "\" holds ", id, "; for a target of ", n, " layers ",
          spec ? "speculators' hidden-state indices run from 1 to the number of layers (index "
                 "0, the embedding output, is not a layer)"
               : "SpecForge's layer-output ids run from 0 to the number of layers - 1",
          " [", lo, ", ", hi, "]", declared_aux_ids.empty() ? " (the package's default ids)" : ""));
    }
    mapped.push_back(spec ? id - 1 : id);
  }
  std::sort(mapped.begin(), mapped.end());
  if (std::adjacent_find(mapped.begin(), mapped.end()) != mapped.end()) {
    return absl::InvalidArgumentError(absl::StrCat("drafter key \"", aux_ids_key,
                                                   "\" names a layer twice: [",
                                                   absl::StrJoin(ids, ", "), "]"));
  }
  target_layer_ids = std::move(mapped);
  return absl::OkStatus();
}

absl::Status CheckEagle3FitsTarget(Eagle3Config& d, const ModelConfig& target) {
  if (d.layers.vocab_size != target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter vocab_size ", d.layers.vocab_size, " != target vocab_size ", target.vocab_size));
  }
  if (d.target_hidden_size != target.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter reads target states of width ", d.target_hidden_size,
        d.format == Eagle3Format::kSpeculators ? " (speculators: its hidden_size)"
                                               : " (target_hidden_size)",
        " but the target's hidden_size is ", target.hidden_size));
  }
  return d.ResolveTargetLayers(target.num_layers);
}

// ---------------------------------------------------------------------------------------------

struct Eagle3Drafter::Impl {
  struct Layer {
    at::Tensor in_norm, hid_norm, post_norm, q_norm, k_norm;
    at::Tensor q_w, k_w, v_w, o_w, q_b, k_b, v_b, o_b;
    at::Tensor gate_w, up_w, down_w, gate_b, up_b, down_b;
    int64_t window = 0;
  };

  Eagle3Config config;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::unique_ptr<Checkpoint> checkpoint;
  at::Tensor fc_w, input_norm, norm, lm_head, embed_tokens, own_embed;
  at::Tensor mask_hidden;            // P-EAGLE: [1, 1, A·T], the future slots' auxiliary states
  std::vector<at::Tensor> fc_norms;
  at::Tensor d2t, t2d;               // CPU int64 [Vd], bool [V] (undefined: identity)
  std::vector<int64_t> draft_to_target;  // [Vd]
  at::Tensor target_index;           // [Vd] int64 on device
  std::vector<Layer> layers;
  std::unique_ptr<RotaryEmbedding> rope;

  int64_t H() const { return config.layers.hidden_size; }
  int64_t D() const { return config.layers.head_dim; }
  int64_t Hq() const { return config.layers.num_heads; }
  int64_t Hkv() const { return config.layers.num_kv_heads; }
  int64_t A() const {
    if (config.format == Eagle3Format::kSpecForge) return 3;
    return config.declared_aux_ids.empty() ? 3
                                           : static_cast<int64_t>(config.declared_aux_ids.size());
  }
  double eps() const { return config.layers.rms_norm_eps; }
  std::string LayerPrefix(size_t i) const {
    return config.format == Eagle3Format::kSpecForge && !config.parallel
               ? std::string("midlayer.")
               : absl::StrCat("layers.", i, ".");
  }

  void ForEachWeight(const WeightVisitor& visit) {
    const int64_t h = H(), t = config.target_hidden_size, q_out = Hq() * D(), kv_out = Hkv() * D();
    const int64_t I = config.layers.intermediate_size;
    visit({"fc.weight", {h, A() * t}, &fc_w});
    if (config.parallel) visit({"mask_hidden", {1, 1, A() * t}, &mask_hidden});
    if (config.norm_before_fc) visit({"input_norm.weight", {A() * t}, &input_norm});
    if (config.fc_norm) {
      fc_norms.resize(A());
      for (int64_t i = 0; i < A(); ++i) visit({absl::StrCat("fc_norm.", i, ".weight"), {t}, &fc_norms[i]});
    }
    visit({"norm.weight", {h}, &norm});
    visit({"lm_head.weight", {config.draft_vocab_size, h}, &lm_head});
    const bool bias = config.layers.attention_bias, mlp_bias = config.layers.mlp_bias;
    for (size_t i = 0; i < layers.size(); ++i) {
      Layer& l = layers[i];
      const std::string p = LayerPrefix(i);
      const int64_t in = i == 0 ? 2 * h : h;
      visit({p + "input_layernorm.weight", {h}, &l.in_norm});
      if (i == 0) visit({p + "hidden_norm.weight", {h}, &l.hid_norm});
      visit({p + "post_attention_layernorm.weight", {h}, &l.post_norm});
      visit({p + "self_attn.q_proj.weight", {q_out, in}, &l.q_w});
      visit({p + "self_attn.k_proj.weight", {kv_out, in}, &l.k_w});
      visit({p + "self_attn.v_proj.weight", {kv_out, in}, &l.v_w});
      visit({p + "self_attn.o_proj.weight", {h, q_out}, &l.o_w});
      if (bias) {
        visit({p + "self_attn.q_proj.bias", {q_out}, &l.q_b});
        visit({p + "self_attn.k_proj.bias", {kv_out}, &l.k_b});
        visit({p + "self_attn.v_proj.bias", {kv_out}, &l.v_b});
        visit({p + "self_attn.o_proj.bias", {h}, &l.o_b});
      }
      if (config.layers.family == ModelFamily::kQwen3) {
        visit({p + "self_attn.q_norm.weight", {D()}, &l.q_norm});
        visit({p + "self_attn.k_norm.weight", {D()}, &l.k_norm});
      }
      visit({p + "mlp.gate_proj.weight", {I, h}, &l.gate_w});
      visit({p + "mlp.up_proj.weight", {I, h}, &l.up_w});
      visit({p + "mlp.down_proj.weight", {h, I}, &l.down_w});
      if (mlp_bias) {
        visit({p + "mlp.gate_proj.bias", {I}, &l.gate_b});
        visit({p + "mlp.up_proj.bias", {I}, &l.up_b});
        visit({p + "mlp.down_proj.bias", {h}, &l.down_b});
      }
    }
  }

  at::Tensor Norm(const at::Tensor& x, const at::Tensor& w) const {
    return RmsNorm(x, w, eps(), NormKind::kPlain);
  }

  // The auxiliary states [n, A·T] → the first layer's hidden input [n, H].
  at::Tensor Project(const at::Tensor& features) const {
    at::Tensor x = features.to(device, dtype);
    if (input_norm.defined()) x = Norm(x, input_norm);
    if (!fc_norms.empty()) {
      std::vector<at::Tensor> parts = x.chunk(A(), -1);
      for (int64_t i = 0; i < A(); ++i) parts[i] = Norm(parts[i], fc_norms[i]);
      x = at::cat(parts, -1);
    }
    return at::linear(x, fc_w);
  }

  at::Tensor Embed(std::span<const int64_t> tokens) const {
    at::Tensor ids = at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::kLong)
                         .to(device);
    return embed_tokens.index_select(0, ids);
  }

  // q/k/v of rows x [n, in] at positions [pos, pos + n): [1, heads, n, D] each, rotated.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> Qkv(const Layer& l, const at::Tensor& x,
                                                      int64_t pos) const {
    const int64_t n = x.size(0);
    at::Tensor q = at::linear(x, l.q_w, l.q_b).view({n, Hq(), D()});
    at::Tensor k = at::linear(x, l.k_w, l.k_b).view({n, Hkv(), D()});
    at::Tensor v = at::linear(x, l.v_w, l.v_b).view({n, Hkv(), D()});
    if (l.q_norm.defined()) {
      q = Norm(q, l.q_norm);
      k = Norm(k, l.k_norm);
    }
    q = q.transpose(0, 1).unsqueeze(0);
    k = k.transpose(0, 1).unsqueeze(0);
    v = v.transpose(0, 1).unsqueeze(0);
    auto [cos, sin] = rope->CosSin(pos, n, dtype, device);
    return {RotaryEmbedding::Apply(q, cos, sin), RotaryEmbedding::Apply(k, cos, sin), v};
  }

  at::Tensor Finish(const Layer& l, const at::Tensor& attn, const at::Tensor& residual) const {
    at::Tensor h = residual + at::linear(attn, l.o_w, l.o_b);
    at::Tensor x = Norm(h, l.post_norm);
    x = at::linear(at::silu(at::linear(x, l.gate_w, l.gate_b)) * at::linear(x, l.up_w, l.up_b),
                   l.down_w, l.down_b);
    return h + x;
  }

  // The layer input of rows (embedding e, hidden input g): attention input and residual.
  std::pair<at::Tensor, at::Tensor> FirstInput(const Layer& l, const at::Tensor& e,
                                               const at::Tensor& g) const {
    at::Tensor gn = Norm(g, l.hid_norm);
    return {at::cat({Norm(e, l.in_norm), gn}, -1), config.norm_before_residual ? gn : g};
  }

  // Layer i's attention input and residual: [embedding ; hidden] into the first layer, the
  // previous layer's output h into the others.
  std::pair<at::Tensor, at::Tensor> LayerInput(size_t i, const at::Tensor& e, const at::Tensor& g,
                                               const at::Tensor& h) const {
    if (i == 0) return FirstInput(layers[0], e, g);
    return {Norm(h, layers[i].in_norm), h};
  }

  // Context rows: K/V into the caches at [past, past + n), causal (windowed) attention over
  // the rows before; returns the outputs [n, H].
  at::Tensor ContextRows(std::vector<std::unique_ptr<KvCache>>& kv, int64_t past,
                         const at::Tensor& e, const at::Tensor& g) const {
    const int64_t n = e.size(0);
    const ForwardContext ctx(past, n, dtype);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D()));
    at::Tensor h;
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      auto [x, residual] = LayerInput(i, e, g, h);
      auto [q, k, v] = Qkv(l, x, past + config.position_offset);
      at::Tensor attn = CausalAttention(q, k, v, ctx, kv[i].get(), l.window, scale);  // [1, n, .]
      h = Finish(l, attn.squeeze(0), residual);
    }
    return h;
  }

  // Chain row k ≥ 1 after a context of `length` rows: the tree row whose ancestors are the
  // chain rows 1..k − 1 (slots length .. length + k − 2), at position P(length − 1) + k.
  at::Tensor ChainRow(std::vector<std::unique_ptr<KvCache>>& kv, int64_t length, int64_t k,
                      const at::Tensor& e, const at::Tensor& g) const {
    std::vector<int64_t> ancestors;
    for (int64_t j = 1; j < k; ++j) ancestors.push_back(length + j - 1);
    return TreeRow(kv, length, length + k - 1, ancestors, length - 1 + config.position_offset + k,
                   e, g);
  }

  // A tree node's row: K/V at `slot`; attends to the context rows (windowed as a chain) and
  // the rows at `ancestors` (root first), then its own.
  at::Tensor TreeRow(std::vector<std::unique_ptr<KvCache>>& kv, int64_t length, int64_t slot,
                     const std::vector<int64_t>& ancestors, int64_t pos, const at::Tensor& e,
                     const at::Tensor& g) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(D()));
    at::Tensor h;
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      auto [x, residual] = LayerInput(i, e, g, h);
      auto [q, kk, vv] = Qkv(l, x, pos);
      kv[i]->k.narrow(2, slot, 1).copy_(kk);
      kv[i]->v.narrow(2, slot, 1).copy_(vv);
      const int64_t lo = l.window > 0 ? std::max<int64_t>(0, length - l.window) : 0;
      std::vector<int64_t> keys;
      for (int64_t j = lo; j < length; ++j) keys.push_back(j);
      keys.insert(keys.end(), ancestors.begin(), ancestors.end());
      keys.push_back(slot);
      at::Tensor idx = at::tensor(keys, at::kLong).to(device);
      at::Tensor attn = at::scaled_dot_product_attention(
          q, kv[i]->k.index_select(2, idx), kv[i]->v.index_select(2, idx), {}, 0.0, false, scale,
          Hq() != Hkv());
      h = Finish(l, attn.transpose(1, 2).reshape({1, Hq() * D()}), residual);
    }
    return h;
  }

  // P-EAGLE's future slots d = 1..n after a context of `length` rows: K/V at slots
  // [length, length + n), RoPE positions P(length − 1) + d; slot d attends to the context rows
  // inside its window (those after P(length − 1) + d − window), to the anchor's row (its own
  // chain, window or not) and to slots 1..d.
  at::Tensor ParallelRows(std::vector<std::unique_ptr<KvCache>>& kv, int64_t length,
                          const at::Tensor& e, const at::Tensor& g) const {
    const int64_t n = e.size(0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D()));
    const int64_t pos0 = length - 1 + config.position_offset + 1;
    at::Tensor h;
    for (size_t i = 0; i < layers.size(); ++i) {
      const Layer& l = layers[i];
      auto [x, residual] = LayerInput(i, e, g, h);
      auto [q, kk, vv] = Qkv(l, x, pos0);
      kv[i]->k.narrow(2, length, n).copy_(kk);
      kv[i]->v.narrow(2, length, n).copy_(vv);
      // allow[d − 1][j]: context row j (j < length) or slot j − length + 1 ≤ d.
      at::Tensor allow = at::zeros({n, length + n}, at::TensorOptions().dtype(at::kBool));
      for (int64_t d = 1; d <= n; ++d) {
        const int64_t lo = l.window > 0 ? std::max<int64_t>(0, length + d - l.window) : 0;
        if (lo < length) allow[d - 1].narrow(0, lo, length - lo).fill_(true);
        allow[d - 1][length - 1] = true;  // the anchor's row is the slot's own chain
        allow[d - 1].narrow(0, length, d).fill_(true);
      }
      at::Tensor attn = at::scaled_dot_product_attention(
          q, kv[i]->k.narrow(2, 0, length + n), kv[i]->v.narrow(2, 0, length + n),
          allow.to(device).view({1, 1, n, length + n}), 0.0, false, scale, Hq() != Hkv());
      h = Finish(l, attn.transpose(1, 2).reshape({n, Hq() * D()}), residual);
    }
    return h;
  }

  at::Tensor Head(const at::Tensor& h) const {
    return at::linear(config.norm_before_head ? Norm(h, norm) : h, lm_head).to(at::kFloat);
  }
};

Eagle3Drafter::Eagle3Drafter() : impl_(std::make_unique<Impl>()) {}
Eagle3Drafter::~Eagle3Drafter() = default;
const Eagle3Config& Eagle3Drafter::config() const { return impl_->config; }
Eagle3Config& Eagle3Drafter::mutable_config() { return impl_->config; }
at::ScalarType Eagle3Drafter::dtype() const { return impl_->dtype; }
const at::Device& Eagle3Drafter::device() const { return impl_->device; }

absl::StatusOr<std::unique_ptr<Eagle3Drafter>> Eagle3Drafter::Load(const std::string& dir,
                                                                   at::ScalarType dtype,
                                                                   const at::Device& device) {
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  SW_ASSIGN_OR_RETURN(Eagle3Config config, ParseEagle3Config(config_file.text, config_file.path));
  std::unique_ptr<Eagle3Drafter> drafter(new Eagle3Drafter());
  Impl& m = *drafter->impl_;
  m.config = std::move(config);
  m.dtype = dtype;
  m.device = device;
  auto opened = Checkpoint::Open(dir);
  if (!opened.ok()) {
    if (std::filesystem::exists(std::filesystem::path(dir) / "pytorch_model.bin")) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": pytorch_model.bin (a pickle) is not read; convert it to model.safetensors "
               "(safetensors.torch.save_file of the state dict)"));
    }
    return opened.status();
  }
  m.checkpoint = std::move(*opened);
  m.layers.resize(m.config.layers.num_layers);
  for (int64_t i = 0; i < m.config.layers.num_layers; ++i) {
    m.layers[i].window = m.config.layers.layer_types[i] == LayerType::kSlidingAttention
                             ? m.config.layers.sliding_window
                             : 0;
  }
  const int64_t V = m.config.layers.vocab_size, Vd = m.config.draft_vocab_size;
  const char* family = m.config.parallel ? "P-EAGLE" : "EAGLE-3";
  absl::Status status = RunGuarded(absl::StrCat("loading ", family, " drafter ", dir),
                                   [&]() -> absl::Status {
    std::set<std::string> consumed;
    SW_RETURN_IF_ERROR(LoadDraftWeights(
        *m.checkpoint, dir, family, [&](const WeightVisitor& v) { m.ForEachWeight(v); },
        dtype, consumed,
        [&](const WeightSlot& slot, const std::string& got, const std::string& want) {
          if (slot.name != "fc.weight") return std::string();
          return absl::StrCat("tensor \"fc.weight\" has shape ", got,
                              " but config.json implies ", want, " (", m.A(),
                              " auxiliary states of width ", m.config.target_hidden_size, ")");
        }));
    // The embedding: the checkpoint's own (speculators saves it), else the target's.
    if (const TensorView* e = m.checkpoint->Find("embed_tokens.weight")) {
      if (!IsFloat(e->dtype) || e->shape != std::vector<int64_t>{V, m.H()}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"embed_tokens.weight\" is ", DTypeName(e->dtype), " ", Shape(e->shape),
            "; expected a float [", V, ", ", m.H(), "] (vocab_size x hidden_size)"));
      }
      m.own_embed = WrapView(*e).to(device, dtype);
      m.embed_tokens = m.own_embed;
      consumed.insert("embed_tokens.weight");
    }
    SW_ASSIGN_OR_RETURN(m.draft_to_target,
                        ReadDraftVocabulary(*m.checkpoint, dir, Vd, V, consumed));
    for (const auto& [name, view] : m.checkpoint->tensors()) {
      if (consumed.count(name) || name.ends_with("rotary_emb.inv_freq") ||
          name.starts_with("verifier_")) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat("unexpected tensor \"", name, "\" in ",
                                                     family, " drafter ", dir, " (",
                                                     Eagle3FormatName(m.config.format),
                                                     " format)"));
    }
    auto to_dev = [&](at::Tensor& t) {
      if (t.defined()) t = t.to(device, dtype).contiguous();
    };
    for (at::Tensor* t : {&m.fc_w, &m.input_norm, &m.norm, &m.lm_head, &m.mask_hidden}) to_dev(*t);
    for (at::Tensor& t : m.fc_norms) to_dev(t);
    for (Impl::Layer& l : m.layers) {
      for (at::Tensor* t : {&l.in_norm, &l.hid_norm, &l.post_norm, &l.q_norm, &l.k_norm, &l.q_w,
                            &l.k_w, &l.v_w, &l.o_w, &l.q_b, &l.k_b, &l.v_b, &l.o_b, &l.gate_w,
                            &l.up_w, &l.down_w, &l.gate_b, &l.up_b, &l.down_b}) {
        to_dev(*t);
      }
    }
    m.target_index = at::tensor(m.draft_to_target, at::kLong).to(device);
    m.rope = std::make_unique<RotaryEmbedding>(m.config.layers.rope, m.config.layers.head_dim);
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return drafter;
}

bool Eagle3Drafter::has_own_embedding() const { return impl_->own_embed.defined(); }

absl::Status Eagle3Drafter::SetTargetEmbedding(const at::Tensor& embed_tokens) {
  Impl& m = *impl_;
  if (m.own_embed.defined()) return absl::OkStatus();
  if (!embed_tokens.defined() || embed_tokens.dim() != 2 ||
      embed_tokens.size(0) != m.config.layers.vocab_size || embed_tokens.size(1) != m.H()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the drafter has no embed_tokens.weight of its own and the target's embedding is ",
        embed_tokens.defined() ? absl::StrCat("[", absl::StrJoin(embed_tokens.sizes(), ", "), "]")
                               : "missing",
        "; it needs [", m.config.layers.vocab_size, ", ", m.H(), "]"));
  }
  return RunGuarded("setting the target embedding", [&]() -> absl::Status {
    m.embed_tokens = embed_tokens.to(m.device, m.dtype);
    return absl::OkStatus();
  });
}

std::unique_ptr<Eagle3Cache> Eagle3Drafter::NewCache(int64_t capacity) const {
  auto cache = std::make_unique<Eagle3Cache>();
  EnsureCapacity(*cache, std::max<int64_t>(capacity, 16));
  return cache;
}

void Eagle3Drafter::EnsureCapacity(Eagle3Cache& cache, int64_t needed) const {
  if (needed <= cache.capacity_) return;
  const Impl& m = *impl_;
  const int64_t cap = std::max<int64_t>(needed, cache.capacity_ * 2);
  GrowKv(cache.k_, cache.v_, m.layers.size(), m.Hkv(), m.D(), cache.length_, cap,
         at::TensorOptions().dtype(m.dtype).device(m.device));
  cache.capacity_ = cap;
}

namespace {

// KvCache views over an Eagle3Cache's tensors (CausalAttention's cache type).
std::vector<std::unique_ptr<KvCache>> Views(std::vector<at::Tensor>& k, std::vector<at::Tensor>& v,
                                            at::ScalarType dtype, const at::Device& device) {
  std::vector<std::unique_ptr<KvCache>> out;
  for (size_t i = 0; i < k.size(); ++i) {
    auto c = std::make_unique<KvCache>(1, 1, 1, 1, dtype, device);
    c->k = k[i];
    c->v = v[i];
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

void Eagle3Drafter::AppendContext(Eagle3Cache& cache, const at::Tensor& features,
                                  std::span<const int64_t> next_tokens) const {
  const Impl& m = *impl_;
  TORCH_CHECK(m.embed_tokens.defined(), "EAGLE-3 drafter: no embedding (SetTargetEmbedding)");
  const int64_t n = features.size(0);
  TORCH_CHECK(features.dim() == 2 && features.size(1) == m.A() * m.config.target_hidden_size,
              "EAGLE-3 context features must be [n, ", m.A() * m.config.target_hidden_size,
              "], got ", features.sizes());
  TORCH_CHECK(static_cast<int64_t>(next_tokens.size()) == n, "EAGLE-3 context: ", n,
              " rows but ", next_tokens.size(), " next tokens");
  if (n == 0) return;
  c10::InferenceMode guard;
  EnsureCapacity(cache, cache.length_ + n + 16);
  // A row whose next token is unknown (the trajectory's end) takes token 0: no chain starts
  // from it.
  std::vector<int64_t> tokens(next_tokens.begin(), next_tokens.end());
  for (int64_t& t : tokens) {
    TORCH_CHECK(t >= -1 && t < m.config.layers.vocab_size, "EAGLE-3 context: token ", t,
                " outside the vocabulary");
    if (t < 0) t = 0;
  }
  auto kv = Views(cache.k_, cache.v_, m.dtype, m.device);
  at::Tensor h = m.ContextRows(kv, cache.length_, m.Embed(tokens), m.Project(features));
  cache.length_ += n;
  cache.last_hidden_ = h.narrow(0, n - 1, 1).clone();
  cache.last_token_ = next_tokens[n - 1];
}


Eagle3Tree Eagle3Drafter::DraftTree(Eagle3Cache& cache, const Eagle3TreeOptions& options,
                                    int32_t levels) const {
  const Impl& m = *impl_;
  TORCH_CHECK(cache.length_ >= 1, "EAGLE-3: a tree needs at least one context row");
  TORCH_CHECK(options.depth >= 1 && options.top_k >= 1 && options.total_tokens >= 1,
              "EAGLE-3 tree: depth, top_k and total_tokens must be positive");
  levels = std::min(levels, options.depth);
  TORCH_CHECK(levels >= 1, "EAGLE-3 tree of ", levels, " levels");
  c10::InferenceMode guard;
  const int64_t k = std::min<int64_t>(options.top_k, m.config.draft_vocab_size);
  EnsureCapacity(cache, cache.length_ + k * levels + 1);
  auto kv = Views(cache.k_, cache.v_, m.dtype, m.device);
  std::vector<at::Tensor> out_h;  // per node: its row's output (expanded nodes only)
  std::vector<int64_t> slot_of;   // per node: its row's cache slot (−1: no row)
  auto log_probs = [&](const at::Tensor& h) {
    return at::log_softmax(m.Head(h).reshape({-1}), -1).to(at::kCPU);
  };
  int64_t next_slot = cache.length_;
  auto expand = [&](const Eagle3Tree& tree, int64_t f) {
    out_h.resize(tree.token.size());
    slot_of.resize(tree.token.size(), -1);
    std::vector<int64_t> ancestors;
    for (int64_t a = tree.parent[f]; a >= 0; a = tree.parent[a]) ancestors.push_back(slot_of[a]);
    std::reverse(ancestors.begin(), ancestors.end());
    const at::Tensor& hp = tree.parent[f] >= 0 ? out_h[tree.parent[f]] : cache.last_hidden_;
    at::Tensor g = m.config.feed_normed_hidden ? m.Norm(hp, m.norm) : hp;
    const int64_t ids[1] = {tree.token[f]};
    const int64_t pos = cache.length_ - 1 + m.config.position_offset + tree.level[f];
    slot_of[f] = next_slot++;
    out_h[f] = m.TreeRow(kv, cache.length_, slot_of[f], ancestors, pos, m.Embed(ids), g);
    return log_probs(out_h[f]);
  };
  return GrowTopKTree(levels, options.top_k, options.total_tokens, log_probs(cache.last_hidden_),
                      expand, [&](int64_t d) { return m.draft_to_target[d]; });
}

int64_t Eagle3Drafter::ToTarget(int64_t draft_id) const { return impl_->draft_to_target.at(draft_id); }

at::Tensor Eagle3Drafter::ToTargetLogits(const at::Tensor& draft_logits) const {
  const Impl& m = *impl_;
  std::vector<int64_t> shape(draft_logits.sizes().begin(), draft_logits.sizes().end());
  shape.back() = m.config.layers.vocab_size;
  at::Tensor full = at::full(shape, -std::numeric_limits<float>::infinity(),
                             draft_logits.options());
  return full.index_copy(-1, m.target_index.to(draft_logits.device()), draft_logits);
}

at::Tensor Eagle3Drafter::DraftChain(Eagle3Cache& cache, int64_t len,
                                     std::span<const int64_t> forced,
                                     std::span<const int64_t> stop_at, int64_t* accepted) const {
  const Impl& m = *impl_;
  TORCH_CHECK(cache.length_ >= 1, "EAGLE-3: a chain needs at least one context row");
  TORCH_CHECK(len >= 2, "EAGLE-3: a chain of ", len - 1, " drafts");
  TORCH_CHECK(forced.empty() || static_cast<int64_t>(forced.size()) == len - 2,
              "EAGLE-3: ", forced.size(), " forced tokens for ", len - 2, " chain steps");
  TORCH_CHECK(stop_at.empty() || static_cast<int64_t>(stop_at.size()) == len - 1,
              "EAGLE-3: ", stop_at.size(), " truth tokens for ", len - 1, " drafts");
  c10::InferenceMode guard;
  EnsureCapacity(cache, cache.length_ + len);
  auto kv = Views(cache.k_, cache.v_, m.dtype, m.device);
  at::Tensor out = at::zeros({len - 1, m.config.draft_vocab_size}, at::kFloat);
  at::Tensor h = cache.last_hidden_;
  int64_t a = len - 1;
  for (int64_t k = 0; k < len - 1; ++k) {
    if (k > 0) {
      for (const int64_t t : forced) {
        TORCH_CHECK(t >= -1 && t < m.config.layers.vocab_size, "EAGLE-3: forced token ", t,
                    " outside the vocabulary (−1: the chain's own draft)");
      }
      const int64_t token = forced.empty() ? -1 : forced[k - 1];
      const int64_t y = token >= 0 ? token : m.draft_to_target[out[k - 1].argmax().item<int64_t>()];
      const int64_t ids[1] = {y};
      at::Tensor g = m.config.feed_normed_hidden ? m.Norm(h, m.norm) : h;
      h = m.ChainRow(kv, cache.length_, k, m.Embed(ids), g);
    }
    out[k].copy_(m.Head(h).reshape({-1}).to(at::kCPU));
    if (!stop_at.empty()) {
      const int64_t y = m.draft_to_target[out[k].argmax().item<int64_t>()];
      if (y != stop_at[k]) {
        a = k;
        break;
      }
    }
  }
  if (accepted != nullptr) *accepted = a;
  return out;
}

at::Tensor Eagle3Drafter::DraftParallel(Eagle3Cache& cache, int64_t len) const {
  const Impl& m = *impl_;
  TORCH_CHECK(m.config.parallel, "DraftParallel: not a P-EAGLE drafter");
  TORCH_CHECK(cache.length_ >= 1, "P-EAGLE: a block needs at least one context row");
  TORCH_CHECK(len >= 2, "P-EAGLE: a block of ", len - 1, " drafts");
  c10::InferenceMode guard;
  EnsureCapacity(cache, cache.length_ + len);
  at::Tensor out = at::empty({len - 1, m.config.draft_vocab_size}, at::kFloat);
  out[0].copy_(m.Head(cache.last_hidden_).reshape({-1}).to(at::kCPU));
  if (len > 2) {
    const int64_t n = len - 2;
    auto kv = Views(cache.k_, cache.v_, m.dtype, m.device);
    const std::vector<int64_t> masks(n, m.config.mask_token_id);
    at::Tensor g = m.Project(m.mask_hidden.view({1, -1})).expand({n, m.H()});
    at::Tensor h = m.ParallelRows(kv, cache.length_, m.Embed(masks), g.contiguous());
    out.narrow(0, 1, n).copy_(m.Head(h).to(at::kCPU));
  }
  return out;
}

namespace {

class Eagle3Session : public DraftSession {
 public:
  Eagle3Session(const Eagle3Drafter* drafter, int64_t capacity)
      : drafter_(drafter), cache_(drafter->NewCache(capacity)) {}
  void AppendContext(const at::Tensor& features, std::span<const int64_t> next_tokens) override {
    drafter_->AppendContext(*cache_, features, next_tokens);
  }
  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                         std::span<const int64_t> given) override {
    Check(anchor, start);
    // Step k feeds given[k − 1]; −1 (or past given's end) feeds the chain's own argmax.
    std::vector<int64_t> forced;
    if (!given.empty() && len >= 3) {
      forced.assign(len - 2, -1);
      for (int64_t k = 0; k < len - 2 && k < static_cast<int64_t>(given.size()); ++k) {
        forced[k] = given[k];
      }
    }
    draft_logits_ = drafter_->DraftChain(*cache_, len, forced);  // [len − 1, Vd]
    return drafter_->ToTargetLogits(draft_logits_);
  }
  std::map<std::string, at::Tensor> Inspect() const override {
    return {{"draft_logits", draft_logits_}};
  }
  int64_t AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                         const std::vector<int64_t>& truth) override {
    Check(anchor, start);
    int64_t accepted = 0;
    drafter_->DraftChain(*cache_, len, {}, truth, &accepted);
    return accepted;
  }

 protected:
  void Check(int64_t anchor, int64_t start) const {
    TORCH_CHECK(start == cache_->length(), "EAGLE-3 chain at ", start, " but the context covers [0, ",
                cache_->length(), ")");
    (void)anchor;  // the last context row already paired its state with it
  }
  const Eagle3Drafter* drafter_;
  std::unique_ptr<Eagle3Cache> cache_;
  at::Tensor draft_logits_;  // the last chain's, over the draft vocabulary (Inspect)
};

// Tree acceptance: a block of length len is a tree of len − 1 levels.
class Eagle3TreeSession : public Eagle3Session {
 public:
  Eagle3TreeSession(const Eagle3Drafter* drafter, int64_t capacity, Eagle3TreeOptions options,
                    std::vector<Eagle3Tree>* trees)
      : Eagle3Session(drafter, capacity), options_(options), trees_(trees) {}
  at::Tensor DraftLogits(int64_t, int64_t, int64_t, std::span<const int64_t>) override {
    TORCH_CHECK(false, "an EAGLE-3 tree has no block logits (tree acceptance only)");
  }
  int64_t AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                         const std::vector<int64_t>& truth) override {
    Check(anchor, start);
    Eagle3Tree tree = drafter_->DraftTree(*cache_, options_, static_cast<int32_t>(len - 1));
    const int64_t a = tree.Accepted(truth);
    if (trees_ != nullptr) trees_->push_back(std::move(tree));
    return a;
  }

 private:
  Eagle3TreeOptions options_;
  std::vector<Eagle3Tree>* trees_;
};

class Eagle3BlockDrafter : public BlockDrafter {
 public:
  Eagle3BlockDrafter(const Eagle3Drafter* drafter, int32_t block_size,
                     std::optional<Eagle3TreeOptions> tree, std::vector<Eagle3Tree>* trees)
      : drafter_(drafter), block_size_(block_size), tree_(tree), trees_(trees) {}
  int32_t block_size() const override { return block_size_; }
  bool conditions_on_drafts() const override { return true; }  // a chain
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    if (tree_) return std::make_unique<Eagle3TreeSession>(drafter_, capacity, *tree_, trees_);
    return std::make_unique<Eagle3Session>(drafter_, capacity);
  }

 private:
  const Eagle3Drafter* drafter_;
  int32_t block_size_;
  std::optional<Eagle3TreeOptions> tree_;
  std::vector<Eagle3Tree>* trees_;
};

}  // namespace

std::unique_ptr<BlockDrafter> MakeBlockDrafter(const Eagle3Drafter* drafter, int32_t block_size) {
  return std::make_unique<Eagle3BlockDrafter>(drafter, block_size, std::nullopt, nullptr);
}

std::unique_ptr<BlockDrafter> MakeTreeBlockDrafter(const Eagle3Drafter* drafter,
                                                   const Eagle3TreeOptions& options,
                                                   std::vector<Eagle3Tree>* trees) {
  return std::make_unique<Eagle3BlockDrafter>(drafter, options.depth + 1, options, trees);
}

namespace {

// EAGLE-3 behind the seam (registry.h).
class Eagle3FamilyDrafter : public Eagle3BasedDrafter {
 public:
  Eagle3FamilyDrafter(std::unique_ptr<Eagle3Drafter> drafter, const std::string& dir,
                      std::string config_json)
      : Eagle3BasedDrafter(std::move(drafter), dir, std::move(config_json)) {
    spec_.method = "eagle3";
    spec_.tree = kTreeEagle;
    spec_.autoregressive = true;
  }
  std::unique_ptr<BlockDrafter> Chain() override {
    return MakeBlockDrafter(drafter_.get(), spec_.block_size);
  }
  std::unique_ptr<BlockDrafter> Tree(const TreeSettings& trees, int32_t budget,
                                     std::vector<DraftTree>* record) override {
    return MakeTreeBlockDrafter(drafter_.get(), Eagle3TreeOptions{trees.depth, trees.top_k, budget},
                                record);
  }
};

}  // namespace

Eagle3BasedDrafter::Eagle3BasedDrafter(std::unique_ptr<Eagle3Drafter> drafter,
                                       const std::string& dir, std::string config_json)
    : drafter_(std::move(drafter)) {
  const Eagle3Config& c = drafter_->config();
  DrafterSpec& s = spec_;
  s.path = dir;
  s.config_json = std::move(config_json);
  s.format = Eagle3FormatName(c.format);
  s.uses_mask_token = false;
  s.mask_token_id = 0;
  s.needs_target_head = !drafter_->has_own_embedding();
  s.last_layer_is_final_norm = false;  // the last layer's output, as vLLM and SGLang capture it
  s.block_size = c.drafts() + 1;       // speculators' speculative_tokens, else the default
  s.num_layers = c.layers.num_layers;
  s.hidden_size = c.layers.hidden_size;
  s.target_hidden_size = c.target_hidden_size;
  s.vocab_size = c.layers.vocab_size;
  s.dtype = ScalarTypeName(drafter_->dtype());
  s.device = drafter_->device().str();
}

at::ScalarType Eagle3BasedDrafter::dtype() const { return drafter_->dtype(); }

const at::Device& Eagle3BasedDrafter::device() const { return drafter_->device(); }

absl::Status Eagle3BasedDrafter::FitTargetLayers(int64_t target_layers) {
  Eagle3Config& c = drafter_->mutable_config();
  absl::Status fit = c.ResolveTargetLayers(target_layers);
  if (!fit.ok()) return absl::FailedPreconditionError(fit.message());
  spec_.target_layer_ids = c.target_layer_ids;
  spec_.fc_in_features = static_cast<int64_t>(c.target_layer_ids.size()) * c.target_hidden_size;
  return absl::OkStatus();
}

absl::Status Eagle3BasedDrafter::SetTargetHead(const at::Tensor& embed_tokens,
                                               const at::Tensor& lm_head) {
  (void)lm_head;  // the head is its own (draft vocabulary)
  return drafter_->SetTargetEmbedding(embed_tokens);
}

absl::StatusOr<std::optional<std::string>> Eagle3FormatOf(
    absl::StatusOr<std::optional<Eagle3Format>> detected) {
  if (!detected.ok()) return detected.status();
  if (!*detected) return std::optional<std::string>();
  return std::optional<std::string>(Eagle3FormatName(**detected));
}

const DrafterFamily& Eagle3Family() {
  static const DrafterFamily f{"eagle3", "EAGLE-3 (speculators and SpecForge formats)",
                               &DetectEagle3Based<&DetectEagle3>,
                               &LoadEagle3Based<Eagle3FamilyDrafter>};
  return f;
}

}  // namespace specwire
