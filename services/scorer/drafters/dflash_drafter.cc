#include "services/scorer/drafters/dflash_drafter.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <tuple>

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
#include "services/scorer/drafters/vocab_map.h"

namespace specwire {
namespace {

using json = nlohmann::json;

// The reader of a value of config.json looked up the way dflash's `_draft_value` does:
// dflash_config first (when it holds the key, even as null), then the top level. A key found in
// neither is reported as dflash_config.<name>.
JsonReader DraftScope(const JsonReader& root, const JsonReader& dflash_config, const char* name) {
  if (dflash_config.raw().contains(name)) return dflash_config;
  return root.Has(name) ? root : dflash_config;
}

}  // namespace

int64_t DrafterConfig::target_hidden_size() const { return layers.hidden_size; }

bool DrafterConfig::LayerIsCausal(int64_t layer) const {
  if (is_causal.has_value()) return *is_causal;
  return layers.layer_types[layer] == LayerType::kSlidingAttention;
}

int64_t DrafterConfig::LayerWindow(int64_t layer) const {
  return layers.layer_types[layer] == LayerType::kSlidingAttention ? layers.sliding_window : 0;
}

std::vector<int64_t> BuildTargetLayerIds(int64_t num_target_layers, int64_t num_draft_layers) {
  if (num_draft_layers == 1) return {num_target_layers / 2};
  const double start = 1, end = static_cast<double>(num_target_layers - 3), span = end - start;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < num_draft_layers; ++i) {
    // Python's round() rounds half to even, as nearbyint does in the default rounding mode.
    ids.push_back(static_cast<int64_t>(
        std::nearbyint(start + (static_cast<double>(i) * span) / (num_draft_layers - 1))));
  }
  return ids;
}

namespace {

absl::Status CheckDFlash2Config(const DrafterConfig& d, const JsonReader& where) {
  if (!d.dflash2) return absl::OkStatus();
  const int64_t h = d.layers.hidden_size;
  if (d.conv_kernel_size < 1 || d.conv_kernel_size > d.block_size) {
    return where.Error("conv_kernel_size", absl::StrCat("is ", d.conv_kernel_size,
                                                        "; it must be in [1, block_size ",
                                                        d.block_size, "]"));
  }
  if (d.conv_group_size < 1 || h % d.conv_group_size != 0) {
    return where.Error("conv_group_size", absl::StrCat("is ", d.conv_group_size,
                                                       "; it must divide hidden_size ", h));
  }
  if (d.selector_rank < 1) return where.Error("selector_rank", "must be positive");
  if (d.selector_top_k < 1 || d.selector_top_k > d.layers.vocab_size) {
    return where.Error("selector_top_k", absl::StrCat("is ", d.selector_top_k,
                                                      "; it must be in [1, vocab_size ",
                                                      d.layers.vocab_size, "]"));
  }
  return absl::OkStatus();
}

// speculators' DFlash (speculators_model_type "dflash"): the same body as z-lab's under another
// config layout (speculators/models/dflash/config.py).
absl::StatusOr<DrafterConfig> ParseSpeculatorsDFlash(const json& doc, const std::string& source) {
  const JsonReader root(doc, source);
  DrafterConfig d;
  d.format = "speculators";
  d.last_layer_is_final_norm = false;
  d.window_from_anchor = true;
  SW_ASSIGN_OR_RETURN(JsonReader tl, root.Object("transformer_layer_config"));
  SW_ASSIGN_OR_RETURN(d.layers, ParseModelConfig(tl.raw().dump(),
                                                 absl::StrCat(source, " transformer_layer_config")));
  if (d.layers.family != ModelFamily::kQwen3) {
    return tl.Error("model_type", absl::StrCat("is \"", d.layers.model_type,
                                               "\"; DFlash drafters are Qwen3 layers"));
  }
  SW_ASSIGN_OR_RETURN(const bool use_sliding_window, tl.Bool("use_sliding_window", false));
  const json& tj = tl.raw();
  if (!use_sliding_window || (tj.contains("sliding_window") && tj.at("sliding_window").is_null())) {
    d.layers.sliding_window = 0;
  }
  SW_ASSIGN_OR_RETURN(const int64_t block, root.Int("block_size", 8));
  if (block < 2 || block > 4096) return root.Error("block_size", "must be in [2, 4096]");
  d.block_size = static_cast<int32_t>(block);
  if (!root.Has("mask_token_id")) return root.Error("mask_token_id", "is required but missing");
  SW_ASSIGN_OR_RETURN(d.mask_token_id, root.Int("mask_token_id"));
  if (d.mask_token_id < 0) return root.Error("mask_token_id", "must be non-negative");
  if (!root.Has("aux_hidden_state_layer_ids")) {
    return root.Error("aux_hidden_state_layer_ids",
                      "is missing (speculators resolves it from the verifier when it saves; a "
                      "checkpoint without it names no target layers)");
  }
  SW_ASSIGN_OR_RETURN(std::vector<int64_t> ids, root.IntList("aux_hidden_state_layer_ids"));
  if (ids.empty()) return root.Error("aux_hidden_state_layer_ids", "must not be empty");
  for (int64_t k : ids) {
    if (k < 1) {
      return root.Error("aux_hidden_state_layer_ids",
                        absl::StrCat("holds ", k, "; HF hidden-state indices of layers start at 1 "
                                                  "(index 0, the embedding output, is not a layer)"));
    }
    d.target_layer_ids.push_back(k - 1);
  }
  SW_ASSIGN_OR_RETURN(d.draft_vocab_size, root.Int("draft_vocab_size", 32000));
  if (d.draft_vocab_size <= 0 || d.draft_vocab_size > d.layers.vocab_size) {
    return root.Error("draft_vocab_size",
                      absl::StrCat("is ", d.draft_vocab_size, "; it must be in [1, vocab_size ",
                                   d.layers.vocab_size, "]"));
  }
  if (d.draft_vocab_size == d.layers.vocab_size) d.draft_vocab_size = 0;
  d.dspark = doc["speculators_model_type"] == "dspark";
  d.xpress = doc["speculators_model_type"] == "xpress";
  // speculators' default: DSpark samples from the anchor, DFlash and XPress do not.
  SW_ASSIGN_OR_RETURN(d.sample_from_anchor, root.Bool("sample_from_anchor", d.dspark));
  if (d.sample_from_anchor && !d.dspark && !d.xpress) {
    return root.Error("sample_from_anchor",
                      "is true: slot 0 of the block predicts too, which neither the replay nor "
                      "vLLM's DFlash verification reads (a DSpark checkpoint says "
                      "speculators_model_type \"dspark\")");
  }
  d.dflash2 = doc["speculators_model_type"] == "dflash2";
  // DFlash2 trains sliding layers bidirectional unless the checkpoint says otherwise.
  SW_ASSIGN_OR_RETURN(const bool non_causal,
                      root.Bool("sliding_window_non_causal", d.dflash2));
  if (non_causal) d.is_causal = false;  // sliding layers bidirectional; full layers always are
  if (d.dflash2) {
    if (d.draft_vocab_size != 0) {
      return root.Error("draft_vocab_size", "must equal vocab_size for DFlash2 (its selector "
                                            "scores the whole vocabulary)");
    }
    for (const auto& [key, out, dflt] :
         {std::tuple<const char*, int64_t*, int64_t>{"conv_kernel_size", &d.conv_kernel_size, 2},
          {"conv_group_size", &d.conv_group_size, 16},
          {"selector_rank", &d.selector_rank, 256},
          {"selector_top_k", &d.selector_top_k, 16}}) {
      SW_ASSIGN_OR_RETURN(*out, root.Int(key, dflt));
    }
  }
  SW_RETURN_IF_ERROR(CheckDFlash2Config(d, root));
  return d;
}

}  // namespace

