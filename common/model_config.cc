#include "common/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using json = nlohmann::json;

// Typed access to config keys with error messages naming the file and key.
class Keys {
 public:
  Keys(const json& j, absl::string_view source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& Raw(const char* key) const { return j_.at(key); }

  absl::StatusOr<int64_t> Int(const char* key) const {
    if (!Has(key)) return Error(key, "is required but missing");
    const json& v = j_.at(key);
    if (!v.is_number_integer()) return Error(key, absl::StrCat("must be an integer, got ", v.dump()));
    return v.get<int64_t>();
  }
  absl::StatusOr<int64_t> Int(const char* key, int64_t dflt) const {
    return Has(key) ? Int(key) : absl::StatusOr<int64_t>(dflt);
  }
  absl::StatusOr<int64_t> PositiveInt(const char* key) const {
    SW_ASSIGN_OR_RETURN(int64_t v, Int(key));
    if (v <= 0) return Error(key, absl::StrCat("must be positive, got ", v));
    return v;
  }
  absl::StatusOr<double> Double(const char* key, double dflt) const {
    if (!Has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_number()) return Error(key, absl::StrCat("must be a number, got ", v.dump()));
    return v.get<double>();
  }
  absl::StatusOr<bool> Bool(const char* key, bool dflt) const {
    if (!Has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) return Error(key, absl::StrCat("must be true or false, got ", v.dump()));
    return v.get<bool>();
  }
  absl::StatusOr<std::string> String(const char* key, std::string dflt) const {
    if (!Has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_string()) return Error(key, absl::StrCat("must be a string, got ", v.dump()));
    return v.get<std::string>();
  }

  absl::Status Error(absl::string_view key, absl::string_view problem) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": key \"", prefix_, key, "\" ", problem));
  }

 private:
  const json& j_;
  absl::string_view source_;
  std::string prefix_;
};

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

absl::StatusOr<LayerType> ParseLayerType(const std::string& s) {
  if (s == "full_attention") return LayerType::kFullAttention;
  if (s == "sliding_attention") return LayerType::kSlidingAttention;
  if (s == "linear_attention") return LayerType::kLinearAttention;
  return absl::InvalidArgumentError(absl::StrCat("unknown layer type \"", s, "\""));
}

// rope_parameters (v5) or rope_scaling (v4) plus top-level rope_theta / partial_rotary_factor,
// with transformers' precedence: values inside the dict win over top-level keys.
absl::Status ParseRope(const Keys& top, const json& root, ModelConfig& c, double default_partial) {
  const json* dict = nullptr;
  const char* dict_key = nullptr;
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    if (top.Has(k)) {
      if (!root.at(k).is_object()) return top.Error(k, "must be an object");
      dict = &root.at(k);
      dict_key = k;
      break;
    }
  }
  SW_ASSIGN_OR_RETURN(c.rope.theta, top.Double("rope_theta", 10000.0));
  SW_ASSIGN_OR_RETURN(c.rope.partial_rotary_factor,
                      top.Double("partial_rotary_factor", default_partial));
  c.rope.original_max_position_embeddings = c.max_position_embeddings;
  if (dict != nullptr) {
    Keys r(*dict, "", absl::StrCat(dict_key, "."));
    std::string type;
    {
      auto t = r.String("rope_type", "");
      if (!t.ok()) return top.Error(dict_key, t.status().message());
      type = *t;
      if (type.empty()) {
        auto legacy = r.String("type", "default");
        if (!legacy.ok()) return top.Error(dict_key, legacy.status().message());
        type = *legacy;
      }
    }
    c.rope.type = type;
    auto num = [&](const char* key, double& out) -> absl::Status {
      auto v = r.Double(key, out);
      if (!v.ok()) return top.Error(dict_key, v.status().message());
      out = *v;
      return absl::OkStatus();
    };
    SW_RETURN_IF_ERROR(num("rope_theta", c.rope.theta));
    SW_RETURN_IF_ERROR(num("partial_rotary_factor", c.rope.partial_rotary_factor));
    SW_RETURN_IF_ERROR(num("factor", c.rope.factor));
    SW_RETURN_IF_ERROR(num("low_freq_factor", c.rope.low_freq_factor));
    SW_RETURN_IF_ERROR(num("high_freq_factor", c.rope.high_freq_factor));
    if (r.Has("original_max_position_embeddings")) {
      double omax = 0;
      SW_RETURN_IF_ERROR(num("original_max_position_embeddings", omax));
      // Checked before the conversion: a double outside int64's range does not convert.
      if (!(omax >= 1 && omax <= 9007199254740992.0)) {
        return top.Error(dict_key, absl::StrCat("original_max_position_embeddings ", omax,
                                                " is not a positive integer"));
      }
      c.rope.original_max_position_embeddings = static_cast<int64_t>(omax);
    }
    if (r.Has("mrope_section")) {
      const json& ms = dict->at("mrope_section");
      if (!ms.is_array()) return top.Error(dict_key, "mrope_section must be an array");
      for (const json& v : ms) {
        if (!v.is_number_integer()) return top.Error(dict_key, "mrope_section must hold integers");
        c.rope.mrope_section.push_back(v.get<int64_t>());
      }
    }
  }
  if (c.rope.type != "default" && c.rope.type != "linear" && c.rope.type != "llama3") {
    return top.Error(dict_key ? dict_key : "rope_parameters",
                     absl::StrCat("has rope_type \"", c.rope.type,
                                  "\", which is not supported (default, linear, llama3)"));
  }
  // Parameters the type does not use keep their defaults, so that equal ropes compare equal and
  // ModelConfigToJson, which writes only the used ones, round-trips.
  if (c.rope.type == "default") c.rope.factor = RopeConfig().factor;
  if (c.rope.type != "llama3") {
    c.rope.low_freq_factor = RopeConfig().low_freq_factor;
    c.rope.high_freq_factor = RopeConfig().high_freq_factor;
    c.rope.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (c.rope.type == "linear" && !(c.rope.factor > 0)) {
    return top.Error(dict_key, "linear rope needs factor > 0");
  }
  if (c.rope.type == "llama3" &&
      !(c.rope.factor > 0 && c.rope.low_freq_factor > 0 &&
        c.rope.high_freq_factor > c.rope.low_freq_factor)) {
    return top.Error(dict_key, "llama3 rope needs factor > 0 and high_freq_factor > low_freq_factor");
  }
  if (!(c.rope.theta > 0)) return top.Error("rope_theta", "must be positive");
  if (!(c.rope.partial_rotary_factor > 0 && c.rope.partial_rotary_factor <= 1)) {
    return top.Error("partial_rotary_factor", "must be in (0, 1]");
  }
  return absl::OkStatus();
}

