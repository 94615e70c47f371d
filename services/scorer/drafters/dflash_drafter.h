// The DFlash block-diffusion drafter in libtorch (z-lab's and speculators' formats; DFlash2's
// convolutions and candidate selector), and its config.
//
// Architecture (oracle: dflash 0.1.0 `dflash/model.py`): target
// features of target_layer_ids are concatenated, fused once by fc + hidden_norm into context rows;
// every drafter layer is a Qwen3 layer whose attention takes queries from the block only and
// keys/values from [context rows ; block] (k_norm and RoPE on context keys too, at the context
// rows' absolute positions; block slot i sits at position start + i). The block
// [anchor, MASK × (B−1)] is embedded with the TARGET's embed_tokens; logits come from the TARGET's
// lm_head on the last B−1 positions. The draft cache keeps the context keys/values only: block
// K/V are written past the cache's length and overwritten by the next context rows, which is
// dflash's `past_key_values_draft.crop(start)`.
//
// Masks (dflash 0.1.0 `Qwen3DFlashAttention`): a layer is causal when config.json says
// `is_causal: true`, or, without that key, when it is a sliding_attention layer; a sliding layer
// also limits keys to `query_pos − key_pos < sliding_window` (and `key_pos − query_pos <
// sliding_window` when it is not causal). Full, non-causal layers see every context row and the
// whole block (bidirectional). Since context rows all lie before the block, "causal" only
// restricts keys inside the block.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint.h"
#include "common/model_config.h"
#include "services/scorer/drafters/block_drafter.h"
#include "services/scorer/drafters/registry.h"

namespace specwire {

struct DrafterConfig {
  // The drafter's own Qwen3 layers (model_type qwen3), parsed by ParseModelConfig (YaRN rope
  // included: common/models/rope.cc computes it for targets and drafters alike). sliding_window is 0 (no window) unless the config sets
  // use_sliding_window: true and a sliding_window, as transformers' Qwen3Config does.
  ModelConfig layers;
  int32_t block_size = 16;
  int64_t num_target_layers = 0;          // 0 when config.json does not say
  std::vector<int64_t> target_layer_ids;  // decoder-layer ids of the target (HF hidden_states[k+1])
  int64_t mask_token_id = 0;
  // dflash's semantics: `is_causal` from config.json when present; otherwise sliding layers are
  // causal within the block and full layers bidirectional.
  std::optional<bool> is_causal;
  // dflash_config extras (newer z-lab code; defaults are no-ops).
  double input_embedding_scale = 1.0;
  double output_multiplier = 1.0;
  double final_logit_softcapping = 0.0;  // 0: none
  // The checkpoint's format: "z-lab" (dflash_config) or "speculators" (speculators_model_type
  // "dflash": transformer_layer_config nested, aux_hidden_state_layer_ids as HF hidden-state
  // indices, i.e. target_layer_ids + 1; an optional draft vocabulary with its own lm_head).
  std::string format = "z-lab";
  int64_t draft_vocab_size = 0;  // 0: the target's vocabulary and lm_head
  // What target layer id L − 1 stands for: HF hidden_states[L], the final-norm output (z-lab's
  // offset of one), or the last layer's output before the norm (speculators / vLLM).
  bool last_layer_is_final_norm = true;
  // Sliding layers limit the context per query (z-lab: q_pos − k_pos < window) or, as
  // speculators' mask does, to the `window` positions before the block's anchor for every query.
  bool window_from_anchor = false;
  // DFlash2 (z-lab's DFlash2DraftModel; speculators' "dflash2"): around every attention and MLP
  // sublayer a grouped dynamic causal convolution over the block (conv_kernel_size taps, one
  // dynamic coefficient per conv_group_size channels, from the sublayer's normed input), and a
  // candidate selector that walks one path over the selector_top_k drafts of each position,
  // scoring a successor b after its predecessor a by U(b) + <A(a) ⊙ P h, B(b)> (rank
  // selector_rank).
  bool dflash2 = false;
  // DSpark (speculators_model_type "dspark"; SpecForge's dflash_config.projector_type "dspark"):
  // this backbone plus heads of its own (markov_head.*, confidence_head.*), which
  // dspark_drafter.cc reads; Load leaves their tensors to it.
  bool dspark = false;
  // Domino (SpecForge's DominoDraftModel, dflash_config.projector_type "domino"): this backbone
  // plus its GRU logit correction (prefix_gru.*, embed_proj.*, or under logit_head.), which
  // domino_drafter.cc reads; Load leaves their tensors to it.
  bool domino = false;
  // XPress (speculators_model_type "xpress"): this backbone plus its causal refiner
  // (refiner_head.*), which xpress_drafter.cc reads; Load leaves its tensors to it.
  bool xpress = false;
  // Slot 0 of the block (the anchor's) predicts too: slot k drafts position start + k + 1, so a
  // block of B slots drafts B tokens (speculators' DSpark default).
  bool sample_from_anchor = false;
  int64_t conv_kernel_size = 0;
  int64_t conv_group_size = 0;
  int64_t selector_rank = 0;
  int64_t selector_top_k = 0;

