#include "services/scorer/drafters/peagle_drafter.h"

#include <filesystem>

#include "common/checkpoint.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "services/scorer/drafters/eagle3_drafter.h"

namespace specwire {
namespace {

using json = nlohmann::json;

// One response: the EAGLE-3 context cache; a block is one DraftParallel forward.
class PEagleSession : public DraftSession {
 public:
  PEagleSession(const Eagle3Drafter* drafter, int64_t capacity)
      : drafter_(drafter), cache_(drafter->NewCache(capacity)) {}
  void AppendContext(const at::Tensor& features, std::span<const int64_t> next_tokens) override {
    drafter_->AppendContext(*cache_, features, next_tokens);
  }
  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                         std::span<const int64_t> given) override {
    (void)anchor;  // the last context row already paired its states with it
    (void)given;   // no position conditions on the drafts before it
    TORCH_CHECK(start == cache_->length(), "P-EAGLE block at ", start,
                " but the context covers [0, ", cache_->length(), ")");
    draft_logits_ = drafter_->DraftParallel(*cache_, len);  // [len − 1, Vd]
    return drafter_->ToTargetLogits(draft_logits_);
  }
  std::map<std::string, at::Tensor> Inspect() const override {
    return {{"draft_logits", draft_logits_}};
  }

 private:
  const Eagle3Drafter* drafter_;
  std::unique_ptr<Eagle3Cache> cache_;
  at::Tensor draft_logits_;
};

class PEagleBlockDrafter : public BlockDrafter {
 public:
  PEagleBlockDrafter(const Eagle3Drafter* drafter, int32_t block_size)
      : drafter_(drafter), block_size_(block_size) {}
  int32_t block_size() const override { return block_size_; }
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return std::make_unique<PEagleSession>(drafter_, capacity);
  }

 private:
  const Eagle3Drafter* drafter_;
  int32_t block_size_;
};

class PEagleFamilyDrafter : public Drafter {
 public:
  PEagleFamilyDrafter(std::unique_ptr<Eagle3Drafter> drafter, const std::string& dir,
                      std::string config_json)
      : drafter_(std::move(drafter)) {
    const Eagle3Config& c = drafter_->config();
    DrafterSpec& s = spec_;
    s.path = dir;
    s.config_json = std::move(config_json);
    s.method = "peagle";
    s.format = Eagle3FormatName(c.format);
    s.tree = kTreeDDTree;  // independent per-position marginals
    s.uses_mask_token = true;
    s.mask_token_id = c.mask_token_id;
    s.needs_target_head = !drafter_->has_own_embedding();
    s.autoregressive = false;            // one forward per block
    s.last_layer_is_final_norm = false;  // EAGLE-3's auxiliary states, as vLLM captures them
    s.block_size = c.drafts() + 1;
    s.num_layers = c.layers.num_layers;
    s.hidden_size = c.layers.hidden_size;
    s.target_hidden_size = c.target_hidden_size;
    s.vocab_size = c.layers.vocab_size;
    s.dtype = ScalarTypeName(drafter_->dtype());
    s.device = drafter_->device().str();
  }
  const DrafterSpec& spec() const override { return spec_; }
  at::ScalarType dtype() const override { return drafter_->dtype(); }
  const at::Device& device() const override { return drafter_->device(); }
  absl::Status FitTargetLayers(int64_t target_layers) override {
    return FitEagle3TargetLayers(*drafter_, target_layers, spec_);
  }
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor&) override {
    return drafter_->SetTargetEmbedding(embed_tokens);  // the head is its own (draft vocabulary)
  }
  std::unique_ptr<BlockDrafter> Chain() override {
    return std::make_unique<PEagleBlockDrafter>(drafter_.get(), spec_.block_size);
  }

 private:
  std::unique_ptr<Eagle3Drafter> drafter_;
  DrafterSpec spec_;
};

absl::StatusOr<std::optional<std::string>> DetectPEagleFamily(const json& config,
                                                              const std::string& source) {
  return Eagle3FormatOf(DetectPEagle(config.dump(), source));
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadPEagleFamily(const std::string& dir,
                                                          const std::string&, at::ScalarType dtype,
                                                          const at::Device& device) {
  return MakeFamilyDrafter<PEagleFamilyDrafter>(dir, Eagle3Drafter::Load(dir, dtype, device));
}

}  // namespace

const DrafterFamily& PEagleFamily() {
  static const DrafterFamily f{"peagle", "P-EAGLE (speculators and SpecForge formats)",
                               &DetectPEagleFamily, &LoadPEagleFamily};
  return f;
}

}  // namespace specwire
