#include "services/scorer/drafters/xpress_drafter.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/json_reader.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/drafters/dflash_drafter.h"
#include "services/scorer/drafters/draft_weights.h"

namespace specwire {
namespace {

using json = nlohmann::json;

struct XPressConfig {
  int64_t rank = 256;
  int64_t mlp_ratio = 2;
  int64_t jacobi_passes = 6;
};

class XPressDrafter : public BackboneHeads {
 public:
  static absl::StatusOr<std::unique_ptr<XPressDrafter>> Load(const std::string& dir,
                                                             at::ScalarType dtype,
                                                             const at::Device& device) {
    SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
    SW_ASSIGN_OR_RETURN(json doc, JsonReader::Parse(config_file.text, config_file.path));
    const JsonReader root(doc, config_file.path);
    std::unique_ptr<XPressDrafter> d(new XPressDrafter());
    XPressConfig& c = d->config_;
    SW_ASSIGN_OR_RETURN(c.rank, root.Int("xpress_rank", 256));
    SW_ASSIGN_OR_RETURN(c.mlp_ratio, root.Int("xpress_mlp_ratio", 2));
    SW_ASSIGN_OR_RETURN(c.jacobi_passes, root.Int("num_jacobi_passes", 6));
    for (const auto& [key, value, lo] : {std::tuple<const char*, int64_t, int64_t>{
                                             "xpress_rank", c.rank, 1},
                                         {"xpress_mlp_ratio", c.mlp_ratio, 1},
                                         {"num_jacobi_passes", c.jacobi_passes, 1}}) {
      if (value < lo || value > 65536) {
        return root.Error(key, absl::StrCat("is ", value, "; it must be in [", lo, ", 65536]"));
      }
    }
    SW_ASSIGN_OR_RETURN(d->backbone_, DFlashDrafter::Load(dir, dtype, device));
    const DrafterConfig& bc = d->backbone_->config();
    const int64_t H = bc.layers.hidden_size, V = bc.layers.vocab_size, B = bc.block_size;
    const int64_t r = c.rank, m = c.rank * c.mlp_ratio, Vd = d->backbone_->output_vocab_size();
    const Checkpoint& ckpt = d->backbone_->checkpoint();
    const std::string p = "refiner_head.";
    std::set<std::string> consumed;
    const auto for_each = [&](const WeightVisitor& v) {
      v({p + "token_embed.weight", {V, r}, &d->token_embed_});
      v({p + "down_h.weight", {r, H}, &d->down_h_});
      v({p + "down_g.weight", {r, H}, &d->down_g_});
      v({p + "in_proj.weight", {r, 3 * r}, &d->in_proj_});
      v({p + "mix_l", {r, B, B}, &d->mix_l_});
      v({p + "mlp_gate.weight", {m, r}, &d->gate_});
      v({p + "mlp_up.weight", {m, r}, &d->up_});
      v({p + "mlp_down.weight", {r, m}, &d->down_});
      v({p + "readout.weight", {Vd, r}, &d->readout_});
    };
    absl::Status status = RunGuarded("loading the XPress refiner " + dir, [&]() -> absl::Status {
      SW_RETURN_IF_ERROR(LoadDraftWeights(
          ckpt, dir, "XPress", for_each, dtype, consumed,
          [&](const WeightSlot& slot, const std::string& got, const std::string& want) {
            return absl::StrCat(dir, ": tensor \"", slot.name, "\" has shape ", got, " but ",
                                config_file.path, " (xpress_rank ", r, ", xpress_mlp_ratio ",
                                c.mlp_ratio, ", block_size ", B, ", hidden_size ", H, ") implies ",
                                want);
          }));
      for (at::Tensor* t : {&d->token_embed_, &d->down_h_, &d->down_g_, &d->in_proj_, &d->mix_l_,
                            &d->gate_, &d->up_, &d->down_, &d->readout_}) {
        *t = t->to(device).contiguous();
      }
      for (const auto& [name, view] : ckpt.tensors()) {
        (void)view;
        if (!consumed.count(name) && name.starts_with(p) && !name.ends_with("causal_tril")) {
          return absl::InvalidArgumentError(absl::StrCat(
              "unexpected tensor \"", name, "\" in XPress drafter ", dir,
              " (the refiner is refiner_head.{token_embed,down_h,down_g,in_proj,mlp_gate,mlp_up,"
              "mlp_down,readout}.weight and refiner_head.mix_l)"));
        }
      }
      return absl::OkStatus();
    });
    SW_RETURN_IF_ERROR(status);
    return d;
  }

