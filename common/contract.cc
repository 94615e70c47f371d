#include "common/contract.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specwire {

using json = nlohmann::json;

namespace {

json CanaryJson(const CanaryFingerprint& c) {
  json taps = json::array();
  for (const TapFingerprint& t : c.taps) {
    taps.push_back({{"tap", t.tap}, {"mean", t.mean}, {"std", t.std}, {"rms", t.rms},
                    {"sketch", t.sketch}});
  }
  return {{"token_ids", c.token_ids}, {"compute_dtype", c.compute_dtype}, {"taps", taps}};
}

CanaryFingerprint CanaryOf(const json& j) {
  CanaryFingerprint c;
  c.token_ids = j.at("token_ids").get<std::vector<int64_t>>();
  c.compute_dtype = j.at("compute_dtype").get<std::string>();
  for (const json& t : j.at("taps")) {
    c.taps.push_back({t.at("tap").get<std::string>(), t.at("mean").get<double>(),
                      t.at("std").get<double>(), t.at("rms").get<double>(),
                      t.at("sketch").get<std::vector<double>>()});
  }
  return c;
}

// Relative error a state carries from its compute dtype (the canonical forward's parity
// tolerances per tap: fp32 1e-5, bf16 1e-2; fp16 in between).
double RoundingOf(const std::string& dtype) {
  if (dtype == "bfloat16") return 2e-2;
  if (dtype == "float16") return 2e-3;
  return 1e-5;
}

}  // namespace

std::vector<int64_t> CanaryTokens(int64_t vocab_size, int64_t n) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n && vocab_size > 0; ++i) ids.push_back((7919 * i + 11) % vocab_size);
  return ids;
}

FingerprintComparison CompareFingerprints(const CanaryFingerprint& a, const CanaryFingerprint& b) {
  FingerprintComparison out;
  out.threshold = std::max(RoundingOf(a.compute_dtype), RoundingOf(b.compute_dtype));
  if (a.empty() || b.empty()) {
    out.problem = "a fingerprint has no taps (the canary was not computed)";
  } else if (a.token_ids != b.token_ids) {
    out.problem = absl::StrCat("the canaries differ (", a.token_ids.size(), " vs ",
                               b.token_ids.size(), " tokens, or other ids): other specwire versions "
                               "or vocabularies");
  } else if (a.taps.size() != b.taps.size()) {
    out.problem = absl::StrCat(a.taps.size(), " vs ", b.taps.size(), " taps: targets of other depth");
  }
  if (!out.problem.empty()) {
    out.level = "mismatch";
    return out;
  }
  static const char* kLevels[] = {"identical", "rounding", "drift", "mismatch"};
  int worst = 0;
  for (size_t i = 0; i < a.taps.size(); ++i) {
    const TapFingerprint &x = a.taps[i], &y = b.taps[i];
    TapComparison c;
    c.tap = x.tap;
    const double scale = std::max(std::abs(x.rms), 1e-30);
    c.rms_relative = std::abs(x.rms - y.rms) / scale;
    for (size_t k = 0; k < std::min(x.sketch.size(), y.sketch.size()); ++k) {
      c.sketch_relative = std::max(c.sketch_relative, std::abs(x.sketch[k] - y.sketch[k]) / scale);
    }
    const double d = std::max(c.rms_relative, c.sketch_relative);
    int level = x == y ? 0 : d <= out.threshold ? 1 : d <= 100 * out.threshold ? 2 : 3;
    if (x.tap != y.tap || x.sketch.size() != y.sketch.size()) level = 3;
    c.level = kLevels[level];
    worst = std::max(worst, level);
    out.taps.push_back(c);
  }
  out.level = kLevels[worst];
  return out;
}

std::string CanaryToJson(const CanaryFingerprint& c, int indent) { return CanaryJson(c).dump(indent); }

absl::StatusOr<CanaryFingerprint> CanaryFromJson(absl::string_view json_text) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("canary: not a JSON object");
  }
  if (j.contains("contract") && j["contract"].is_object()) j = j["contract"];  // a report
  if (j.contains("canary")) j = j["canary"];  // a contract, or specwire-cli fingerprint's output
  try {
    return CanaryOf(j);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("canary: ", e.what()));
  }
}

std::string ContractToJson(const ExtractionContract& c, int indent) {
  json skipped = json::array();
  for (const auto& s : c.skipped) {
    skipped.push_back({{"prefix", s.prefix},
                       {"count", s.count},
                       {"reason", s.reason},
                       {"names", s.names},
                       {"digest", s.digest}});
  }
  json j = {
      {"architecture", c.architecture},
      {"model_type", c.model_type},
      {"source_layout", c.source_layout},
      {"source_architecture", c.source_architecture},
      {"weight_prefix", c.weight_prefix},
      {"tensors_loaded", c.tensors_loaded},
      {"tensors_skipped", c.tensors_skipped},
      {"skipped", skipped},
      {"num_layers", c.num_layers},
      {"hidden_size", c.hidden_size},
      {"vocab_size", c.vocab_size},
      {"layer_types", c.layer_types},
      {"compute_dtype", c.compute_dtype},
      {"devices", c.devices},
      {"kernel_variant", c.kernel_variant},
      {"weights_digest", c.weights_digest},
      {"tokenizer_digest", c.tokenizer_digest},
      {"specwire_version", c.specwire_version},
      {"chat_template_digest", c.chat_template_digest},
      {"canary", CanaryJson(c.canary)},
      {"config_json", c.config_json},
  };
  return j.dump(indent);
}

absl::StatusOr<ExtractionContract> ContractFromJson(absl::string_view json_text) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("contract: not a JSON object");
  }
  try {
    ExtractionContract c;
    c.architecture = j.at("architecture").get<std::string>();
    c.model_type = j.at("model_type").get<std::string>();
    c.source_layout = j.at("source_layout").get<std::string>();
    c.source_architecture = j.at("source_architecture").get<std::string>();
    c.weight_prefix = j.at("weight_prefix").get<std::string>();
    c.tensors_loaded = j.at("tensors_loaded").get<int64_t>();
    c.tensors_skipped = j.at("tensors_skipped").get<int64_t>();
    for (const auto& s : j.at("skipped")) {
      c.skipped.push_back({s.at("prefix").get<std::string>(), s.at("count").get<int64_t>(),
                           s.at("reason").get<std::string>(),
                           s.value("names", std::vector<std::string>{}),
                           s.value("digest", std::string())});
    }
    c.num_layers = j.at("num_layers").get<int64_t>();
    c.hidden_size = j.at("hidden_size").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.layer_types = j.at("layer_types").get<std::vector<std::string>>();
    c.compute_dtype = j.at("compute_dtype").get<std::string>();
    c.devices = j.at("devices").get<std::vector<std::string>>();
    c.kernel_variant = j.at("kernel_variant").get<std::string>();
    c.weights_digest = j.at("weights_digest").get<std::string>();
    c.tokenizer_digest = j.at("tokenizer_digest").get<std::string>();
    c.specwire_version = j.at("specwire_version").get<std::string>();
    c.chat_template_digest = j.value("chat_template_digest", std::string());  // absent before
    if (j.contains("canary")) c.canary = CanaryOf(j["canary"]);
    c.config_json = j.value("config_json", std::string());  // absent before
    return c;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("contract: ", e.what()));
  }
}

}  // namespace specwire
