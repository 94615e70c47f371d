#include "services/scorer/drafters/dspark_drafter.h"

#include <filesystem>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/json_reader.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/drafters/draft_weights.h"

namespace specwire {
namespace {

using json = nlohmann::json;

}  // namespace

absl::StatusOr<DSparkConfig> ParseDSparkConfig(const std::string& json_text,
                                               const std::string& format,
                                               const std::string& source) {
  const json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  const JsonReader root(doc, source);
  static const json kEmpty = json::object();
  JsonReader keys = root;
  DSparkConfig c;
  // Defaults are each package's: speculators attaches both heads (rank 256, confidence with
  // the Markov embedding); SpecForge attaches none unless its dflash_config asks.
  int64_t rank_default = 256;
  bool confidence_default = true, with_markov_default = true;
  if (format == "specforge") {
    keys = JsonReader(kEmpty, source, PathStyle::kDotted, "dflash_config");
    if (root.Has("dflash_config")) {
      SW_ASSIGN_OR_RETURN(keys, root.Object("dflash_config"));
    }
    rank_default = 0;
    SW_ASSIGN_OR_RETURN(const double alpha, keys.Double("confidence_head_alpha", 0.0));
    confidence_default = alpha > 0.0;
    with_markov_default = false;
  } else {
    c.rnn_steps_anchor_slot = true;
  }
  SW_ASSIGN_OR_RETURN(c.markov_rank, keys.Int("markov_rank", rank_default));
  if (c.markov_rank < 0 || c.markov_rank > 65536) {
    return keys.Error("markov_rank", absl::StrCat("is ", c.markov_rank, "; it must be in [0, 65536]"));
  }
  SW_ASSIGN_OR_RETURN(c.markov_head_type, keys.String("markov_head_type", "vanilla"));
  if (c.markov_head_type != "vanilla" && c.markov_head_type != "gated" &&
      c.markov_head_type != "rnn") {
    return keys.Error("markov_head_type", absl::StrCat("is \"", c.markov_head_type,
                                                       "\"; DSpark's are vanilla, gated, rnn"));
  }
  SW_ASSIGN_OR_RETURN(c.confidence_head, keys.Bool("enable_confidence_head", confidence_default));
  SW_ASSIGN_OR_RETURN(c.confidence_with_markov,
                      keys.Bool("confidence_head_with_markov", with_markov_default));
  if (!c.confidence_head) c.confidence_with_markov = false;
  if (c.confidence_with_markov && c.markov_rank == 0) {
    return keys.Error("confidence_head_with_markov",
                      "is true but markov_rank is 0: the confidence head would read a Markov "
                      "embedding the checkpoint has no head for");
  }
  return c;
}

absl::StatusOr<std::unique_ptr<DSparkDrafter>> DSparkDrafter::Load(const std::string& dir,
                                                                   at::ScalarType dtype,
                                                                   const at::Device& device) {
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  std::unique_ptr<DSparkDrafter> d(new DSparkDrafter());
  SW_ASSIGN_OR_RETURN(d->backbone_, DFlashDrafter::Load(dir, dtype, device));
  const DrafterConfig& bc = d->backbone_->config();
  if (!bc.dspark) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_file.path,
                     ": does not declare DSpark (speculators_model_type \"dspark\" "
                     "or dflash_config.projector_type \"dspark\")"));
  }
  if (bc.dflash2) {
    return absl::InvalidArgumentError(
        absl::StrCat(config_file.path, ": declares both DSpark and DFlash2"));
  }
  d->format_ = bc.format == "speculators" ? "speculators" : "specforge";
  SW_ASSIGN_OR_RETURN(d->config_,
                      ParseDSparkConfig(config_file.text, d->format_, config_file.path));
  const DSparkConfig& c = d->config_;
  const int64_t H = bc.layers.hidden_size, r = c.markov_rank;
  const int64_t V = bc.layers.vocab_size, Vd = d->backbone_->output_vocab_size();
  const Checkpoint& ckpt = d->backbone_->checkpoint();
  std::set<std::string> consumed;
  const auto for_each = [&](const WeightVisitor& v) {
    if (r > 0) {
      v({"markov_head.markov_w1.weight", {V, r}, &d->w1_});
      v({"markov_head.markov_w2.weight", {Vd, r}, &d->w2_});
      if (c.markov_head_type == "gated") {
        v({"markov_head.gate_proj.weight", {r, H + r}, &d->gate_w_});
        v({"markov_head.gate_proj.bias", {r}, &d->gate_b_});
      } else if (c.markov_head_type == "rnn") {
        v({"markov_head.joint_proj.weight", {3 * r, 2 * r + H}, &d->joint_w_});
        v({"markov_head.joint_proj.bias", {3 * r}, &d->joint_b_});
      }
    }
    if (c.confidence_head) {
      v({"confidence_head.proj.weight", {1, H + (c.confidence_with_markov ? r : 0)}, &d->conf_w_});
      v({"confidence_head.proj.bias", {1}, &d->conf_b_});
    }
  };
  absl::Status status = RunGuarded("loading DSpark heads " + dir, [&]() -> absl::Status {
    SW_RETURN_IF_ERROR(LoadDraftWeights(
        ckpt, dir, "DSpark", for_each, dtype, consumed,
        [&](const WeightSlot& slot, const std::string& got, const std::string& want) {
          return absl::StrCat(dir, ": tensor \"", slot.name, "\" has shape ", got, " but ",
                              config_file.path, " (markov_rank ", r, ", markov_head_type \"",
                              c.markov_head_type, "\", hidden_size ", H, ") implies ", want);
        }));
    for (at::Tensor* t : {&d->w1_, &d->w2_, &d->gate_w_, &d->gate_b_, &d->joint_w_, &d->joint_b_,
                          &d->conf_w_, &d->conf_b_}) {
      if (t->defined()) *t = t->to(device).contiguous();
    }
    for (const auto& [name, view] : ckpt.tensors()) {
      if (consumed.count(name)) continue;
      if (name.starts_with("markov_head.") || name.starts_with("confidence_head.")) {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected tensor \"", name, "\" in drafter ", dir, ": ",
                         config_file.path, " declares markov_rank ", r, ", markov_head_type \"",
                         c.markov_head_type, "\", enable_confidence_head ",
                         c.confidence_head ? "true" : "false", ", which has no such weight"));
      }
    }
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return d;
}