absl::StatusOr<DrafterConfig> ParseDrafterConfig(const std::string& json_text,
                                                 const std::string& source) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  if (doc.contains("speculators_model_type")) {
    const json& t = doc["speculators_model_type"];
    if (!t.is_string() || (t != "dflash" && t != "dflash2" && t != "dspark" && t != "xpress")) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": key \"speculators_model_type\" is ", t.dump(),
          "; a drafter on DFlash's backbone in speculators' format says \"dflash\", "
          "\"dflash2\", \"dspark\" or \"xpress\""));
    }
    return ParseSpeculatorsDFlash(doc, source);
  }
  DrafterConfig d;
  // The drafter's own layers are Qwen3 layers, read by the target's config parser unchanged
  // (rope types, YaRN included, are common/models/rope.cc's).
  SW_ASSIGN_OR_RETURN(d.layers, ParseModelConfig(json_text, source));
  const JsonReader root(doc, source);
  if (d.layers.family != ModelFamily::kQwen3) {
    return root.Error("model_type",
                      absl::StrCat("is \"", d.layers.model_type,
                                   "\"; DFlash drafters are Qwen3 layers (model_type \"qwen3\")"));
  }
  // transformers' Qwen3Config: `sliding_window = sliding_window if use_sliding_window else None`.
  SW_ASSIGN_OR_RETURN(const bool use_sliding_window, root.Bool("use_sliding_window", false));
  const bool window_null = doc.contains("sliding_window") && doc.at("sliding_window").is_null();
  if (!use_sliding_window || window_null) d.layers.sliding_window = 0;

  static const json kNoDflashConfig = json::object();
  JsonReader dflash(kNoDflashConfig, source, PathStyle::kDotted, "dflash_config");
  if (root.Has("dflash_config")) {
    SW_ASSIGN_OR_RETURN(dflash, root.Object("dflash_config"));
  }

  const JsonReader mask_scope = DraftScope(root, dflash, "mask_token_id");
  if (!mask_scope.Has("mask_token_id")) {
    return mask_scope.Error("mask_token_id", "is required but missing");
  }
  auto mask = mask_scope.Int("mask_token_id");
  if (!mask.ok() || *mask < 0) {
    return mask_scope.Error("mask_token_id",
                            absl::StrCat("must be a non-negative integer, got ",
                                         mask_scope.Find("mask_token_id")->dump()));
  }
  d.mask_token_id = *mask;

  const JsonReader block_scope = DraftScope(root, dflash, "block_size");
  if (block_scope.Has("block_size")) {
    auto block = block_scope.Int("block_size");
    if (!block.ok() || *block < 2 || *block > 4096) {
      return block_scope.Error("block_size", absl::StrCat("must be an integer in [2, 4096], got ",
                                                          block_scope.Find("block_size")->dump()));
    }
    d.block_size = static_cast<int32_t>(*block);
  }

  // dflash reads num_target_layers from the top level only.
  if (root.Has("num_target_layers")) {
    auto n = root.Int("num_target_layers");
    if (!n.ok() || *n <= 0) {
      return root.Error("num_target_layers", absl::StrCat("must be a positive integer, got ",
                                                          root.Find("num_target_layers")->dump()));
    }
    d.num_target_layers = *n;
  }

  const JsonReader ids_scope = DraftScope(root, dflash, "target_layer_ids");
  const std::string ids_key = ids_scope.PathOf("target_layer_ids");
  if (ids_scope.Has("target_layer_ids")) {
    const json& ids = *ids_scope.Find("target_layer_ids");
    if (!ids.is_array() || ids.empty()) {
      return ids_scope.Error("target_layer_ids", "must be a non-empty list of layer ids");
    }
    auto list = ids_scope.IntList("target_layer_ids");
    if (!list.ok() || std::any_of(list->begin(), list->end(), [](int64_t v) { return v < 0; })) {
      return ids_scope.Error("target_layer_ids",
                             absl::StrCat("must hold non-negative integers, got ", ids.dump()));
    }
    d.target_layer_ids = *list;
  } else if (d.num_target_layers > 0) {
    d.target_layer_ids = BuildTargetLayerIds(d.num_target_layers, d.layers.num_layers);
  } else {
    return ids_scope.Error("target_layer_ids",
                           "is missing, and num_target_layers is not given to derive it from");
  }
  if (d.num_target_layers > 0) {
    for (int64_t id : d.target_layer_ids) {
      if (id >= d.num_target_layers) {
        return ids_scope.Error("target_layer_ids",
                               absl::StrCat("holds layer ", id, ", outside the target's ",
                                            d.num_target_layers, " layers (num_target_layers)"));
      }
    }
  }

  if (root.Has("is_causal")) {
    SW_ASSIGN_OR_RETURN(d.is_causal, root.Bool("is_causal", false));
  }

  for (const auto& [name, out, dflt] :
       {std::tuple<const char*, double*, double>{"input_embedding_scale", &d.input_embedding_scale,
                                                 1.0},
        {"output_multiplier", &d.output_multiplier, 1.0},
        {"final_logit_softcapping", &d.final_logit_softcapping, 0.0}}) {
    SW_ASSIGN_OR_RETURN(*out, DraftScope(root, dflash, name).Double(name, dflt));
  }
  if (d.final_logit_softcapping < 0) d.final_logit_softcapping = 0;
  if (doc.contains("architectures") && doc["architectures"].is_array()) {
    for (const json& a : doc["architectures"]) {
      d.dflash2 |= a.is_string() && a == "DFlash2DraftModel";
      d.dspark |= a.is_string() && a == "DSparkDraftModel";
      d.domino |= a.is_string() && a == "DominoDraftModel";
    }
  }
  // SpecForge's DSpark: DFlash's config with dflash_config.projector_type "dspark".
  if (dflash.Has("projector_type")) {
    SW_ASSIGN_OR_RETURN(const std::string projector, dflash.String("projector_type"));
    d.dspark |= projector == "dspark";
    d.domino |= projector == "domino";
  }
  // SpecForge trains DSpark the DeepSpec way (OnlineDSparkModel: row k of the block predicts
  // the token k + 1 after the anchor, its previous token the one at k), so every slot drafts.
  // (Its spec_generate reads rows 1 .. B − 1 with the anchor before row 1: not how it trains.)
  if (d.dspark) d.sample_from_anchor = true;
  if (d.dflash2) {
    for (const auto& [key, out] :
         {std::pair<const char*, int64_t*>{"conv_kernel_size", &d.conv_kernel_size},
          {"conv_group_size", &d.conv_group_size},
          {"selector_rank", &d.selector_rank},
          {"selector_top_k", &d.selector_top_k}}) {
      const JsonReader scope = DraftScope(root, dflash, key);
      if (!scope.Has(key)) {
        return scope.Error(key, "is required for a DFlash2DraftModel but missing");
      }
      SW_ASSIGN_OR_RETURN(*out, scope.Int(key));
    }
    SW_RETURN_IF_ERROR(CheckDFlash2Config(d, root));
  }
  return d;
}

