#include "services/scorer/drafters/domino_drafter.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_reader.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/drafters/dflash_drafter.h"
#include "services/scorer/drafters/draft_weights.h"

namespace specwire {
namespace {

using json = nlohmann::json;

struct DominoConfig {
  int64_t emb_dim = 0;         // E
  int64_t gru_hidden_dim = 0;  // G
  int64_t pure_draft_prefix_len = 0;
  bool shift_label = false;
};

absl::StatusOr<DominoConfig> ParseDominoConfig(const std::string& text, const std::string& source) {
  SW_ASSIGN_OR_RETURN(json doc, JsonReader::Parse(text, source));
  const JsonReader root(doc, source);
  SW_ASSIGN_OR_RETURN(JsonReader dc, root.Object("dflash_config"));
  DominoConfig c;
  SW_ASSIGN_OR_RETURN(c.emb_dim, dc.PositiveInt("emb_dim"));
  SW_ASSIGN_OR_RETURN(c.gru_hidden_dim, dc.PositiveInt("gru_hidden_dim"));
  SW_ASSIGN_OR_RETURN(c.pure_draft_prefix_len, dc.Int("pure_draft_prefix_len", 0));
  if (c.pure_draft_prefix_len < 0) return dc.Error("pure_draft_prefix_len", "must be >= 0");
  SW_ASSIGN_OR_RETURN(c.shift_label, dc.Bool("shift_label", false));
  return c;
}

class DominoDrafter : public BackboneHeads {
 public:
  static absl::StatusOr<std::unique_ptr<DominoDrafter>> Load(const std::string& dir,
                                                             at::ScalarType dtype,
                                                             const at::Device& device) {
    SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
    std::unique_ptr<DominoDrafter> d(new DominoDrafter());
    SW_ASSIGN_OR_RETURN(d->backbone_, DFlashDrafter::Load(dir, dtype, device));
    const DrafterConfig& bc = d->backbone_->config();
    if (!bc.domino || bc.dspark || bc.dflash2) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_file.path, ": ",
                       bc.domino ? "declares Domino and another DFlash family at once"
                                 : "does not declare Domino (dflash_config.projector_type "
                                   "\"domino\")"));
    }
    SW_ASSIGN_OR_RETURN(d->config_, ParseDominoConfig(config_file.text, config_file.path));
    const int64_t H = bc.layers.hidden_size, V = bc.layers.vocab_size;
    const int64_t G = d->config_.gru_hidden_dim, E = d->config_.emb_dim;
    if (d->backbone_->output_vocab_size() != V) {
      return absl::InvalidArgumentError(absl::StrCat(
          config_file.path, ": a draft vocabulary of ", d->backbone_->output_vocab_size(),
          " tokens; Domino's correction is over the target's ", V));
    }
    const Checkpoint& ckpt = d->backbone_->checkpoint();
    // SpecForge loads early checkpoints' heads from under logit_head. too.
    const std::string p = ckpt.Find("prefix_gru.weight_ih_l0") == nullptr &&
                                  ckpt.Find("logit_head.prefix_gru.weight_ih_l0") != nullptr
                              ? "logit_head."
                              : "";
    std::set<std::string> consumed;
    const auto for_each = [&](const WeightVisitor& v) {
      v({p + "prefix_gru.weight_ih_l0", {3 * G, H}, &d->w_ih_});
      v({p + "prefix_gru.weight_hh_l0", {3 * G, G}, &d->w_hh_});
      v({p + "embed_proj.0.weight", {E, H + G}, &d->proj1_});
      v({p + "embed_proj.2.weight", {V, E}, &d->proj2_});
    };
    absl::Status status = RunGuarded("loading the Domino head " + dir, [&]() -> absl::Status {
      SW_RETURN_IF_ERROR(LoadDraftWeights(
          ckpt, dir, "Domino", for_each, dtype, consumed,
          [&](const WeightSlot& slot, const std::string& got, const std::string& want) {
            return absl::StrCat(dir, ": tensor \"", slot.name, "\" has shape ", got, " but ",
                                config_file.path, " (gru_hidden_dim ", G, ", emb_dim ", E,
                                ", hidden_size ", H, ", vocab_size ", V, ") implies ", want);
          }));
      for (at::Tensor* t : {&d->w_ih_, &d->w_hh_, &d->proj1_, &d->proj2_}) {
        *t = t->to(device).contiguous();
      }
      for (const auto& [name, view] : ckpt.tensors()) {
        (void)view;
        if (consumed.count(name)) continue;
        if (name.starts_with("prefix_gru.") || name.starts_with("embed_proj.") ||
            name.starts_with("logit_head.")) {
          return absl::InvalidArgumentError(absl::StrCat(
              "unexpected tensor \"", name, "\" in Domino drafter ", dir,
              " (its head is prefix_gru.weight_{ih,hh}_l0 and embed_proj.{0,2}.weight, no "
              "biases)"));
        }
      }
      return absl::OkStatus();
    });
    SW_RETURN_IF_ERROR(status);
    return d;
  }

  const DFlashDrafter& backbone() const override { return *backbone_; }
  // The GRU reads the target's embedding of the tokens before each position.
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override {
    SW_RETURN_IF_ERROR(backbone_->SetTargetHead(embed_tokens, lm_head));
    return RunGuarded("setting the target embedding", [&]() -> absl::Status {
      embed_ = embed_tokens.to(backbone_->device(), backbone_->dtype());
      return absl::OkStatus();
    });
  }
  int64_t Slots(int64_t len) const override { return len; }
  int32_t block_size() const override { return backbone_->config().block_size; }
  bool conditions_on_drafts() const override { return true; }  // the GRU reads the drafts

  // The drafts of a block from its slots [len, H]: head logits [len − 1, V] (fp32).
  Block Heads(const at::Tensor& slots, int64_t anchor, int64_t /*before_anchor*/,
              std::span<const int64_t> given,
              std::vector<int64_t>* drafts) const override {
    c10::InferenceMode guard;
    const int64_t n = slots.size(0) - 1;
    const at::Tensor rows = slots.narrow(0, config_.shift_label ? 0 : 1, n);  // h_1 .. h_n
    const at::Tensor base = backbone_->HeadLogits(rows);  // [n, V] fp32
    const int64_t G = config_.gru_hidden_dim;
    at::Tensor g = at::zeros({G}, w_hh_.options());
    std::vector<at::Tensor> logits;
    int64_t prev = anchor;
    for (int64_t k = 1; k <= n; ++k) {
      g = Gru(embed_[prev], g);  // the state after tokens 0 .. k − 1
      at::Tensor row = base[k - 1];
      if (k > config_.pure_draft_prefix_len) {
        const at::Tensor x = at::cat({rows[k - 1].to(w_hh_.scalar_type()), g});
        row = row + at::linear(at::silu(at::linear(x, proj1_)), proj2_).to(at::kFloat);
      }
      logits.push_back(row);
      const int64_t draft = row.argmax(-1).item<int64_t>();
      if (drafts != nullptr) drafts->push_back(draft);
      prev = k - 1 < static_cast<int64_t>(given.size()) && given[k - 1] >= 0 ? given[k - 1] : draft;
    }
    Block out;
    out.logits = at::stack(logits);
    return out;
  }

 private:
  DominoDrafter() = default;

  // torch.nn.GRU's cell without biases (gates r, z, n in that order).
  at::Tensor Gru(const at::Tensor& x, const at::Tensor& h) const {
    const int64_t G = config_.gru_hidden_dim;
    const at::Tensor gi = at::linear(x, w_ih_), gh = at::linear(h, w_hh_);
    const at::Tensor r = at::sigmoid(gi.narrow(0, 0, G) + gh.narrow(0, 0, G));
    const at::Tensor z = at::sigmoid(gi.narrow(0, G, G) + gh.narrow(0, G, G));
    const at::Tensor c = at::tanh(gi.narrow(0, 2 * G, G) + r * gh.narrow(0, 2 * G, G));
    return (1 - z) * c + z * h;
  }

  std::unique_ptr<DFlashDrafter> backbone_;
  DominoConfig config_;
  at::Tensor w_ih_, w_hh_, proj1_, proj2_;
  at::Tensor embed_;  // the target's embedding (the GRU's inputs)
};

absl::StatusOr<std::optional<std::string>> DetectDomino(const json& config, const std::string&) {
  if (config.contains("speculators_model_type")) return std::optional<std::string>();
  bool named = config.contains("dflash_config") && config["dflash_config"].is_object() &&
               config["dflash_config"].value("projector_type", json()) == "domino";
  if (config.contains("architectures") && config["architectures"].is_array()) {
    for (const json& a : config["architectures"]) named |= a == "DominoDraftModel";
  }
  return named ? std::optional<std::string>("specforge") : std::optional<std::string>();
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadDominoFamily(const std::string& dir,
                                                          const std::string&, at::ScalarType dtype,
                                                          const at::Device& device) {
  // Its positions condition on the drafts before them: no tree.
  return MakeHeadsFamilyDrafter(dir, DominoDrafter::Load(dir, dtype, device), "domino",
                                "specforge", "");
}

}  // namespace

const DrafterFamily& DominoFamily() {
  static const DrafterFamily f{"domino",
                               "Domino (SpecForge format: DFlash's backbone with a GRU logit "
                               "correction)",
                               &DetectDomino, &LoadDominoFamily};
  return f;
}

}  // namespace specwire