absl::Status ParseEos(const Keys& k, const json& root, ModelConfig& c) {
  if (!k.Has("eos_token_id")) return absl::OkStatus();
  const json& e = root.at("eos_token_id");
  if (e.is_number_integer()) {
    c.eos_token_ids.push_back(e.get<int64_t>());
  } else if (e.is_array()) {
    for (const json& v : e) {
      if (!v.is_number_integer()) return k.Error("eos_token_id", "must hold integers");
      c.eos_token_ids.push_back(v.get<int64_t>());
    }
  } else {
    return k.Error("eos_token_id", "must be an integer or a list of integers");
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseTextConfig(const json& root, absl::string_view source,
                                            const std::string& prefix) {
  Keys k(root, source, prefix);
  ModelConfig c;
  SW_ASSIGN_OR_RETURN(c.model_type, k.String("model_type", ""));
  if (c.model_type.empty()) return k.Error("model_type", "is required but missing");
  // A text config nested in a VLM config may carry the VLM's model_type ("qwen3_5"); it means
  // the same text model.
  if (c.model_type == "qwen3_5" && !prefix.empty()) c.model_type = "qwen3_5_text";
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
  SW_ASSIGN_OR_RETURN(c.max_position_embeddings,
                      k.Int("max_position_embeddings",
                            c.family == ModelFamily::kLlama ? 2048 : 32768));
  if (c.max_position_embeddings <= 0) {
    return k.Error("max_position_embeddings",
                   absl::StrCat("must be positive, got ", c.max_position_embeddings));
  }
  SW_ASSIGN_OR_RETURN(std::string act, k.String("hidden_act", "silu"));
  if (act != "silu") {
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

  SW_RETURN_IF_ERROR(ParseRope(k, root, c, hybrid ? 0.25 : 1.0));
  if (c.rotary_dim() <= 0 || c.rotary_dim() % 2 != 0) {
    return k.Error("partial_rotary_factor",
                   absl::StrCat("gives an odd or empty rotary dimension ", c.rotary_dim()));
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
    // Qwen2/Qwen3: sliding window from layer max_window_layers on, only with use_sliding_window.
    SW_ASSIGN_OR_RETURN(bool sliding, k.Bool("use_sliding_window", false));
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
    if (use_window && k.Has("sliding_window")) {
      SW_ASSIGN_OR_RETURN(c.sliding_window, k.Int("sliding_window", 0));
      if (c.sliding_window <= 0) return k.Error("sliding_window", "must be positive");
    }
  }
  SW_RETURN_IF_ERROR(ParseEos(k, root, c));
  return c;
}

}  // namespace

const char* LayerTypeName(LayerType t) {
  switch (t) {
    case LayerType::kFullAttention: return "full_attention";
    case LayerType::kSlidingAttention: return "sliding_attention";
    case LayerType::kLinearAttention: return "linear_attention";
  }
  return "?";
}

const char* ModelFamilyName(ModelFamily f) {
  for (const auto& info : kFamilies) {
    if (info.family == f) return info.model_type;
  }
  return "?";
}

int64_t ModelConfig::rotary_dim() const {
  // transformers: dim = int(head_dim * partial_rotary_factor), i.e. truncation.
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json_text, absl::string_view source) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
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
      SW_ASSIGN_OR_RETURN(ModelConfig c, ParseTextConfig(text, source, "text_config."));
      c.vlm_packaged = true;
      Keys top(root, source);
      if (root.contains("architectures") && root["architectures"].is_array() &&
          !root["architectures"].empty() && root["architectures"][0].is_string()) {
        c.vlm_architecture = root["architectures"][0].get<std::string>();
      }
      if (c.eos_token_ids.empty()) SW_RETURN_IF_ERROR(ParseEos(top, root, c));
      return c;
    }
    return ParseTextConfig(root, source, "");
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", e.what()));
  }
}

absl::Status ApplyGenerationConfig(absl::string_view json_text, ModelConfig& c,
                                   absl::string_view source) {
  json root = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  Keys k(root, source);
  if (!k.Has("eos_token_id")) return absl::OkStatus();
  ModelConfig tmp;
  SW_RETURN_IF_ERROR(ParseEos(k, root, tmp));
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
  if (c.rope.type == "linear" || c.rope.type == "llama3") rope["factor"] = c.rope.factor;
  if (c.rope.type == "llama3") {
    rope["low_freq_factor"] = c.rope.low_freq_factor;
    rope["high_freq_factor"] = c.rope.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope.original_max_position_embeddings;
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
  if (!c.vlm_packaged) return t.dump(2);
  json root;
  root["model_type"] = "qwen3_5";
  root["architectures"] = {c.vlm_architecture};
  root["text_config"] = t;
  return root.dump(2);
}

}  // namespace specwire