absl::Status CheckDrafterFitsTarget(const DrafterConfig& drafter, const ModelConfig& target) {
  if (drafter.target_hidden_size() != target.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter hidden_size ", drafter.target_hidden_size(), " != target hidden_size ",
        target.hidden_size, " (the drafter uses the target's embedding, lm_head and features)"));
  }
  if (drafter.num_target_layers > 0 && drafter.num_target_layers != target.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "drafter num_target_layers ", drafter.num_target_layers, " != target num_hidden_layers ",
        target.num_layers, ": the drafter was trained for another target"));
  }
  for (int64_t id : drafter.target_layer_ids) {
    if (id >= target.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("drafter target_layer_ids holds ", id,
                                                     ", outside the target's ", target.num_layers,
                                                     " layers"));
    }
  }
  if (drafter.mask_token_id >= target.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("drafter mask_token_id ", drafter.mask_token_id,
                                                   " is outside the target vocabulary (",
                                                   target.vocab_size, ")"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// The model.

struct DFlashDrafter::Impl {
  struct Layer {
    at::Tensor input_norm, post_norm, q_norm, k_norm;  // [H], [H], [D], [D]
    // [(Hq + 2 Hkv) D, H]: rows [q | k | v]; the bias only with attention_bias.
    at::Tensor qkv_w, qkv_b;
    at::Tensor kv_w, kv_b;  // views of the k and v rows (context rows need no query)
    at::Tensor o_w, o_b;    // [H, Hq D]
    at::Tensor qk_norm;     // [Hq + Hkv, D]: q_norm per query head, then k_norm per kv head
    at::Tensor gate_up_w;   // [2 I, H]: rows [gate | up]
    // DFlash2's convolutions: base kernels [2, K, H] (input side, output side) and the dynamic
    // coefficients' projection [2 K G, H], for the attention and the MLP sublayer.
    at::Tensor attn_base, attn_kp, mlp_base, mlp_kp;
    at::Tensor down_w;      // [H, I]
    // Loading slots (released after fusion).
    at::Tensor q_w, k_w, v_w, q_b, k_b, v_b, gate_w, up_w;
    bool causal = false;
    int64_t window = 0;  // 0: unlimited
  };

  DrafterConfig config;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::unique_ptr<Checkpoint> checkpoint;  // CPU weights of matching dtype alias its mapping
  at::Tensor fc_w;                         // [H, n H]
  at::Tensor hidden_norm;                  // [H]
  at::Tensor norm;                         // [H]
  std::vector<Layer> layers;
  at::Tensor embed_tokens, lm_head;  // the target's, [V, H] (lm_head: the drafter's own [Vd, H]
                                     // with a draft vocabulary)
  at::Tensor own_lm_head;            // [Vd, H] when the checkpoint has a draft vocabulary
  at::Tensor target_index;           // [Vd] target id of each draft id
  at::Tensor mask_embedding;         // [1, H]: a view of embed_tokens[mask_token_id]
  at::Tensor inv_freq;               // [rotary_dim / 2] fp32 CPU
  at::Tensor sel_proj, sel_pred, sel_succ;  // DFlash2's selector: [r, H], [V, r], [V, r]
  double attention_scaling = 1.0;

  int64_t H() const { return config.layers.hidden_size; }
  int64_t D() const { return config.layers.head_dim; }
  int64_t Hq() const { return config.layers.num_heads; }
  int64_t Hkv() const { return config.layers.num_kv_heads; }
  int64_t I() const { return config.layers.intermediate_size; }
  double eps() const { return config.layers.rms_norm_eps; }

  // Every tensor of the checkpoint, with its expected shape: drives loading and validation.
  void ForEachWeight(const WeightVisitor& visit) {
    const int64_t h = H(), q_out = Hq() * D(), kv_out = Hkv() * D();
    const int64_t n = static_cast<int64_t>(config.target_layer_ids.size());
    visit({"fc.weight", {h, n * config.target_hidden_size()}, &fc_w});
    visit({"hidden_norm.weight", {h}, &hidden_norm});
    visit({"norm.weight", {h}, &norm});
    for (size_t i = 0; i < layers.size(); ++i) {
      Layer& l = layers[i];
      const std::string p = absl::StrCat("layers.", i, ".");
      visit({p + "input_layernorm.weight", {h}, &l.input_norm});
      visit({p + "post_attention_layernorm.weight", {h}, &l.post_norm});
      visit({p + "self_attn.q_proj.weight", {q_out, h}, &l.q_w});
      visit({p + "self_attn.k_proj.weight", {kv_out, h}, &l.k_w});
      visit({p + "self_attn.v_proj.weight", {kv_out, h}, &l.v_w});
      visit({p + "self_attn.o_proj.weight", {h, q_out}, &l.o_w});
      if (config.layers.attention_bias) {
        visit({p + "self_attn.q_proj.bias", {q_out}, &l.q_b});
        visit({p + "self_attn.k_proj.bias", {kv_out}, &l.k_b});
        visit({p + "self_attn.v_proj.bias", {kv_out}, &l.v_b});
        visit({p + "self_attn.o_proj.bias", {h}, &l.o_b});
      }
      visit({p + "self_attn.q_norm.weight", {D()}, &l.q_norm});
      visit({p + "self_attn.k_norm.weight", {D()}, &l.k_norm});
      visit({p + "mlp.gate_proj.weight", {I(), h}, &l.gate_w});
      visit({p + "mlp.up_proj.weight", {I(), h}, &l.up_w});
      visit({p + "mlp.down_proj.weight", {h, I()}, &l.down_w});
      if (config.dflash2) {
        const int64_t K = config.conv_kernel_size, G = h / config.conv_group_size;
        visit({p + "attention_conv.base_kernel", {2, K, h}, &l.attn_base});
        visit({p + "attention_conv.kernel_projection.weight", {2 * K * G, h}, &l.attn_kp});
        visit({p + "mlp_conv.base_kernel", {2, K, h}, &l.mlp_base});
        visit({p + "mlp_conv.kernel_projection.weight", {2 * K * G, h}, &l.mlp_kp});
      }
    }
    if (config.dflash2) {
      const int64_t r = config.selector_rank, V = config.layers.vocab_size;
      visit({"candidate_selector.hidden_projection.weight", {r, h}, &sel_proj});
      // Saved without ".weight" (speculators, z-lab's published checkpoints) or with it.
      for (const auto& [name, slot] : {std::pair<const char*, at::Tensor*>{"predecessor_codebook", &sel_pred},
                                       {"successor_codebook", &sel_succ}}) {
        const std::string bare = absl::StrCat("candidate_selector.", name);
        const bool suffixed = checkpoint && checkpoint->Find(bare) == nullptr &&
                              checkpoint->Find(bare + ".weight") != nullptr;
        visit({suffixed ? bare + ".weight" : bare, {V, r}, slot});
      }
    }
  }

  // DFlash2's grouped dynamic causal convolution over the block (dflash's
  // _grouped_dynamic_convolve): x [R, q, H], delta [R, q, K, G], base [K, H]; tap τ reads the
  // position τ before (zero before the block's start).
  at::Tensor DynamicConv(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& base) const {
    const int64_t R = x.size(0), q = x.size(1), h = x.size(2);
    const int64_t gs = config.conv_group_size, G = h / gs;
    at::Tensor blocks = x.view({R, q, G, gs});
    at::Tensor out = at::zeros_like(blocks);
    for (int64_t tau = 0; tau < base.size(0); ++tau) {
      at::Tensor values = blocks;
      if (tau > 0) {
        values = at::zeros_like(blocks);
        if (tau < q) values.narrow(1, tau, q - tau).copy_(blocks.narrow(1, 0, q - tau));
      }
      out = out + base[tau].view({1, 1, G, gs}) * values;
      out = at::addcmul(out, delta.select(2, tau).unsqueeze(-1), values);
    }
    return out.view_as(x);
  }

  void Prepare() {
    auto to_dev = [&](at::Tensor& t) {
      if (t.defined()) t = t.to(device, dtype).contiguous();
    };
    to_dev(fc_w);
    to_dev(hidden_norm);
    to_dev(norm);
    to_dev(sel_proj);
    to_dev(sel_pred);
    to_dev(sel_succ);
    const int64_t q_out = Hq() * D(), kv_out = Hkv() * D();
    for (Layer& l : layers) {
      l.qkv_w = at::cat({l.q_w, l.k_w, l.v_w}, 0).to(device, dtype).contiguous();
      l.kv_w = l.qkv_w.narrow(0, q_out, 2 * kv_out);
      if (l.q_b.defined()) {
        l.qkv_b = at::cat({l.q_b, l.k_b, l.v_b}, 0).to(device, dtype).contiguous();
        l.kv_b = l.qkv_b.narrow(0, q_out, 2 * kv_out);
      }
      l.gate_up_w = at::cat({l.gate_w, l.up_w}, 0).to(device, dtype).contiguous();
      l.q_w = l.k_w = l.v_w = l.q_b = l.k_b = l.v_b = l.gate_w = l.up_w = at::Tensor();
      for (at::Tensor* t : {&l.input_norm, &l.post_norm, &l.q_norm, &l.k_norm, &l.o_w, &l.o_b,
                            &l.down_w, &l.attn_base, &l.attn_kp, &l.mlp_base, &l.mlp_kp}) {
        to_dev(*t);
      }
      // One norm + rotation pass over the query and key heads of the block (elementwise, so
      // the same numbers as two passes).
      l.qk_norm = at::cat({l.q_norm.unsqueeze(0).expand({Hq(), D()}),
                           l.k_norm.unsqueeze(0).expand({Hkv(), D()})},
                          0)
                      .contiguous();
    }
  }

  // cos and sin for integer positions [...] → [..., rotary_dim] in the compute dtype, as
  // Qwen3RotaryEmbedding computes them: fp32 position × inv_freq, cos/sin scaled by
  // attention_scaling, then rounded.
  std::pair<at::Tensor, at::Tensor> CosSin(const std::vector<int64_t>& positions,
                                           at::IntArrayRef shape) const {
    at::Tensor pos = at::tensor(positions, at::kLong).to(at::kFloat).view(shape).unsqueeze(-1);
    at::Tensor freqs = pos * inv_freq;  // [..., rot / 2]
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    return {(emb.cos() * attention_scaling).to(device, dtype),
            (emb.sin() * attention_scaling).to(device, dtype)};
  }
};

DFlashDrafter::DFlashDrafter() : impl_(std::make_unique<Impl>()) {}
DFlashDrafter::~DFlashDrafter() = default;

const DrafterConfig& DFlashDrafter::config() const { return impl_->config; }
at::ScalarType DFlashDrafter::dtype() const { return impl_->dtype; }
const at::Device& DFlashDrafter::device() const { return impl_->device; }
const at::Tensor& DFlashDrafter::inv_freq() const { return impl_->inv_freq; }
double DFlashDrafter::attention_scaling() const { return impl_->attention_scaling; }

absl::StatusOr<std::unique_ptr<DFlashDrafter>> DFlashDrafter::Load(const std::string& dir,
                                                                   at::ScalarType dtype,
                                                                   const at::Device& device) {
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  SW_ASSIGN_OR_RETURN(DrafterConfig config, ParseDrafterConfig(config_file.text, config_file.path));
  std::unique_ptr<DFlashDrafter> drafter(new DFlashDrafter());
  Impl& m = *drafter->impl_;
  m.config = std::move(config);
  m.dtype = dtype;
  m.device = device;
  SW_ASSIGN_OR_RETURN(m.checkpoint, Checkpoint::Open(dir));
  m.layers.resize(m.config.layers.num_layers);
  for (int64_t i = 0; i < m.config.layers.num_layers; ++i) {
    m.layers[i].causal = m.config.LayerIsCausal(i);
    m.layers[i].window = m.config.LayerWindow(i);
  }

  absl::Status status = RunGuarded("loading drafter " + dir, [&]() -> absl::Status {
    std::set<std::string> consumed;
    SW_RETURN_IF_ERROR(LoadDraftWeights(
        *m.checkpoint, dir, "drafter", [&](const WeightVisitor& v) { m.ForEachWeight(v); },
        dtype, consumed,
        [&](const WeightSlot& slot, const std::string& got, const std::string& want) {
          if (slot.name != "fc.weight") return std::string();
          return absl::StrCat(config_file.path, ": key \"dflash_config.target_layer_ids\" has ",
                              m.config.target_layer_ids.size(), " entries, so fc.weight must be ",
                              want, " (", m.config.target_layer_ids.size(), " x hidden_size ",
                              m.H(), " inputs), but the checkpoint has ", got);
        }));
    if (m.config.draft_vocab_size > 0) {
      const int64_t Vd = m.config.draft_vocab_size;
      const TensorView* head = m.checkpoint->Find("lm_head.weight");
      if (head == nullptr || !IsFloat(head->dtype) ||
          head->shape != std::vector<int64_t>{Vd, m.H()}) {
        return absl::InvalidArgumentError(absl::StrCat(
            dir, ": draft_vocab_size ", Vd, " needs tensor \"lm_head.weight\" as a float [", Vd,
            ", ", m.H(), "]", head == nullptr ? " (missing)" : ""));
      }
      m.own_lm_head = WrapView(*head).to(device, dtype).contiguous();
      consumed.insert("lm_head.weight");
      SW_ASSIGN_OR_RETURN(std::vector<int64_t> targets,
                          ReadDraftVocabulary(*m.checkpoint, dir, Vd, m.config.layers.vocab_size,
                                              consumed));
      m.target_index = at::tensor(targets, at::kLong).to(device);
    }
    for (const auto& [name, view] : m.checkpoint->tensors()) {
      if (consumed.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
      if (m.config.dspark &&
          (name.starts_with("markov_head.") || name.starts_with("confidence_head."))) {
        continue;  // DSpark's heads: dspark_drafter.cc checks them
      }
      if (m.config.xpress && name.starts_with("refiner_head.")) {
        continue;  // XPress's refiner: xpress_drafter.cc checks it
      }
      if (m.config.domino && (name.starts_with("prefix_gru.") || name.starts_with("embed_proj.") ||
                              name.starts_with("logit_head."))) {
        continue;  // Domino's correction: domino_drafter.cc checks it
      }
      const bool dflash2 = !m.config.dflash2 &&
                           (name.find("attention_conv") != std::string::npos ||
                            name.find("mlp_conv") != std::string::npos ||
                            name.starts_with("candidate_selector."));
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected tensor \"", name, "\" in drafter ", dir,
          dflash2
              ? ": DFlash2 weights in a checkpoint that does not declare DFlash2 (architectures "
                "[\"DFlash2DraftModel\"] or speculators_model_type \"dflash2\")"
              : ": a DFlash drafter has no such weight"));
    }
    m.Prepare();
    const RotaryEmbedding rope(m.config.layers.rope, m.config.layers.head_dim);
    m.inv_freq = rope.inv_freq();
    m.attention_scaling = rope.attention_scaling();
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return drafter;
}

absl::Status DFlashDrafter::SetTargetHead(const at::Tensor& embed_tokens,
                                          const at::Tensor& lm_head) {
  Impl& m = *impl_;
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{"embed_tokens", embed_tokens},
        {"lm_head", lm_head}}) {
    if (!t.defined() || t.dim() != 2 || t.size(1) != m.H()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target ", name, " must be [vocab, ", m.H(), "] (the drafter's hidden_size), got ",
          t.defined() ? absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]") : "nothing"));
    }
  }
  if (embed_tokens.size(0) != lm_head.size(0)) {
    return absl::InvalidArgumentError("target embed_tokens and lm_head have different vocab sizes");
  }
  if (m.config.mask_token_id >= embed_tokens.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat("mask_token_id ", m.config.mask_token_id,
                                                   " is outside the target embedding (",
                                                   embed_tokens.size(0), " rows)"));
  }
  return RunGuarded("setting the target head", [&]() -> absl::Status {
    m.embed_tokens = embed_tokens.to(m.device, m.dtype);
    m.lm_head = m.own_lm_head.defined() ? m.own_lm_head : lm_head.to(m.device, m.dtype);
    m.mask_embedding = m.embed_tokens.narrow(0, m.config.mask_token_id, 1);
    return absl::OkStatus();
  });
}