int64_t DSparkDrafter::Slots(int64_t len) const {
  return backbone_->config().sample_from_anchor ? len - 1 : len;
}

int32_t DSparkDrafter::block_size() const {
  const DrafterConfig& c = backbone_->config();
  return c.block_size + (c.sample_from_anchor ? 1 : 0);
}

at::Tensor DSparkDrafter::Bias(const at::Tensor& h, const at::Tensor& e, at::Tensor& state) const {
  const std::string& type = config_.markov_head_type;
  if (type == "vanilla") return at::linear(e, w2_);
  if (type == "gated") {
    const at::Tensor gate = at::sigmoid(at::linear(at::cat({h, e}), gate_w_, gate_b_));
    return at::linear(gate * e, w2_);
  }
  const int64_t r = config_.markov_rank;
  const at::Tensor z = at::linear(at::cat({state, e, h}), joint_w_, joint_b_);  // [3r]
  const at::Tensor gate = at::sigmoid(z.narrow(0, 0, r));
  state = gate * state + (1.0 - gate) * at::tanh(z.narrow(0, r, r));
  return at::linear(at::tanh(z.narrow(0, 2 * r, r)), w2_);
}

DSparkDrafter::Block DSparkDrafter::Heads(const at::Tensor& slots, int64_t anchor,
                                          int64_t /*before_anchor*/,
                                          std::span<const int64_t> given,
                                          std::vector<int64_t>* drafts) const {
  c10::InferenceMode guard;
  const bool from_anchor = backbone_->config().sample_from_anchor;
  const int64_t n = from_anchor ? slots.size(0) : slots.size(0) - 1;  // draft positions
  const at::Tensor rows = slots.narrow(0, from_anchor ? 0 : 1, n);    // h_1 .. h_n
  Block out;
  out.logits = backbone_->HeadLogits(rows);  // [n, Vd] fp32
  const int64_t r = config_.markov_rank;
  if (r == 0) {
    if (conf_w_.defined()) {
      out.confidence = at::sigmoid(at::linear(rows, conf_w_, conf_b_).squeeze(-1)).to(at::kFloat);
    }
    if (drafts != nullptr) {
      const at::Tensor ids = backbone_->ToTargetVocabulary(out.logits).argmax(-1).to(at::kCPU);
      for (int64_t k = 0; k < n; ++k) drafts->push_back(ids[k].item<int64_t>());
    }
    return out;
  }
  at::Tensor state = at::zeros({r}, w1_.options());
  if (config_.markov_head_type == "rnn" && config_.rnn_steps_anchor_slot && !from_anchor) {
    (void)Bias(slots[0].to(w1_.scalar_type()), w1_[anchor], state);  // slot 0, y = the anchor
  }
  std::vector<at::Tensor> logits, confidence;
  int64_t prev = anchor;
  for (int64_t k = 1; k <= n; ++k) {
    const at::Tensor h = rows[k - 1].to(w1_.scalar_type());
    const at::Tensor e = w1_[prev];
    at::Tensor row = out.logits[k - 1] + Bias(h, e, state).to(at::kFloat);
    logits.push_back(row);
    if (conf_w_.defined()) {
      const at::Tensor in = config_.confidence_with_markov ? at::cat({h, e}) : h;
      confidence.push_back(at::sigmoid(at::linear(in, conf_w_, conf_b_)).to(at::kFloat));
    }
    const int64_t draft = backbone_->ToTargetVocabulary(row).argmax(-1).item<int64_t>();
    if (drafts != nullptr) drafts->push_back(draft);
    prev = k - 1 < static_cast<int64_t>(given.size()) ? given[k - 1] : draft;
  }
  out.logits = at::stack(logits);
  if (!confidence.empty()) out.confidence = at::cat(confidence);
  return out;
}