  // fc input width per target layer: dflash builds fc as Linear(len(ids) × hidden, hidden), so
  // the target's hidden size must equal the drafter's.
  int64_t target_hidden_size() const;
  bool LayerIsCausal(int64_t layer) const;
  int64_t LayerWindow(int64_t layer) const;  // 0: unlimited
};

// Parses a drafter's config.json (INVALID_ARGUMENT naming the key on error). dflash reads its
// own keys from `dflash_config` first and from the top level second (`_draft_value`); so do we.
// target_layer_ids defaults to dflash's build_target_layer_ids(num_target_layers,
// num_hidden_layers).
absl::StatusOr<DrafterConfig> ParseDrafterConfig(const std::string& json_text,
                                                 const std::string& source = "config.json");

// dflash's default layer choice for a drafter without target_layer_ids (Python round():
// half to even).
std::vector<int64_t> BuildTargetLayerIds(int64_t num_target_layers, int64_t num_draft_layers);

// Checks that a drafter fits a target: same hidden size, layer ids inside the target,
// num_target_layers (when given) equal to the target's, mask token inside the vocabulary.
// INVALID_ARGUMENT names both sides.
absl::Status CheckDrafterFitsTarget(const DrafterConfig& drafter, const ModelConfig& target);

// Per-request drafting state: context K/V of every layer for positions [0, length()), plus
// scratch room for one block after them. Grows on demand. Owned by the caller; used with the
// drafter that made it (one drafter serves any number of caches, from any threads, as long as
// each cache is used by one thread at a time).
class DraftCache {
 public:
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

 private:
  friend class DFlashDrafter;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<at::Tensor> k_, v_;  // per layer [1, kv_heads, capacity, head_dim]
};

class DFlashDrafter {
 public:
  // Loads config.json + *.safetensors from `dir` (fc, hidden_norm, norm, layers.*). Every
  // expected tensor must be there with its shape; any other tensor is an error naming it.
  static absl::StatusOr<std::unique_ptr<DFlashDrafter>> Load(const std::string& dir,
                                                             at::ScalarType dtype,
                                                             const at::Device& device);
  ~DFlashDrafter();

  const DrafterConfig& config() const;
  at::ScalarType dtype() const;
  const at::Device& device() const;
  // The target's embedding [V, H_target] and lm_head [V, H_target] (H_target == drafter hidden).
  // The tensors are shared, not copied (converted only when dtype or device differ).
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head);

  std::unique_ptr<DraftCache> NewCache(int64_t capacity) const;

  // Appends context rows: features [n, num_target_layers_used × H] (target states of
  // target_layer_ids concatenated in that order) for positions [cache.length, cache.length + n).
  void AppendContext(DraftCache& cache, const at::Tensor& features) const;
  // The same for several caches at once (one fc and one k/v projection for all their rows).
  void AppendContext(const std::vector<DraftCache*>& caches,
                     const std::vector<at::Tensor>& features) const;