std::unique_ptr<DraftCache> DFlashDrafter::NewCache(int64_t capacity) const {
  auto cache = std::make_unique<DraftCache>();
  EnsureCapacity(*cache, std::max<int64_t>(capacity, impl_->config.block_size));
  return cache;
}

void DFlashDrafter::EnsureCapacity(DraftCache& cache, int64_t needed) const {
  if (needed <= cache.capacity_) return;
  const Impl& m = *impl_;
  const int64_t cap = std::max<int64_t>(needed, cache.capacity_ * 2);
  GrowKv(cache.k_, cache.v_, m.layers.size(), m.Hkv(), m.D(), cache.length_, cap,
         at::TensorOptions().dtype(m.dtype).device(m.device));
  cache.capacity_ = cap;
}

void DFlashDrafter::AppendContext(DraftCache& cache, const at::Tensor& features) const {
  AppendContext(std::vector<DraftCache*>{&cache}, std::vector<at::Tensor>{features});
}

void DFlashDrafter::AppendContext(const std::vector<DraftCache*>& caches,
                                  const std::vector<at::Tensor>& features) const {
  const Impl& m = *impl_;
  c10::InferenceMode guard;
  TORCH_CHECK(caches.size() == features.size(), "one feature tensor per cache");
  std::vector<at::Tensor> rows;
  std::vector<int64_t> positions;
  for (size_t r = 0; r < caches.size(); ++r) {
    const at::Tensor& f = features[r];
    TORCH_CHECK(f.dim() == 2 && f.size(1) == m.fc_w.size(1), "context features must be [n, ",
                m.fc_w.size(1), "], got ", f.sizes());
    const int64_t L = caches[r]->length_, n = f.size(0);
    EnsureCapacity(*caches[r], L + n + m.config.block_size);
    if (n == 0) continue;
    rows.push_back(f.to(m.device, m.dtype));
    for (int64_t i = 0; i < n; ++i) positions.push_back(L + i);
  }
  if (positions.empty()) return;
  const int64_t N = static_cast<int64_t>(positions.size());
  // Context rows: fc then hidden_norm (no input_layernorm: they are not run through the layers).
  at::Tensor ctx = RmsNorm(at::linear(rows.size() == 1 ? rows[0] : at::cat(rows, 0), m.fc_w),
                           m.hidden_norm, m.eps(), NormKind::kPlain);  // [N, H]
  auto [cos, sin] = m.CosSin(positions, {N, 1});                       // [N, 1, rot]
  const int64_t kv_out = m.Hkv() * m.D();
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const Impl::Layer& layer = m.layers[l];
    at::Tensor kv = at::linear(ctx, layer.kv_w, layer.kv_b);  // [N, 2 Hkv D]
    at::Tensor k =
        RotaryEmbedding::Apply(RmsNorm(kv.narrow(-1, 0, kv_out).view({N, m.Hkv(), m.D()}),
                                       layer.k_norm, m.eps(), NormKind::kPlain),
                               cos, sin);  // [N, Hkv, D]
    at::Tensor v = kv.narrow(-1, kv_out, kv_out).view({N, m.Hkv(), m.D()});
    int64_t offset = 0;
    for (size_t r = 0; r < caches.size(); ++r) {
      const int64_t n = features[r].size(0);
      if (n == 0) continue;
      DraftCache& c = *caches[r];
      c.k_[l].narrow(2, c.length_, n).copy_(k.narrow(0, offset, n).transpose(0, 1).unsqueeze(0));
      c.v_[l].narrow(2, c.length_, n).copy_(v.narrow(0, offset, n).transpose(0, 1).unsqueeze(0));
      offset += n;
    }
  }
  for (size_t r = 0; r < caches.size(); ++r) caches[r]->length_ += features[r].size(0);
}

