#include "common/contract.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specwire {

using json = nlohmann::json;

std::string ContractToJson(const ExtractionContract& c, int indent) {
  json skipped = json::array();
  for (const auto& s : c.skipped) {
    skipped.push_back({{"prefix", s.prefix}, {"count", s.count}, {"reason", s.reason}});
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
                           s.at("reason").get<std::string>()});
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
    return c;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("contract: ", e.what()));
  }
}

}  // namespace specwire