namespace {

absl::StatusOr<std::optional<std::string>> DetectDSpark(const json& config, const std::string&) {
  if (config.contains("speculators_model_type")) {
    return config["speculators_model_type"] == "dspark"
               ? std::optional<std::string>("speculators")
               : std::nullopt;
  }
  if (config.contains("dflash_config") && config["dflash_config"].is_object() &&
      config["dflash_config"].value("projector_type", json()) == "dspark") {
    return std::optional<std::string>("specforge");
  }
  if (config.contains("architectures") && config["architectures"].is_array()) {
    for (const json& a : config["architectures"]) {
      if (a == "DSparkDraftModel") return std::optional<std::string>("specforge");
    }
  }
  return std::optional<std::string>();
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadDSparkFamily(const std::string& dir,
                                                          const std::string&, at::ScalarType dtype,
                                                          const at::Device& device) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<DSparkDrafter> d, DSparkDrafter::Load(dir, dtype, device));
  std::string format = d->format();
  // Without a Markov head the positions are DFlash's independent marginals: DDTree applies.
  std::string tree = d->config().markov_rank > 0 ? "" : kTreeDDTree;
  return MakeHeadsFamilyDrafter(dir, std::move(d), "dspark", std::move(format), std::move(tree));
}

}  // namespace

const DrafterFamily& DSparkFamily() {
  static const DrafterFamily f{"dspark",
                               "DSpark (speculators and SpecForge formats: DFlash's backbone with "
                               "Markov and confidence heads)",
                               &DetectDSpark, &LoadDSparkFamily};
  return f;
}

}  // namespace specwire