at::Tensor DFlashDrafter::DraftHidden(DraftCache& cache, int64_t anchor_token, int64_t start,
                                      int64_t len) const {
  return DraftHidden(std::vector<DraftCache*>{&cache}, {anchor_token}, {start}, len).squeeze(0);
}

at::Tensor DFlashDrafter::DraftHidden(const std::vector<DraftCache*>& caches,
                                      const std::vector<int64_t>& anchor_tokens,
                                      const std::vector<int64_t>& starts, int64_t len) const {
  const Impl& m = *impl_;
  c10::InferenceMode guard;
  const int64_t R = static_cast<int64_t>(caches.size());
  const int64_t q_len = len > 0 ? len : m.config.block_size;
  TORCH_CHECK(m.embed_tokens.defined(), "DraftBlock before SetTargetHead");
  TORCH_CHECK(R >= 1 && anchor_tokens.size() == caches.size() && starts.size() == caches.size(),
              "one anchor and one start per cache");
  TORCH_CHECK(q_len >= 1, "block length must be positive");
  std::vector<int64_t> positions;
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(caches[r]->length_ == starts[r], "the draft cache holds ", caches[r]->length_,
                " context rows but the block starts at ", starts[r]);
    TORCH_CHECK(anchor_tokens[r] >= 0 && anchor_tokens[r] < m.embed_tokens.size(0), "anchor token ",
                anchor_tokens[r], " outside the vocabulary");
    EnsureCapacity(*caches[r], starts[r] + q_len);
    for (int64_t i = 0; i < q_len; ++i) positions.push_back(starts[r] + i);
  }

  // Blocks [anchor, MASK × (len − 1)] through the target's embedding (F.embedding × scale).
  at::Tensor anchors =
      at::index_select(m.embed_tokens, 0, at::tensor(anchor_tokens, at::kLong).to(m.device));
  at::Tensor x =
      at::cat({anchors.unsqueeze(1), m.mask_embedding.unsqueeze(0).expand({R, q_len - 1, m.H()})},
              1);  // [R, q, H]
  if (m.config.input_embedding_scale != 1.0) x = x * m.config.input_embedding_scale;
  auto [cos, sin] = m.CosSin(positions, {R, 1, q_len});  // [R, 1, q, rot]: broadcast over heads

  const int64_t q_out = m.Hq() * m.D(), kv_out = m.Hkv() * m.D();
  const double scale = 1.0 / std::sqrt(static_cast<double>(m.D()));
  // A mask depends on (causal, window, context keys in range) only: built once per call.
  std::map<std::tuple<bool, int64_t, int64_t>, at::Tensor> masks;
  auto mask_for = [&](bool causal, int64_t window, int64_t ctx_keys) -> std::optional<at::Tensor> {
    if (!causal && window == 0) return std::nullopt;  // every key visible
    auto [it, inserted] = masks.try_emplace({causal, window, ctx_keys});
    if (inserted) {
      // Query i sits ctx_keys + i after the first key in range; key j at j.
      auto lopts = at::TensorOptions().dtype(at::kLong).device(m.device);
      at::Tensor qpos = at::arange(ctx_keys, ctx_keys + q_len, lopts).unsqueeze(1);  // [q, 1]
      at::Tensor kpos = at::arange(0, ctx_keys + q_len, lopts).unsqueeze(0);         // [1, S]
      at::Tensor diff = qpos - kpos;                                                 // q − k
      at::Tensor mask = causal ? diff >= 0 : at::ones_like(diff, at::kBool);
      if (window > 0) {
        mask.logical_and_(diff < window);
        if (!causal) mask.logical_and_(diff > -window);
      }
      it->second = mask;
    }
    return it->second;
  };

  std::vector<at::Tensor> outs(R);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const Impl::Layer& layer = m.layers[l];
    // --- attention: queries from the block, keys/values from [context ; block] ---
    at::Tensor n = RmsNorm(x, layer.input_norm, m.eps(), NormKind::kPlain);  // [R, q, H]
    at::Tensor attn_delta;  // DFlash2: the output side's dynamic coefficients
    if (m.config.dflash2) {
      const int64_t K = m.config.conv_kernel_size, G = m.H() / m.config.conv_group_size;
      at::Tensor delta = at::linear(n, layer.attn_kp).view({R, q_len, 2, K, G});
      n = m.DynamicConv(n, delta.select(2, 0), layer.attn_base[0]);
      attn_delta = delta.select(2, 1);
    }
    at::Tensor qkv = at::linear(n, layer.qkv_w, layer.qkv_b);                // [R, q, (Hq+2Hkv) D]
    at::Tensor qk = RotaryEmbedding::Apply(
        RmsNorm(qkv.narrow(-1, 0, q_out + kv_out).view({R, q_len, m.Hq() + m.Hkv(), m.D()}),
                layer.qk_norm, m.eps(), NormKind::kPlain)
            .transpose(1, 2),
        cos, sin);  // [R, Hq+Hkv, q, D]
    at::Tensor v = qkv.narrow(-1, q_out + kv_out, kv_out)
                       .view({R, q_len, m.Hkv(), m.D()})
                       .transpose(1, 2);  // [R, Hkv, q, D]
    for (int64_t r = 0; r < R; ++r) {
      DraftCache& c = *caches[r];
      const int64_t start = starts[r];
      // Block K/V go into the scratch rows after the context; the next AppendContext
      // overwrites them, so the cache keeps context K/V only (dflash's crop(start)).
      c.k_[l].narrow(2, start, q_len).copy_(qk.narrow(0, r, 1).narrow(1, m.Hq(), m.Hkv()));
      c.v_[l].narrow(2, start, q_len).copy_(v.narrow(0, r, 1));
      // Keys further back than the window are invisible to every query of the block.
      // speculators: the `window` context positions before the anchor, for every query.
      const bool from_anchor = m.config.window_from_anchor && layer.window > 0;
      const int64_t lo = layer.window > 0
                             ? std::max<int64_t>(0, start - layer.window + (from_anchor ? 0 : 1))
                             : 0;
      const int64_t S = start + q_len - lo;
      outs[r] = at::scaled_dot_product_attention(
          qk.narrow(0, r, 1).narrow(1, 0, m.Hq()), c.k_[l].narrow(2, lo, S),
          c.v_[l].narrow(2, lo, S),
          mask_for(layer.causal, from_anchor ? 0 : layer.window, start - lo), 0.0, false, scale,
          /*enable_gqa=*/m.Hq() != m.Hkv());  // [1, Hq, q, D]
    }
    at::Tensor attn =
        (R == 1 ? outs[0] : at::cat(outs, 0)).transpose(1, 2).reshape({R, q_len, q_out});
    at::Tensor o = at::linear(attn, layer.o_w, layer.o_b);
    if (m.config.dflash2) o = m.DynamicConv(o, attn_delta, layer.attn_base[1]);
    at::Tensor h = x + o;

    // --- MLP (SwiGLU) ---
    at::Tensor mm = RmsNorm(h, layer.post_norm, m.eps(), NormKind::kPlain);
    at::Tensor mlp_delta;
    if (m.config.dflash2) {
      const int64_t K = m.config.conv_kernel_size, G = m.H() / m.config.conv_group_size;
      at::Tensor delta = at::linear(mm, layer.mlp_kp).view({R, q_len, 2, K, G});
      mm = m.DynamicConv(mm, delta.select(2, 0), layer.mlp_base[0]);
      mlp_delta = delta.select(2, 1);
    }
    at::Tensor gu = at::linear(mm, layer.gate_up_w);  // [R, q, 2 I]
    at::Tensor act = at::silu(gu.narrow(-1, 0, m.I())) * gu.narrow(-1, m.I(), m.I());
    at::Tensor down = at::linear(act, layer.down_w);
    if (m.config.dflash2) down = m.DynamicConv(down, mlp_delta, layer.mlp_base[1]);
    h.add_(down);
    x = h;
  }
  return RmsNorm(x, m.norm, m.eps(), NormKind::kPlain);  // [R, q, H]
}

