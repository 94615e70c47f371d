// The DFlash block-diffusion drafter (z-lab format) in libtorch, and its config.
//
// Architecture (shared notes dflash.md §a): target features of target_layer_ids are concatenated,
// fused once by fc + hidden_norm into context rows; every drafter layer is a Qwen3 layer whose
// attention takes queries from the block only and keys/values from [context rows ; block]
// (k_norm and RoPE on context keys too). The block [anchor, MASK × (B−1)] is embedded with the
// TARGET's embed_tokens; logits come from the TARGET's lm_head. The draft cache keeps the context
// keys/values only (block K/V are discarded after each draft).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace specwire {

struct DrafterConfig {
  ModelConfig layers;               // the drafter's own Qwen3 layers (model_type qwen3)
  int32_t block_size = 16;
  int64_t num_target_layers = 0;
  std::vector<int64_t> target_layer_ids;  // decoder-layer ids of the target (HF hidden_states[k+1])
  int64_t mask_token_id = 0;
  // dflash's newest semantics: `is_causal` from config.json when present; otherwise sliding
  // layers are causal within the block and full layers bidirectional.
  std::optional<bool> is_causal;
  int64_t target_hidden_size() const;  // fc input width / number of target layers
};

// Parses a drafter's config.json (INVALID_ARGUMENT naming the key on error).
absl::StatusOr<DrafterConfig> ParseDrafterConfig(const std::string& json_text,
                                                 const std::string& source = "config.json");

// Per-request drafting state: context K/V of every layer for positions [0, context_len).
class DraftCache;

class DFlashDrafter {
 public:
  // Loads config.json + *.safetensors from `dir` (fc, hidden_norm, norm, layers.*).
  static absl::StatusOr<std::unique_ptr<DFlashDrafter>> Load(const std::string& dir,
                                                             at::ScalarType dtype,
                                                             const at::Device& device);
  ~DFlashDrafter();

  const DrafterConfig& config() const;
  // The target's embedding [V, H_target] and lm_head [V, H_target] (H_target == drafter hidden).
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head);

  std::unique_ptr<DraftCache> NewCache(int64_t capacity) const;

  // Appends context rows: features [n, num_target_layers_used × H] (target states of
  // target_layer_ids concatenated in that order) for positions [cache.length, cache.length + n).
  void AppendContext(DraftCache& cache, const at::Tensor& features);

  // Drafts one block at positions [start, start + B) with block ids [anchor, MASK...], attending
  // to the cached context (which must cover exactly [0, start)). Returns logits [B−1, V] for
  // draft positions 1..B−1 (fp32).
  at::Tensor DraftBlock(DraftCache& cache, int64_t anchor_token, int64_t start);
  // The forward without the head: final-normed hidden states [B, H] (parity tests).
  at::Tensor DraftHidden(DraftCache& cache, int64_t anchor_token, int64_t start);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specwire
