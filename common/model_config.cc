#include "common/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/enum_names.h"
#include "common/json_reader.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using json = nlohmann::json;

// Typed access to config keys with error messages naming the file and key.
using Keys = JsonReader;

struct FamilyInfo {
  const char* model_type;
  ModelFamily family;
  const char* architecture;
};
constexpr FamilyInfo kFamilies[] = {
    {"llama", ModelFamily::kLlama, "LlamaForCausalLM"},
    {"qwen2", ModelFamily::kQwen2, "Qwen2ForCausalLM"},
    {"qwen3", ModelFamily::kQwen3, "Qwen3ForCausalLM"},
    {"qwen3_5_text", ModelFamily::kQwen3_5, "Qwen3_5ForCausalLM"},
};

constexpr EnumName<LayerType> kLayerTypeNames[] = {
    {LayerType::kFullAttention, "full_attention"},
    {LayerType::kSlidingAttention, "sliding_attention"},
    {LayerType::kLinearAttention, "linear_attention"}};

absl::StatusOr<LayerType> ParseLayerType(const std::string& s) {
  if (std::optional<LayerType> t = ValueOf(kLayerTypeNames, s)) return *t;
  return absl::InvalidArgumentError(absl::StrCat("unknown layer type \"", s, "\" (expected one of ",
                                                 NamesOf(kLayerTypeNames, ", "), ")"));
}