at::Tensor DFlashDrafter::Logits(const at::Tensor& hidden) const {
  return ToTargetVocabulary(HeadLogits(hidden));
}

at::Tensor DFlashDrafter::HeadLogits(const at::Tensor& hidden) const {
  const Impl& m = *impl_;
  c10::InferenceMode guard;
  at::Tensor logits = at::linear(hidden, m.lm_head);
  if (m.config.output_multiplier != 1.0) logits = logits * m.config.output_multiplier;
  if (m.config.final_logit_softcapping > 0) {
    const double cap = m.config.final_logit_softcapping;
    logits = at::tanh(logits / cap) * cap;
  }
  return logits.to(at::kFloat);
}

int64_t DFlashDrafter::output_vocab_size() const {
  const DrafterConfig& c = impl_->config;
  return c.draft_vocab_size > 0 ? c.draft_vocab_size : c.layers.vocab_size;
}

const Checkpoint& DFlashDrafter::checkpoint() const { return *impl_->checkpoint; }

at::Tensor DFlashDrafter::ToTargetVocabulary(const at::Tensor& head_logits) const {
  const Impl& m = *impl_;
  c10::InferenceMode guard;
  const at::Tensor& logits = head_logits;
  if (!m.target_index.defined()) return logits;
  // A draft vocabulary: target-vocabulary logits, −inf outside it (argmax, top-k and softmax
  // then read the draft tokens only, in ascending target order as in the draft vocabulary).
  std::vector<int64_t> shape(logits.sizes().begin(), logits.sizes().end());
  shape.back() = m.config.layers.vocab_size;
  return at::full(shape, -std::numeric_limits<float>::infinity(), logits.options())
      .index_copy(-1, m.target_index, logits);
}

std::vector<int64_t> DFlashDrafter::SelectPath(const at::Tensor& hidden, const at::Tensor& logits,
                                               int64_t anchor, std::span<const int64_t> given,
                                               at::Tensor* scores) const {
  const Impl& m = *impl_;
  TORCH_CHECK(m.config.dflash2, "SelectPath: not a DFlash2 drafter");
  c10::InferenceMode guard;
  auto [unary, cand] = at::topk(logits.to(m.dtype), m.config.selector_top_k, -1, true,
                                /*sorted=*/false);
  at::Tensor proj = at::linear(hidden.to(m.dtype), m.sel_proj);  // [n, r]
  const int64_t n = hidden.size(0);
  if (scores != nullptr) {
    *scores = at::full({n, logits.size(-1)}, -std::numeric_limits<float>::infinity(),
                       logits.options().dtype(at::kFloat));
  }
  std::vector<int64_t> path;
  int64_t pred = anchor;
  for (int64_t t = 0; t < n; ++t) {
    if (t > 0 && t - 1 < static_cast<int64_t>(given.size()) && given[t - 1] >= 0) {
      pred = given[t - 1];
    }
    at::Tensor context = m.sel_pred[pred] * proj[t];                            // [r]
    at::Tensor succ = m.sel_succ.index_select(0, cand[t]);                      // [k, r]
    at::Tensor s = unary[t] + (succ * context.unsqueeze(0)).sum(-1);            // [k]
    if (scores != nullptr) (*scores)[t].index_copy_(0, cand[t], s.to(at::kFloat));
    pred = cand[t][s.argmax().item<int64_t>()].item<int64_t>();
    path.push_back(pred);
  }
  return path;
}

at::Tensor DFlashDrafter::DraftBlock(DraftCache& cache, int64_t anchor_token, int64_t start,
                                     int64_t len) const {
  at::Tensor hidden = DraftHidden(cache, anchor_token, start, len);  // [q, H]
  return Logits(hidden.narrow(0, 1, hidden.size(0) - 1));
}