  // Drafts one block at positions [start, start + len) with block ids [anchor, MASK...],
  // attending to the cached context (which must cover exactly [0, start)). len defaults to B;
  // dflash drafts a shorter block when fewer than B positions are left before max_length.
  // Returns logits [len−1, V] for draft positions 1..len−1 (fp32). Throws c10::Error on misuse
  // (callers at the edge wrap it in RunGuarded).
  at::Tensor DraftBlock(DraftCache& cache, int64_t anchor_token, int64_t start,
                        int64_t len = 0) const;
  // The forward without the head: final-normed hidden states [len, H] (parity tests).
  at::Tensor DraftHidden(DraftCache& cache, int64_t anchor_token, int64_t start,
                         int64_t len = 0) const;
  // One block per cache, all of the same length, in one forward (the projections and the MLP
  // see R × len rows; attention runs per cache): [R, len, H]. Blocks are independent: each
  // row equals what the single-cache call gives, up to the rounding of larger matrix products.
  at::Tensor DraftHidden(const std::vector<DraftCache*>& caches,
                         const std::vector<int64_t>& anchor_tokens,
                         const std::vector<int64_t>& starts, int64_t len = 0) const;
  // The head on hidden states [..., H]: lm_head, output_multiplier, softcapping → fp32 [..., V].
  at::Tensor Logits(const at::Tensor& hidden) const;
  // The same over the drafter's own output vocabulary (its draft vocabulary when it has one:
  // fp32 [..., output_vocab_size()]), and those logits spread onto the target's (−inf outside).
  at::Tensor HeadLogits(const at::Tensor& hidden) const;
  at::Tensor ToTargetVocabulary(const at::Tensor& head_logits) const;
  int64_t output_vocab_size() const;
  // The checkpoint it was loaded from (families built on this backbone read their heads here).
  const Checkpoint& checkpoint() const;
  // DFlash2's walk over its selector (z-lab's CandidateSelector): positions 1..len−1 from their
  // final-normed hidden states [len − 1, H] and logits [len − 1, V] (Logits of them), after
  // `anchor`. Position t's candidates are the top selector_top_k of its logits, scored
  // S_t(a, b) = logit_t(b) + <A(a) ⊙ P h_t, B(b)> from its predecessor a: the anchor at t = 0,
  // then given[t − 1] (teacher forcing, or the drafts sampled so far), or past given's end (or
  // where it holds −1) the walk's own greedy choice. Returns the greedy choices (the path: at
  // temperature 0 with no `given`, the drafts), and in *scores [len − 1, V] fp32 each
  // position's scores at its candidates, −inf elsewhere: the logits of the proposal q that
  // vLLM's DFlash2 samples from by inverse CDF at T > 0 (softmax of scores / T over the K).
  std::vector<int64_t> SelectPath(const at::Tensor& hidden, const at::Tensor& logits,
                                  int64_t anchor, std::span<const int64_t> given = {},
                                  at::Tensor* scores = nullptr) const;

  // RoPE inverse frequencies [rotary_dim / 2] (fp32) and cos/sin scaling (YaRN), for tests.
  const at::Tensor& inv_freq() const;
  double attention_scaling() const;

 private:
  DFlashDrafter();
  void EnsureCapacity(DraftCache& cache, int64_t needed) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The drafter behind the replay's BlockDrafter interface (not owned): DFlash's block, or
// DFlash2's selector path.
std::unique_ptr<BlockDrafter> MakeBlockDrafter(const DFlashDrafter* drafter);

// A family built on this backbone with heads of its own over a block's slots (DSpark's Markov
// and confidence heads, Domino's GRU correction).
class BackboneHeads {
 public:
  struct Block {
    at::Tensor logits;      // [len − 1, Vd] fp32, over the head's vocabulary
    at::Tensor confidence;  // [len − 1] fp32 predicted acceptance, undefined without one
  };
  virtual ~BackboneHeads() = default;
  virtual const DFlashDrafter& backbone() const = 0;
  // The target's embedding and lm_head for the backbone, and for heads that read them
  // (Drafter::SetTargetHead's contract).
  virtual absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) = 0;
  // Block slots a block of len positions (the anchor and len − 1 drafts) runs.
  virtual int64_t Slots(int64_t len) const = 0;
  virtual int32_t block_size() const = 0;
  virtual bool conditions_on_drafts() const = 0;
  // One block's drafting from the backbone's states of its Slots(len) slots [S, H] and the
  // anchor. Position k's previous token is given[k − 2] for k ≥ 2 while `given` lasts (−1: its
  // own), then the argmax of position k − 1; drafts, when not null, receives each position's
  // argmax (the target's ids).
  // `before_anchor` is the token before the anchor (−1 when the context does not say).
  virtual Block Heads(const at::Tensor& slots, int64_t anchor, int64_t before_anchor,
                      std::span<const int64_t> given,
                      std::vector<int64_t>* drafts = nullptr) const = 0;
};

// Such a family's drafting (not owned): one backbone forward per block, then its heads; the
// context projection is batched over sessions. Inspect gives "hidden", "head_logits" and
// "confidence" (when the heads predict one).
std::unique_ptr<BlockDrafter> MakeHeadsBlockDrafter(const BackboneHeads* heads);

// A family on this backbone as a Drafter, from its loaded heads (the load's error passes
// through): the DrafterSpec fields it shares with DFlash, the heads' block_size, and the family's
// method, format and tree (kTreeDDTree, or "" where positions condition on the drafts before
// them).
absl::StatusOr<std::unique_ptr<Drafter>> MakeHeadsFamilyDrafter(
    const std::string& dir, absl::StatusOr<std::unique_ptr<BackboneHeads>> heads,
    std::string method, std::string format, std::string tree);

// The family rows (registry.h): DFlash, and DFlash2 (DFlash's drafter with its convolutions and
// selector switched on).
const DrafterFamily& DFlashFamily();
const DrafterFamily& DFlash2Family();

}  // namespace specwire