// transformers' get_mscale (YaRN's attention factor).
double YarnMscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// rope_parameters (v5) or rope_scaling (v4) plus top-level rope_theta / partial_rotary_factor,
// with transformers' precedence (PreTrainedConfig.standardize_rope_params): values inside the
// dict win over top-level keys, except original_max_position_embeddings, where a top-level key
// wins for the types that use it (llama3, yarn).
//
// `partial_rotary` says whether the family's attention rotates part of a head: Qwen3.5 does
// (default 0.25); Llama, Qwen2 and Qwen3 rotate the whole head in their default rope (their
// compute_default_rope_parameters never reads partial_rotary_factor, so the key is ignored
// there), and their apply_rotary_pos_emb cannot apply a partial rotation at all, so a scaled
// rope with partial_rotary_factor < 1 fails in transformers: it is refused here.
absl::Status ParseRope(const Keys& top, ModelConfig& c, bool partial_rotary) {
  // transformers (convert_rope_params_to_dict): `rope_scaling or rope_parameters`, so a
  // non-empty rope_scaling wins and an empty one gives way.
  std::optional<JsonReader> dict;
  const char* dict_key = nullptr;
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    if (!top.Has(k)) continue;
    SW_ASSIGN_OR_RETURN(JsonReader r, top.Object(k));
    if (r.size() == 0 && std::string(k) == "rope_scaling" && top.Has("rope_parameters")) continue;
    dict = r;
    dict_key = k;
    break;
  }
  if (dict.has_value()) {
    // One dict per layer type ({"full_attention": {...}, "sliding_attention": {...}}).
    for (const char* nested : {"full_attention", "sliding_attention", "linear_attention"}) {
      if (dict->raw().contains(nested) && dict->raw().at(nested).is_object()) {
        return top.Error(dict_key, absl::StrCat("holds one rope per layer type (\"", nested,
                                                "\"), which is not supported (one dict for "
                                                "every layer)"));
      }
    }
  }
  double default_partial = partial_rotary ? 0.25 : 1.0;
  // Qwen3.5 with `"partial_rotary_factor": null` at the top level: transformers' setdefault keeps
  // the None and its rope code reads `.get("partial_rotary_factor", 1.0)`: the whole head turns.
  if (partial_rotary && top.raw().contains("partial_rotary_factor") &&
      top.raw().at("partial_rotary_factor").is_null()) {
    default_partial = 1.0;
  }
  SW_ASSIGN_OR_RETURN(c.rope.theta, top.Double("rope_theta", 10000.0));
  SW_ASSIGN_OR_RETURN(c.rope.partial_rotary_factor,
                      top.Double("partial_rotary_factor", default_partial));
  std::optional<double> omax;
  std::optional<double> yarn_factor, mscale, mscale_all_dim, attention_factor;
  if (dict.has_value()) {
    const JsonReader& r = *dict;
    // rope_parameters.setdefault("rope_type", rope_parameters.get("type", "default")).
    SW_ASSIGN_OR_RETURN(c.rope.type, r.String("type", "default"));
    SW_ASSIGN_OR_RETURN(c.rope.type, r.String("rope_type", c.rope.type));
    if (c.rope.type.empty()) return r.Error("rope_type", "is empty");
    SW_ASSIGN_OR_RETURN(c.rope.theta, r.Double("rope_theta", c.rope.theta));
    SW_ASSIGN_OR_RETURN(c.rope.partial_rotary_factor,
                        r.Double("partial_rotary_factor", c.rope.partial_rotary_factor));
    SW_ASSIGN_OR_RETURN(yarn_factor, r.OptionalDouble("factor"));
    if (yarn_factor.has_value()) c.rope.factor = *yarn_factor;
    SW_ASSIGN_OR_RETURN(c.rope.low_freq_factor,
                        r.Double("low_freq_factor", c.rope.low_freq_factor));
    SW_ASSIGN_OR_RETURN(c.rope.high_freq_factor,
                        r.Double("high_freq_factor", c.rope.high_freq_factor));
    SW_ASSIGN_OR_RETURN(omax, r.OptionalDouble("original_max_position_embeddings"));
    SW_ASSIGN_OR_RETURN(attention_factor, r.OptionalDouble("attention_factor"));
    SW_ASSIGN_OR_RETURN(mscale, r.OptionalDouble("mscale"));
    SW_ASSIGN_OR_RETURN(mscale_all_dim, r.OptionalDouble("mscale_all_dim"));
    // `rope_parameters.get("beta_fast") or 32`: absent, null or 0 mean the default.
    SW_ASSIGN_OR_RETURN(double beta_fast, r.Double("beta_fast", 0));
    SW_ASSIGN_OR_RETURN(double beta_slow, r.Double("beta_slow", 0));
    if (beta_fast != 0) c.rope.beta_fast = beta_fast;
    if (beta_slow != 0) c.rope.beta_slow = beta_slow;
    // `rope_parameters.get("truncate", True)`: a null truncate is falsy, no rounding.
    if (r.raw().contains("truncate") && r.raw().at("truncate").is_null()) {
      c.rope.truncate = false;
    } else {
      SW_ASSIGN_OR_RETURN(c.rope.truncate, r.Bool("truncate", true));
    }
    // What transformers' rope functions read as rope_parameters_dict[key] (a KeyError there).
    const std::vector<const char*> required =
        c.rope.type == "linear" ? std::vector<const char*>{"factor"}
        : c.rope.type == "llama3"
            ? std::vector<const char*>{"factor", "low_freq_factor", "high_freq_factor"}
            : std::vector<const char*>{};
    for (const char* key : required) {
      if (!r.Has(key)) {
        return r.Error(key,
                       absl::StrCat("is required by rope_type \"", c.rope.type, "\" but missing"));
      }
    }
    if (r.Has("mrope_section")) {
      SW_ASSIGN_OR_RETURN(c.rope.mrope_section, r.IntList("mrope_section"));
    }
  }
  const char* where = dict_key ? dict_key : "rope_parameters";
  const bool scaled_by_context = c.rope.type == "llama3" || c.rope.type == "yarn";
  if (scaled_by_context && top.Has("original_max_position_embeddings")) {
    SW_ASSIGN_OR_RETURN(omax, top.Double("original_max_position_embeddings"));
    where = "original_max_position_embeddings";
  }
  c.rope.original_max_position_embeddings = c.max_position_embeddings;
  if (scaled_by_context && omax.has_value()) {
    // Checked before the conversion: a double outside int64's range does not convert.
    if (!(*omax >= 1 && *omax <= 9007199254740992.0 && std::floor(*omax) == *omax)) {
      return top.Error(where, absl::StrCat("original_max_position_embeddings ", *omax,
                                           " is not a positive integer"));
    }
    c.rope.original_max_position_embeddings = static_cast<int64_t>(*omax);
  }
  if (c.rope.type != "default" && c.rope.type != "linear" && c.rope.type != "llama3" &&
      c.rope.type != "yarn") {
    return top.Error(where, absl::StrCat("has rope_type \"", c.rope.type,
                                         "\", which is not supported (default, linear, llama3, "
                                         "yarn)"));
  }
  if (c.rope.type == "yarn") {
    // transformers' _compute_yarn_parameters: factor defaults to the context ratio, the
    // attention factor to get_mscale(factor) (or the mscale / mscale_all_dim ratio).
    if (!yarn_factor.has_value()) {
      c.rope.factor = static_cast<double>(c.max_position_embeddings) /
                      static_cast<double>(c.rope.original_max_position_embeddings);
    }
    if (attention_factor.has_value()) {
      c.rope.attention_factor = *attention_factor;
    } else if (mscale && *mscale != 0 && mscale_all_dim && *mscale_all_dim != 0) {
      c.rope.attention_factor =
          YarnMscale(c.rope.factor, *mscale) / YarnMscale(c.rope.factor, *mscale_all_dim);
    } else {
      c.rope.attention_factor = YarnMscale(c.rope.factor, 1.0);
    }
    if (!(c.rope.factor > 0)) return top.Error(where, "yarn rope needs factor > 0");
    if (!(c.rope.attention_factor > 0)) {
      return top.Error(where, "yarn rope needs attention_factor > 0");
    }
  }
  // Parameters the type does not use keep their defaults, so that equal ropes compare equal and
  // ModelConfigToJson, which writes only the used ones, round-trips.
  const RopeConfig plain;
  if (c.rope.type == "default") c.rope.factor = plain.factor;
  if (c.rope.type != "llama3") {
    c.rope.low_freq_factor = plain.low_freq_factor;
    c.rope.high_freq_factor = plain.high_freq_factor;
  }
  if (!scaled_by_context) c.rope.original_max_position_embeddings = c.max_position_embeddings;
  if (c.rope.type != "yarn") {
    c.rope.attention_factor = plain.attention_factor;
    c.rope.beta_fast = plain.beta_fast;
    c.rope.beta_slow = plain.beta_slow;
    c.rope.truncate = plain.truncate;
  }
  if (c.rope.type == "linear" && !(c.rope.factor > 0)) {
    return top.Error(where, "linear rope needs factor > 0");
  }
  if (c.rope.type == "llama3" && !(c.rope.factor > 0 && c.rope.low_freq_factor > 0 &&
                                   c.rope.high_freq_factor > c.rope.low_freq_factor)) {
    return top.Error(where, "llama3 rope needs factor > 0 and high_freq_factor > low_freq_factor");
  }
  if (!(c.rope.theta > 0)) return top.Error("rope_theta", "must be positive");
  if (!(c.rope.partial_rotary_factor > 0 && c.rope.partial_rotary_factor <= 1)) {
    return top.Error("partial_rotary_factor", "must be in (0, 1]");
  }
  if (!partial_rotary) {
    if (c.rope.type == "default") {
      c.rope.partial_rotary_factor = 1.0;  // never read by the family's default rope
    } else if (c.rope.partial_rotary_factor != 1.0) {
      return top.Error("partial_rotary_factor",
                       absl::StrCat("is ", c.rope.partial_rotary_factor, " with rope_type \"",
                                    c.rope.type, "\": ", c.model_type,
                                    " rotates the whole head, so transformers cannot run a "
                                    "partial rotation (supported: 1.0, or rope_type default, "
                                    "which ignores the key)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseEos(const Keys& k, ModelConfig& c) {
  SW_ASSIGN_OR_RETURN(c.eos_token_ids, k.IntOrIntList("eos_token_id"));
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseTextConfig(const json& root, absl::string_view source,
                                            const std::string& path) {
  Keys k(root, std::string(source), PathStyle::kDotted, path);
  ModelConfig c;
  SW_ASSIGN_OR_RETURN(c.model_type, k.String("model_type", ""));
  if (c.model_type.empty()) return k.Error("model_type", "is required but missing");
  // A text config nested in a VLM config may carry the VLM's model_type ("qwen3_5"); it means
  // the same text model.
  if (c.model_type == "qwen3_5" && !path.empty()) c.model_type = "qwen3_5_text";
  const FamilyInfo* info = nullptr;
  for (const auto& f : kFamilies) {
    if (c.model_type == f.model_type) info = &f;
  }
  if (info == nullptr) {
    return k.Error("model_type",
                   absl::StrCat("is \"", c.model_type,
                                "\", which is not supported (llama, qwen2, qwen3, qwen3_5, "
                                "qwen3_5_text)"));
  }
  c.family = info->family;
  c.architecture = info->architecture;
  const bool hybrid = c.family == ModelFamily::kQwen3_5;

  SW_ASSIGN_OR_RETURN(c.vocab_size, k.PositiveInt("vocab_size"));
  SW_ASSIGN_OR_RETURN(c.hidden_size, k.PositiveInt("hidden_size"));
  SW_ASSIGN_OR_RETURN(c.intermediate_size, k.PositiveInt("intermediate_size"));
  SW_ASSIGN_OR_RETURN(c.num_layers, k.PositiveInt("num_hidden_layers"));
  SW_ASSIGN_OR_RETURN(c.num_heads, k.PositiveInt("num_attention_heads"));
  SW_ASSIGN_OR_RETURN(c.num_kv_heads, k.Int("num_key_value_heads", c.num_heads));
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return k.Error("num_key_value_heads",
                   absl::StrCat("is ", c.num_kv_heads, "; it must divide num_attention_heads (",
                                c.num_heads, ")"));
  }
  // LlamaConfig.validate_architecture refuses this even when head_dim is given.
  if (c.family == ModelFamily::kLlama && c.hidden_size % c.num_heads != 0) {
    return k.Error("hidden_size",
                   absl::StrCat("is ", c.hidden_size, ", not a multiple of num_attention_heads (",
                                c.num_heads, "), which Llama requires"));
  }
  if (k.Has("per_layer_config")) {
    auto per_layer = k.Find("per_layer_config");
    if (!(per_layer->is_object() && per_layer->empty())) {
      return k.Error("per_layer_config", "is not supported (one configuration for every layer)");
    }
  }
  SW_ASSIGN_OR_RETURN(c.is_causal, k.Bool("is_causal", true));
  SW_ASSIGN_OR_RETURN(c.tie_last_hidden_states, k.Bool("tie_last_hidden_states", true));
  int64_t default_head_dim = c.hidden_size / c.num_heads;
  if (c.family == ModelFamily::kQwen3) default_head_dim = 128;
  if (hybrid) default_head_dim = 256;
  SW_ASSIGN_OR_RETURN(c.head_dim, k.Int("head_dim", default_head_dim));
  if (c.head_dim <= 0 || c.head_dim % 2 != 0) {
    return k.Error("head_dim", absl::StrCat("must be positive and even, got ", c.head_dim));
  }
  SW_ASSIGN_OR_RETURN(c.rms_norm_eps, k.Double("rms_norm_eps", 1e-6));
  SW_ASSIGN_OR_RETURN(c.tie_word_embeddings, k.Bool("tie_word_embeddings", false));
  // transformers' defaults: Llama 2048, Qwen2/Qwen3/Qwen3.5 32768.
  SW_ASSIGN_OR_RETURN(
      c.max_position_embeddings,
      k.Int("max_position_embeddings", c.family == ModelFamily::kLlama ? 2048 : 32768));
  if (c.max_position_embeddings <= 0) {
    return k.Error("max_position_embeddings",
                   absl::StrCat("must be positive, got ", c.max_position_embeddings));
  }
  SW_ASSIGN_OR_RETURN(std::string act, k.String("hidden_act", "silu"));
  if (act != "silu" && act != "swish") {  // ACT2FN: "swish" is the same SiLU
    return k.Error("hidden_act", absl::StrCat("is \"", act, "\"; only \"silu\" is supported"));
  }
  SW_ASSIGN_OR_RETURN(c.torch_dtype, k.String("torch_dtype", ""));
  if (c.torch_dtype.empty()) {
    SW_ASSIGN_OR_RETURN(c.torch_dtype, k.String("dtype", ""));
  }

  switch (c.family) {
    case ModelFamily::kLlama: {
      SW_ASSIGN_OR_RETURN(c.attention_bias, k.Bool("attention_bias", false));
      c.o_proj_bias = c.attention_bias;
      SW_ASSIGN_OR_RETURN(c.mlp_bias, k.Bool("mlp_bias", false));
      break;
    }
    case ModelFamily::kQwen2:
      c.attention_bias = true;
      break;
    case ModelFamily::kQwen3: {
      SW_ASSIGN_OR_RETURN(c.attention_bias, k.Bool("attention_bias", false));
      c.o_proj_bias = c.attention_bias;
      c.qk_norm = true;
      break;
    }
    case ModelFamily::kQwen3_5: {
      SW_ASSIGN_OR_RETURN(c.attention_bias, k.Bool("attention_bias", false));
      c.o_proj_bias = c.attention_bias;
      c.qk_norm = true;
      c.attn_output_gate = true;
      SW_ASSIGN_OR_RETURN(c.linear_conv_kernel_dim, k.Int("linear_conv_kernel_dim", 4));
      SW_ASSIGN_OR_RETURN(c.linear_key_head_dim, k.Int("linear_key_head_dim", 128));
      SW_ASSIGN_OR_RETURN(c.linear_value_head_dim, k.Int("linear_value_head_dim", 128));
      SW_ASSIGN_OR_RETURN(c.linear_num_key_heads, k.Int("linear_num_key_heads", 16));
      SW_ASSIGN_OR_RETURN(c.linear_num_value_heads, k.Int("linear_num_value_heads", 32));
      if (c.linear_num_key_heads <= 0 || c.linear_num_value_heads % c.linear_num_key_heads != 0) {
        return k.Error("linear_num_value_heads",
                       absl::StrCat("is ", c.linear_num_value_heads,
                                    "; it must be a multiple of linear_num_key_heads (",
                                    c.linear_num_key_heads, ")"));
      }
      break;
    }
  }

  SW_RETURN_IF_ERROR(ParseRope(k, c, /*partial_rotary=*/hybrid));
  // An odd int(head_dim × factor) = d rotates 2·ceil(d / 2) dims (transformers: inv_freq over
  // arange(0, d, 2), cos/sin of twice that width); YaRN's ramp over d // 2 then does not fit.
  const int64_t dim =
      static_cast<int64_t>(static_cast<double>(c.head_dim) * c.rope.partial_rotary_factor);
  if (dim <= 0 || c.rotary_dim() > c.head_dim || (dim % 2 != 0 && c.rope.type == "yarn")) {
    return k.Error("partial_rotary_factor",
                   absl::StrCat("gives the rotary dimension int(", c.head_dim, " x ",
                                c.rope.partial_rotary_factor, ") = ", dim,
                                dim <= 0 ? ", which rotates nothing"
                                         : ", which this rope type cannot rotate"));
  }

  // Layer schedule: explicit layer_types, else the family's rule.
  if (k.Has("layer_types")) {
    const json& lt = root.at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers) {
      return k.Error("layer_types", absl::StrCat("must be a list of num_hidden_layers (",
                                                 c.num_layers, ") strings"));
    }
    for (size_t i = 0; i < lt.size(); ++i) {
      if (!lt[i].is_string()) return k.Error("layer_types", "must hold strings");
      auto t = ParseLayerType(lt[i].get<std::string>());
      if (!t.ok()) return k.Error("layer_types", absl::StrCat("[", i, "]: ", t.status().message()));
      if (*t == LayerType::kLinearAttention && !hybrid) {
        return k.Error("layer_types", absl::StrCat("[", i, "] is linear_attention, which ",
                                                   c.model_type, " does not have"));
      }
      // LlamaModel never reads layer_types: every layer is full causal attention.
      if (c.family == ModelFamily::kLlama) *t = LayerType::kFullAttention;
      c.layer_types.push_back(*t);
    }
  } else if (hybrid) {
    SW_ASSIGN_OR_RETURN(int64_t interval, k.Int("full_attention_interval", 4));
    if (interval <= 0) return k.Error("full_attention_interval", "must be positive");
    for (int64_t i = 0; i < c.num_layers; ++i) {
      c.layer_types.push_back((i + 1) % interval ? LayerType::kLinearAttention
                                                 : LayerType::kFullAttention);
    }
  } else {
    // Qwen2/Qwen3: sliding window from layer max_window_layers on, only with use_sliding_window
    // and a window (Qwen2Config: `sliding_window if use_sliding_window else None`, then layers
    // slide where `sliding_window is not None`; an absent key is the default 4096).
    SW_ASSIGN_OR_RETURN(bool sliding, k.Bool("use_sliding_window", false));
    if (root.contains("sliding_window") && root.at("sliding_window").is_null()) sliding = false;
    SW_ASSIGN_OR_RETURN(int64_t max_window_layers, k.Int("max_window_layers", 28));
    for (int64_t i = 0; i < c.num_layers; ++i) {
      c.layer_types.push_back(sliding && c.family != ModelFamily::kLlama && i >= max_window_layers
                                  ? LayerType::kSlidingAttention
                                  : LayerType::kFullAttention);
    }
  }
  // The window, as transformers' Qwen2/Qwen3 configs set it: `sliding_window` only counts with
  // use_sliding_window (and a null window means none). Without a window (sliding_window 0),
  // layers typed sliding_attention keep their type — the DFlash drafter derives causality from
  // it — but attend to every earlier position.
  bool has_sliding = false;
  for (LayerType t : c.layer_types) has_sliding |= t == LayerType::kSlidingAttention;
  if (has_sliding) {
    SW_ASSIGN_OR_RETURN(bool use_window, k.Bool("use_sliding_window", false));
    const bool window_null = root.contains("sliding_window") && root.at("sliding_window").is_null();
    if (use_window && !window_null) {
      // Qwen2Config / Qwen3Config: sliding_window defaults to 4096.
      SW_ASSIGN_OR_RETURN(c.sliding_window, k.Int("sliding_window", 4096));
      if (c.sliding_window <= 0) return k.Error("sliding_window", "must be positive");
    }
  }
  SW_RETURN_IF_ERROR(ParseEos(k, c));
  return c;
}

}  // namespace

const char* LayerTypeName(LayerType t) { return NameOf(kLayerTypeNames, t); }

const char* ModelFamilyName(ModelFamily f) {
  for (const auto& info : kFamilies) {
    if (info.family == f) return info.model_type;
  }
  return "?";
}

int64_t ModelConfig::rotary_dim() const {
  // transformers: d = int(head_dim * partial_rotary_factor), i.e. truncation; the frequencies
  // are arange(0, d, 2) / d, so ceil(d / 2) of them rotate 2 · ceil(d / 2) dims.
  const int64_t d =
      static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
  return 2 * ((d + 1) / 2);
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text,
                                             absl::string_view source) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": top level must be a JSON object"));
  }
  try {
    if (root.contains("text_config") && !root.at("text_config").is_null()) {
      // A vision-language package: run its text model through the CausalLM path, as
      // transformers' AutoModelForCausalLM does (it swaps in config.get_text_config()).
      const json& tc = root.at("text_config");
      if (!tc.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": text_config must be an object"));
      }
      json text = tc;
      if (!text.contains("model_type") && root.contains("model_type")) {
        text["model_type"] = root["model_type"];
      }
      // AutoModelForCausalLM knows one vision-language package of these families.
      if (root.contains("model_type") &&
          !(root.at("model_type").is_string() && root.at("model_type") == "qwen3_5")) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": key \"model_type\" is ", root.at("model_type").dump(),
            " with a text_config; the supported vision-language package is \"qwen3_5\""));
      }
      SW_ASSIGN_OR_RETURN(ModelConfig c, ParseTextConfig(text, source, "text_config"));
      c.vlm_packaged = true;
      Keys top(root, std::string(source));
      if (root.contains("architectures") && root["architectures"].is_array() &&
          !root["architectures"].empty() && root["architectures"][0].is_string()) {
        c.vlm_architecture = root["architectures"][0].get<std::string>();
      }
      if (c.eos_token_ids.empty()) SW_RETURN_IF_ERROR(ParseEos(top, c));
      return c;
    }
    return ParseTextConfig(root, source, "");
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