namespace {

// DFlash2's drafts of one block, from its final-normed hidden states [len, H] (slot 0 the
// anchor's): the selector's path.
std::vector<int64_t> DFlash2Path(const DFlashDrafter& d, const at::Tensor& hidden, int64_t anchor) {
  at::Tensor drafts = hidden.narrow(0, 1, hidden.size(0) - 1);
  return d.SelectPath(drafts, d.Logits(drafts), anchor);
}

// DFlash2's proposal logits of one block (SelectPath's scores; their argmax rows are the path
// where `given` is the path), and the path.
at::Tensor SelectorLogits(const DFlashDrafter& d, const at::Tensor& hidden, int64_t anchor,
                          std::span<const int64_t> given, std::vector<int64_t>* path) {
  at::Tensor drafts = hidden.narrow(0, 1, hidden.size(0) - 1);
  at::Tensor scores;
  *path = d.SelectPath(drafts, d.Logits(drafts), anchor, given, &scores);
  return scores;
}

class DFlashSession : public DraftSession {
 public:
  DFlashSession(const DFlashDrafter* drafter, int64_t capacity)
      : drafter_(drafter), cache_(drafter->NewCache(capacity)) {}
  void AppendContext(const at::Tensor& features, std::span<const int64_t>) override {
    drafter_->AppendContext(*cache_, features);
  }
  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                         std::span<const int64_t> given) override {
    hidden_ = drafter_->DraftHidden(*cache_, anchor, start, len);  // [len, H]
    if (drafter_->config().dflash2) return SelectorLogits(*drafter_, hidden_, anchor, given, &path_);
    return drafter_->Logits(hidden_.narrow(0, 1, hidden_.size(0) - 1));
  }
  std::map<std::string, at::Tensor> Inspect() const override {
    std::map<std::string, at::Tensor> out = {{"hidden", hidden_}};
    if (drafter_->config().dflash2) {
      const at::Tensor drafts = hidden_.narrow(0, 1, hidden_.size(0) - 1);
      out["block_logits"] = drafter_->Logits(drafts);  // the block's own, before the selector
      out["path"] = at::tensor(path_, at::kLong);
    }
    return out;
  }
  DraftCache* cache() { return cache_.get(); }

 private:
  const DFlashDrafter* drafter_;       // not owned
  std::unique_ptr<DraftCache> cache_;  // this response's context K/V
  at::Tensor hidden_;                  // the last block's final-normed states (Inspect)
  std::vector<int64_t> path_;          // DFlash2: the last block's selector path
};

class DFlashBlockDrafter : public BlockDrafter {
 public:
  explicit DFlashBlockDrafter(const DFlashDrafter* drafter) : drafter_(drafter) {}
  int32_t block_size() const override { return drafter_->config().block_size; }
  // DFlash2's selector scores each position from its predecessor.
  bool conditions_on_drafts() const override { return drafter_->config().dflash2; }
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return std::make_unique<DFlashSession>(drafter_, capacity);
  }

  void AppendContext(const std::vector<DraftSession*>& sessions,
                     const std::vector<at::Tensor>& features,
                     const std::vector<std::vector<int64_t>>&) override {
    drafter_->AppendContext(Caches(sessions), features);
  }

  at::Tensor DraftLogits(const std::vector<DraftSession*>& sessions,
                         const std::vector<int64_t>& anchors, const std::vector<int64_t>& starts,
                         int64_t len) override {
    at::Tensor hidden = drafter_->DraftHidden(Caches(sessions), anchors, starts, len);
    if (drafter_->config().dflash2) {
      std::vector<at::Tensor> rows;
      std::vector<int64_t> path;
      for (size_t r = 0; r < sessions.size(); ++r) {
        rows.push_back(SelectorLogits(*drafter_, hidden[r], anchors[r], {}, &path));
      }
      return at::stack(rows);
    }
    return drafter_->Logits(hidden.narrow(1, 1, len - 1));  // [R, len − 1, V]
  }

  std::vector<int64_t> AcceptedDrafts(const std::vector<DraftSession*>& sessions,
                                      const std::vector<int64_t>& anchors,
                                      const std::vector<int64_t>& starts, int64_t len,
                                      const std::vector<std::vector<int64_t>>& truths) override {
    const int64_t R = static_cast<int64_t>(sessions.size());
    if (drafter_->config().dflash2) {  // the selector's path, left to right
      at::Tensor hidden = drafter_->DraftHidden(Caches(sessions), anchors, starts, len);
      std::vector<int64_t> accepted(R, 0);
      for (int64_t r = 0; r < R; ++r) {
        const std::vector<int64_t> path = DFlash2Path(*drafter_, hidden[r], anchors[r]);
        while (accepted[r] < len - 1 && path[accepted[r]] == truths[r][accepted[r]]) ++accepted[r];
      }
      return accepted;
    }
    at::Tensor drafts = drafter_->DraftHidden(Caches(sessions), anchors, starts, len)
                            .narrow(1, 1, len - 1);  // [R, len − 1, H]
    std::vector<int64_t> accepted(R, 0);
    std::vector<int64_t> alive(R);  // blocks whose drafts matched so far
    std::iota(alive.begin(), alive.end(), 0);
    // Rows in chunks of 1, 2, 4, ...: at most ~2a + 1 rows of logits for a accepted drafts.
    for (int64_t row = 0, chunk = 1; row < len - 1 && !alive.empty(); row += chunk, chunk *= 2) {
      const int64_t n = std::min(chunk, len - 1 - row);
      at::Tensor rows = drafts.narrow(1, row, n);  // [R, n, H]
      if (static_cast<int64_t>(alive.size()) < R) {
        rows = at::index_select(rows, 0, at::tensor(alive, at::kLong).to(rows.device()));
      }
      at::Tensor ids = drafter_->Logits(rows).argmax(-1).to(at::kCPU).contiguous();  // [A, n]
      const int64_t* d = ids.data_ptr<int64_t>();
      std::vector<int64_t> still;
      for (size_t a = 0; a < alive.size(); ++a) {
        const int64_t r = alive[a];
        int64_t i = 0;
        while (i < n && d[a * n + i] == truths[r][row + i]) ++i;
        accepted[r] += i;
        if (i == n) still.push_back(r);
      }
      alive = std::move(still);
    }
    return accepted;
  }

 private:
  static std::vector<DraftCache*> Caches(const std::vector<DraftSession*>& sessions) {
    std::vector<DraftCache*> caches;
    for (DraftSession* s : sessions) caches.push_back(static_cast<DFlashSession*>(s)->cache());
    return caches;
  }

  const DFlashDrafter* drafter_;  // not owned
};

}  // namespace

std::unique_ptr<BlockDrafter> MakeBlockDrafter(const DFlashDrafter* drafter) {
  return std::make_unique<DFlashBlockDrafter>(drafter);
}

namespace {

// The DrafterSpec fields every family on this backbone shares with DFlash.
DrafterSpec BackboneSpec(const DFlashDrafter& drafter, const std::string& dir,
                         std::string config_json) {
  const DrafterConfig& c = drafter.config();
  DrafterSpec s;
  s.path = dir;
  s.config_json = std::move(config_json);
  s.format = c.format;
  s.uses_mask_token = true;
  s.last_layer_is_final_norm = c.last_layer_is_final_norm;
  s.block_size = c.block_size;
  s.num_layers = c.layers.num_layers;
  s.hidden_size = c.layers.hidden_size;
  s.target_hidden_size = c.target_hidden_size();
  s.fc_in_features = static_cast<int64_t>(c.target_layer_ids.size()) * c.target_hidden_size();
  s.num_target_layers = c.num_target_layers;
  s.target_layer_ids = c.target_layer_ids;
  s.mask_token_id = c.mask_token_id;
  s.vocab_size = c.layers.vocab_size;
  s.dtype = ScalarTypeName(drafter.dtype());
  s.device = drafter.device().str();
  return s;
}

class HeadsFamilyDrafter : public Drafter {
 public:
  HeadsFamilyDrafter(std::unique_ptr<BackboneHeads> heads, DrafterSpec spec)
      : heads_(std::move(heads)), spec_(std::move(spec)) {}
  const DrafterSpec& spec() const override { return spec_; }
  at::ScalarType dtype() const override { return heads_->backbone().dtype(); }
  const at::Device& device() const override { return heads_->backbone().device(); }
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override {
    return heads_->SetTargetHead(embed_tokens, lm_head);
  }
  std::unique_ptr<BlockDrafter> Chain() override { return MakeHeadsBlockDrafter(heads_.get()); }

