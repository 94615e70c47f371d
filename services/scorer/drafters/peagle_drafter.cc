#include "services/scorer/drafters/peagle_drafter.h"

#include <memory>
#include <string>

#include "services/scorer/drafters/eagle3_drafter.h"

namespace specwire {
namespace {

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

class PEagleFamilyDrafter : public Eagle3BasedDrafter {
 public:
  PEagleFamilyDrafter(std::unique_ptr<Eagle3Drafter> drafter, const std::string& dir,
                      std::string config_json)
      : Eagle3BasedDrafter(std::move(drafter), dir, std::move(config_json)) {
    spec_.method = "peagle";
    spec_.tree = kTreeDDTree;  // independent per-position marginals
    spec_.uses_mask_token = true;
    spec_.mask_token_id = drafter_->config().mask_token_id;
    spec_.autoregressive = false;  // one forward per block
  }
  std::unique_ptr<BlockDrafter> Chain() override {
    return std::make_unique<PEagleBlockDrafter>(drafter_.get(), spec_.block_size);
  }
};

}  // namespace

const DrafterFamily& PEagleFamily() {
  static const DrafterFamily f{"peagle", "P-EAGLE (speculators and SpecForge formats)",
                               &DetectEagle3Based<&DetectPEagle>,
                               &LoadEagle3Based<PEagleFamilyDrafter>};
  return f;
}

}  // namespace specwire