absl::Status CheckTargetConfig(const ModelConfig& c, absl::string_view source) {
  auto refuse = [&](absl::string_view key, absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key \"", key, "\" ", problem));
  };
  if (!c.is_causal) {
    return refuse("is_causal",
                  "is false: bidirectional attention is not supported for a target "
                  "(supported: true)");
  }
  if (!c.tie_last_hidden_states) {
    return refuse("tie_last_hidden_states",
                  "is false: transformers' hidden_states[L] would then be the last layer's raw "
                  "output, not the final-norm tap specwire's layer ids are defined against "
                  "(supported: true)");
  }
  if (c.family == ModelFamily::kQwen2 || c.family == ModelFamily::kQwen3) {
    for (size_t i = 0; i < c.layer_types.size(); ++i) {
      if (c.layer_types[i] == LayerType::kSlidingAttention && c.sliding_window <= 0) {
        return refuse("layer_types",
                      absl::StrCat("[", i,
                                   "] is sliding_attention without a window "
                                   "(use_sliding_window false or sliding_window null), which "
                                   "transformers' ",
                                   c.architecture, " cannot run"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyGenerationConfig(absl::string_view json_text, ModelConfig& c,
                                   absl::string_view source) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  Keys k(root, std::string(source));
  if (!k.Has("eos_token_id")) return absl::OkStatus();
  ModelConfig tmp;
  SW_RETURN_IF_ERROR(ParseEos(k, tmp));
  c.eos_token_ids = tmp.eos_token_ids;
  return absl::OkStatus();
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json t;
  t["model_type"] = c.model_type;
  t["architectures"] = {c.architecture};
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["intermediate_size"] = c.intermediate_size;
  t["num_hidden_layers"] = c.num_layers;
  t["num_attention_heads"] = c.num_heads;
  t["num_key_value_heads"] = c.num_kv_heads;
  t["head_dim"] = c.head_dim;
  t["rms_norm_eps"] = c.rms_norm_eps;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["max_position_embeddings"] = c.max_position_embeddings;
  t["hidden_act"] = "silu";
  if (!c.torch_dtype.empty()) t["torch_dtype"] = c.torch_dtype;
  if (c.family == ModelFamily::kLlama) {
    t["attention_bias"] = c.attention_bias;
    t["mlp_bias"] = c.mlp_bias;
  } else if (c.family != ModelFamily::kQwen2) {
    t["attention_bias"] = c.attention_bias;
  }
  json rope = {{"rope_type", c.rope.type}, {"rope_theta", c.rope.theta}};
  if (c.rope.partial_rotary_factor != 1.0 || c.family == ModelFamily::kQwen3_5) {
    rope["partial_rotary_factor"] = c.rope.partial_rotary_factor;
  }
  if (c.rope.type != "default") rope["factor"] = c.rope.factor;
  if (c.rope.type == "llama3") {
    rope["low_freq_factor"] = c.rope.low_freq_factor;
    rope["high_freq_factor"] = c.rope.high_freq_factor;
  }
  if (c.rope.type == "llama3" || c.rope.type == "yarn") {
    rope["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
  }
  if (c.rope.type == "yarn") {
    rope["attention_factor"] = c.rope.attention_factor;
    rope["beta_fast"] = c.rope.beta_fast;
    rope["beta_slow"] = c.rope.beta_slow;
    rope["truncate"] = c.rope.truncate;
  }
  if (!c.rope.mrope_section.empty()) rope["mrope_section"] = c.rope.mrope_section;
  t["rope_parameters"] = rope;
  json types = json::array();
  for (LayerType lt : c.layer_types) types.push_back(LayerTypeName(lt));
  t["layer_types"] = types;
  if (c.sliding_window > 0) {
    t["sliding_window"] = c.sliding_window;
    t["use_sliding_window"] = true;
  }
  if (c.family == ModelFamily::kQwen3_5) {
    t["linear_conv_kernel_dim"] = c.linear_conv_kernel_dim;
    t["linear_key_head_dim"] = c.linear_key_head_dim;
    t["linear_value_head_dim"] = c.linear_value_head_dim;
    t["linear_num_key_heads"] = c.linear_num_key_heads;
    t["linear_num_value_heads"] = c.linear_num_value_heads;
  }
  if (!c.eos_token_ids.empty()) t["eos_token_id"] = c.eos_token_ids;
  if (!c.is_causal) t["is_causal"] = false;
  if (!c.tie_last_hidden_states) t["tie_last_hidden_states"] = false;
  if (!c.vlm_packaged) return t.dump(2);
  json root;
  root["model_type"] = "qwen3_5";
  root["architectures"] = {c.vlm_architecture};
  root["text_config"] = t;
  return root.dump(2);
}

}  // namespace specwire