 private:
  std::unique_ptr<BackboneHeads> heads_;
  DrafterSpec spec_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Drafter>> MakeHeadsFamilyDrafter(
    const std::string& dir, absl::StatusOr<std::unique_ptr<BackboneHeads>> heads,
    std::string method, std::string format, std::string tree) {
  if (!heads.ok()) return heads.status();
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  DrafterSpec spec = BackboneSpec((*heads)->backbone(), dir, std::move(config_file.text));
  spec.method = std::move(method);
  spec.format = std::move(format);
  spec.tree = std::move(tree);
  spec.block_size = (*heads)->block_size();
  return std::unique_ptr<Drafter>(new HeadsFamilyDrafter(*std::move(heads), std::move(spec)));
}

namespace {

// One response's drafting by a BackboneHeads family: the backbone's context cache.
class HeadsSession : public DraftSession {
 public:
  HeadsSession(const BackboneHeads* heads, int64_t capacity)
      : heads_(heads), cache_(heads->backbone().NewCache(capacity)) {}
  void AppendContext(const at::Tensor& features, std::span<const int64_t> next_tokens) override {
    heads_->backbone().AppendContext(*cache_, features);
    Record(next_tokens);
  }
  // The token before the next anchor: the next token of the context's last row but one.
  void Record(std::span<const int64_t> next_tokens) {
    for (const int64_t t : next_tokens) {
      before_anchor_ = last_next_;
      last_next_ = t;
    }
  }
  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                         std::span<const int64_t> given) override {
    const DFlashDrafter& b = heads_->backbone();
    hidden_ = b.DraftHidden(*cache_, anchor, start, heads_->Slots(len));
    block_ = heads_->Heads(hidden_, anchor, before_anchor_, given);
    return b.ToTargetVocabulary(block_.logits);
  }
  int64_t AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                         const std::vector<int64_t>& truth) override {
    const DFlashDrafter& b = heads_->backbone();
    hidden_ = b.DraftHidden(*cache_, anchor, start, heads_->Slots(len));
    std::vector<int64_t> drafts;
    block_ = heads_->Heads(hidden_, anchor, before_anchor_, {}, &drafts);  // its own drafts
    int64_t a = 0;
    while (a < len - 1 && drafts[a] == truth[a]) ++a;
    return a;
  }
  at::Tensor PredictedAcceptance() const override { return block_.confidence; }
  std::map<std::string, at::Tensor> Inspect() const override {
    std::map<std::string, at::Tensor> out = {{"hidden", hidden_},
                                             {"head_logits", block_.logits}};
    if (block_.confidence.defined()) out["confidence"] = block_.confidence;
    return out;
  }
  DraftCache* cache() { return cache_.get(); }

 private:
  const BackboneHeads* heads_;         // not owned
  std::unique_ptr<DraftCache> cache_;  // this response's context K/V
  at::Tensor hidden_;                  // the last block's slots (Inspect)
  BackboneHeads::Block block_;         // the last block's heads
  int64_t last_next_ = -1, before_anchor_ = -1;
};

class HeadsBlockDrafter : public BlockDrafter {
 public:
  explicit HeadsBlockDrafter(const BackboneHeads* heads) : heads_(heads) {}
  int32_t block_size() const override { return heads_->block_size(); }
  bool conditions_on_drafts() const override { return heads_->conditions_on_drafts(); }
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return std::make_unique<HeadsSession>(heads_, capacity);
  }
  // One context projection for all sessions; blocks are drafted per session (the heads walk
  // each block position by position).
  void AppendContext(const std::vector<DraftSession*>& sessions,
                     const std::vector<at::Tensor>& features,
                     const std::vector<std::vector<int64_t>>& next_tokens) override {
    std::vector<DraftCache*> caches;
    for (size_t i = 0; i < sessions.size(); ++i) {
      auto* s = static_cast<HeadsSession*>(sessions[i]);
      caches.push_back(s->cache());
      if (i < next_tokens.size()) s->Record(next_tokens[i]);
    }
    heads_->backbone().AppendContext(caches, features);
  }

 private:
  const BackboneHeads* heads_;  // not owned
};

}  // namespace

std::unique_ptr<BlockDrafter> MakeHeadsBlockDrafter(const BackboneHeads* heads) {
  return std::make_unique<HeadsBlockDrafter>(heads);
}

namespace {

// DFlash and DFlash2 behind the seam (registry.h).
class DFlashFamilyDrafter : public Drafter {
 public:
  DFlashFamilyDrafter(std::unique_ptr<DFlashDrafter> drafter, const std::string& dir,
                      std::string config_json)
      : drafter_(std::move(drafter)) {
    const DrafterConfig& c = drafter_->config();
    spec_ = BackboneSpec(*drafter_, dir, std::move(config_json));
    spec_.method = c.dflash2 ? "dflash2" : "dflash";
    spec_.tree = c.dflash2 ? "" : kTreeDDTree;  // DFlash2's selector walks one path
  }
  const DrafterSpec& spec() const override { return spec_; }
  at::ScalarType dtype() const override { return drafter_->dtype(); }
  const at::Device& device() const override { return drafter_->device(); }
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override {
    return drafter_->SetTargetHead(embed_tokens, lm_head);
  }
  std::unique_ptr<BlockDrafter> Chain() override { return MakeBlockDrafter(drafter_.get()); }
  const DFlashDrafter& drafter() const { return *drafter_; }

 private:
  std::unique_ptr<DFlashDrafter> drafter_;
  DrafterSpec spec_;
};

bool NamesArchitecture(const json& config, const char* name) {
  if (!config.contains("architectures") || !config["architectures"].is_array()) return false;
  for (const json& a : config["architectures"]) {
    if (a.is_string() && a == name) return true;
  }
  return false;
}

// The projector a SpecForge / z-lab dflash_config names ("dspark", "domino": other families
// built on DFlash), "" when none.
std::string Projector(const json& config) {
  if (!config.contains("dflash_config") || !config["dflash_config"].is_object()) return "";
  const json& p = config["dflash_config"].value("projector_type", json());
  return p.is_string() ? p.get<std::string>() : "";
}

absl::StatusOr<std::optional<std::string>> DetectDFlash(const json& config, const std::string&) {
  if (config.contains("speculators_model_type")) {
    return config["speculators_model_type"] == "dflash" ? std::optional<std::string>("speculators")
                                                         : std::nullopt;
  }
  if (NamesArchitecture(config, "DFlash2DraftModel") || NamesArchitecture(config, "DSparkDraftModel") ||
      NamesArchitecture(config, "DominoDraftModel")) {
    return std::optional<std::string>();
  }
  const std::string projector = Projector(config);
  if (!projector.empty() && projector != "dflash") return std::optional<std::string>();
  // z-lab's (and SpecForge's) DFlashDraftModel: a Qwen3 config with a block size, the DFlash keys
  // in dflash_config or at the top level.
  if (NamesArchitecture(config, "DFlashDraftModel") || config.contains("dflash_config") ||
      config.contains("block_size")) {
    return std::optional<std::string>("z-lab");
  }
  return std::optional<std::string>();
}

absl::StatusOr<std::optional<std::string>> DetectDFlash2(const json& config, const std::string&) {
  if (config.contains("speculators_model_type")) {
    return config["speculators_model_type"] == "dflash2" ? std::optional<std::string>("speculators")
                                                          : std::nullopt;
  }
  if (NamesArchitecture(config, "DFlash2DraftModel")) return std::optional<std::string>("z-lab");
  return std::optional<std::string>();
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadDFlashFamily(const std::string& dir,
                                                          const std::string&, at::ScalarType dtype,
                                                          const at::Device& device) {
  return MakeFamilyDrafter<DFlashFamilyDrafter>(dir, DFlashDrafter::Load(dir, dtype, device));
}

}  // namespace

const DrafterFamily& DFlashFamily() {
  static const DrafterFamily f{"dflash", "DFlash (z-lab, SpecForge and speculators formats)",
                               &DetectDFlash, &LoadDFlashFamily};
  return f;
}

const DrafterFamily& DFlash2Family() {
  static const DrafterFamily f{"dflash2", "DFlash2 (z-lab and speculators formats)",
                               &DetectDFlash2, &LoadDFlashFamily};
  return f;
}

}  // namespace specwire