  const DFlashDrafter& backbone() const override { return *backbone_; }
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override {
    return backbone_->SetTargetHead(embed_tokens, lm_head);
  }
  bool from_anchor() const { return backbone_->config().sample_from_anchor; }
  int64_t Slots(int64_t len) const override { return from_anchor() ? len - 1 : len; }
  int32_t block_size() const override {
    return backbone_->config().block_size + (from_anchor() ? 1 : 0);
  }
  bool conditions_on_drafts() const override { return true; }  // the refiner reads them

  Block Heads(const at::Tensor& slots, int64_t anchor, int64_t before_anchor,
              std::span<const int64_t> given, std::vector<int64_t>* drafts) const override {
    c10::InferenceMode guard;
    const int64_t S = slots.size(0);
    const int64_t n = from_anchor() ? S : S - 1;  // drafts
    const int64_t first = from_anchor() ? 0 : 1;  // the first drafting slot
    const at::Tensor h = slots.to(down_h_.scalar_type());
    const at::Tensor base = backbone_->HeadLogits(slots);  // [S, Vd] fp32
    const at::Tensor g = h.mean(0, /*keepdim=*/true).expand_as(h);
    const at::Tensor hcache = at::cat({at::linear(h, down_h_), at::linear(g, down_g_)}, -1);
    const at::Tensor mix = mix_l_.narrow(1, 0, S).narrow(2, 0, S) *
                           at::ones({S, S}, mix_l_.options()).tril();
    // The drafts (target ids), draft k at index k − 1: given where given, else the last pass's.
    std::vector<int64_t> pred = Argmax(base.narrow(0, first, n));
    const int64_t known = std::min<int64_t>(static_cast<int64_t>(given.size()), n);
    bool all_given = known >= n - 1;  // every y is a given token: one pass is the fixed point
    for (int64_t k = 0; k < std::min<int64_t>(known, n - 1); ++k) all_given &= given[k] >= 0;
    const int64_t passes = all_given ? 1 : config_.jacobi_passes;
    at::Tensor refined;
    for (int64_t pass = 0; pass < passes; ++pass) {
      std::vector<int64_t> y(S);  // the token before each slot's prediction
      for (int64_t s = 0; s < S; ++s) {
        const int64_t k = from_anchor() ? s : s - 1;  // the draft y_s is (0: the anchor)
        if (k < 0) {
          y[s] = before_anchor >= 0 ? before_anchor : anchor;
        } else if (k == 0) {
          y[s] = anchor;
        } else {
          y[s] = k - 1 < known && given[k - 1] >= 0 ? given[k - 1] : pred[k - 1];
        }
      }
      at::Tensor ids = at::tensor(y, at::kLong).to(token_embed_.device());
      at::Tensor x = at::linear(at::cat({hcache, token_embed_.index_select(0, ids)}, -1), in_proj_);
      x = x + at::einsum("ckj,jc->kc", {mix, x});
      x = x + at::linear(at::silu(at::linear(x, gate_)) * at::linear(x, up_), down_);
      refined = base + at::linear(x, readout_).to(at::kFloat);
      pred = Argmax(refined.narrow(0, first, n));
    }
    if (drafts != nullptr) *drafts = pred;
    Block out;
    out.logits = refined.narrow(0, first, n).contiguous();
    return out;
  }

 private:
  XPressDrafter() = default;

  std::vector<int64_t> Argmax(const at::Tensor& head_logits) const {
    const at::Tensor ids = backbone_->ToTargetVocabulary(head_logits).argmax(-1).to(at::kCPU);
    return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  }

  std::unique_ptr<DFlashDrafter> backbone_;
  XPressConfig config_;
  at::Tensor token_embed_, down_h_, down_g_, in_proj_, mix_l_, gate_, up_, down_, readout_;
};

absl::StatusOr<std::optional<std::string>> DetectXPress(const json& config, const std::string&) {
  if (config.contains("speculators_model_type") && config["speculators_model_type"] == "xpress") {
    return std::optional<std::string>("speculators");
  }
  return std::optional<std::string>();
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadXPressFamily(const std::string& dir,
                                                          const std::string&, at::ScalarType dtype,
                                                          const at::Device& device) {
  // Its positions condition on the drafts before them: no tree.
  return MakeHeadsFamilyDrafter(dir, XPressDrafter::Load(dir, dtype, device), "xpress",
                                "speculators", "");
}

}  // namespace

const DrafterFamily& XPressFamily() {
  static const DrafterFamily f{"xpress",
                               "XPress (speculators format: DFlash's backbone with a causal "
                               "refiner, Jacobi passes)",
                               &DetectXPress, &LoadXPressFamily};
  return f;
}

}  // namespace specwire
