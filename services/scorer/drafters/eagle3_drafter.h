// The EAGLE-3 drafter in libtorch, in both checkpoint formats people train it in:
// vllm-project/speculators (`speculators_model_type: "eagle3"`, layers.{i}.*, Llama or Qwen3
// layers, HF hidden-state indices for the auxiliary layers) and SpecForge
// (`architectures: ["LlamaForCausalLMEagle3"]`, one `midlayer`, 0-based layer-output ids).
//
// Architecture (oracles: speculators 0.9.0 `models/eagle3/core.py`, SpecForge 0.2.0
// `modeling/draft/llama3_eagle.py`): a context row j pairs the target's auxiliary states at
// position j (concatenated in ascending layer order, optionally normed, then fc: A·T → H) with
// the embedding of the token at j + 1. The first layer's attention input is
// [input_layernorm(embedding) ; hidden_norm(hidden)] (2H wide), its residual the hidden input
// (speculators' norm_before_residual: the normed one); further layers (speculators only) are plain
// Llama / Qwen3 layers. Logits over the draft vocabulary come from lm_head(norm(h)) (SpecForge
// with norm_output: false: lm_head(h)); draft id i is target id i + d2t[i].
//
// Drafting a chain at `start` (the context covers [0, start), the last row holding the anchor
// token traj[start]): d_1 comes from the last context row's output; each further step is one row
// (token y_k = the previous draft as a target id, hidden = the previous row's output h, or
// norm(h) with speculators' norm_output) at position P(start − 1) + k that attends to the context
// rows and the chain's earlier rows. P(j) = j + 1 in speculators (the token's position), j in
// SpecForge. Sliding-window layers (speculators' layer_types) limit the context rows to the last
// `sliding_window` before the lane start − 1; chain rows are always visible. This is the
// training-time test-time-training loop of both packages, one lane at a time.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/json_reader.h"
#include "common/model_config.h"
#include "services/scorer/drafters/block_drafter.h"
#include "services/scorer/drafters/registry.h"

namespace specwire {

enum class Eagle3Format { kSpeculators, kSpecForge };
const char* Eagle3FormatName(Eagle3Format f);  // "speculators" | "specforge"

struct Eagle3Config {
  Eagle3Format format = Eagle3Format::kSpeculators;
  // P-EAGLE (speculators_model_type "peagle"; SpecForge's PEagleDraftModel): the same drafter
  // plus one learned auxiliary state, mask_hidden, drafting a whole block in one forward: the
  // block's future slots pair the embedding of mask_token_id with fc(mask_hidden) (the pre-fc
  // norms applied to it too), at consecutive RoPE positions after the anchor's, attending to the
  // context (windowed from their own position) and to each other causally. P(j) = j in both
  // formats; SpecForge's P-EAGLE has num_hidden_layers `layers.{i}` and plain RoPE.
  bool parallel = false;
  int64_t mask_token_id = -1;  // P-EAGLE
  // The drafter's decoder layers (model_type llama or qwen3; vocab_size = the target's vocabulary).
  ModelConfig layers;
  int64_t draft_vocab_size = 0;
  // The auxiliary layers as config.json declares them (speculators: HF hidden_states indices;
  // SpecForge: 0-based decoder-layer outputs); empty when absent (the package's default for the
  // target, resolved by ResolveTargetLayers).
  std::vector<int64_t> declared_aux_ids;
  std::string aux_ids_key;  // the config.json key they came from (for messages)
  // specwire's numbering (decoder-layer outputs, 0-based), ascending: the concatenation order.
  std::vector<int64_t> target_layer_ids;
  int64_t target_hidden_size = 0;  // T: fc takes A·T inputs
  bool norm_before_fc = false;      // speculators: RMSNorm over the A·T concatenation
  bool fc_norm = false;             // an RMSNorm per auxiliary state before fc
  bool norm_before_residual = false;  // speculators
  bool feed_normed_hidden = false;    // speculators' norm_output: the next step gets norm(h)
  bool norm_before_head = true;       // SpecForge's norm_output (false: logits = lm_head(h))
  int64_t position_offset = 1;        // P(j) = j + offset (speculators 1, SpecForge 0)
  int32_t speculative_tokens = 0;     // speculators' proposal length (0: not declared)
  // Drafts per chain: speculative_tokens when declared, else kDefaultDrafts.
  static constexpr int32_t kDefaultDrafts = 5;
  int32_t drafts() const { return speculative_tokens > 0 ? speculative_tokens : kDefaultDrafts; }
  std::string verifier;               // speculators_config.verifier.name_or_path ("" if null)

  // Fills target_layer_ids from the declared ids (or the package's default for a target of
  // `target_layers` layers) in specwire's numbering. INVALID_ARGUMENT naming the key for an id
  // outside the target, a duplicate, or speculators' index 0 (the embedding output).
  absl::Status ResolveTargetLayers(int64_t target_layers);
};

// Whether config.json text declares an EAGLE-3 drafter, and in which format (nullopt: not one).
// INVALID_ARGUMENT for an inconsistent declaration (a speculators type other than eagle3 that
// specwire does not read, both declarations at once), naming the file and key.
absl::StatusOr<std::optional<Eagle3Format>> DetectEagle3(const std::string& json_text,
                                                         const std::string& source);

// The same for P-EAGLE (parallel drafting; the EAGLE-3 family's config with mask_token_id).
absl::StatusOr<std::optional<Eagle3Format>> DetectPEagle(const std::string& json_text,
                                                         const std::string& source);

// speculators_config.proposal_methods[0].speculative_tokens (0 when not declared): a speculators
// checkpoint's proposal length. INVALID_ARGUMENT outside [0, 64], naming the key.
absl::StatusOr<int32_t> SpeculativeTokensOf(const JsonReader& speculators_config);

// Either declaration (Eagle3Config::parallel says which).
absl::StatusOr<Eagle3Config> ParseEagle3Config(const std::string& json_text,
                                               const std::string& source = "config.json");

// Checks an EAGLE-3 drafter against a target: vocabulary, hidden size, layer ids (resolving the
// default ids), draft vocabulary no larger than the target's. INVALID_ARGUMENT names both sides.
absl::Status CheckEagle3FitsTarget(Eagle3Config& drafter, const ModelConfig& target);

// One response's drafting state: per layer K/V of the context rows [0, length()) and scratch room
// for a chain after them; the output of the last context row (its next draft).
class Eagle3Cache {
 public:
  int64_t length() const { return length_; }

 private:
  friend class Eagle3Drafter;
  int64_t length_ = 0;
  int64_t capacity_ = 0;
  std::vector<at::Tensor> k_, v_;  // per layer [1, kv_heads, capacity, head_dim]
  at::Tensor last_hidden_;         // [H]: the last context row's output (pre-norm)
  int64_t last_token_ = -1;        // the token that row paired with (the next anchor)
};

// EAGLE's top-k draft tree (EAGLE-2's dynamic tree, as EAGLE-3 serves it): level 1 holds the
// top_k drafts of the last context row; each further level expands the top_k nodes of the level
// before by cumulative log-probability (the frontier), each into its top_k children; the tree
// keeps the total_tokens nodes of highest cumulative log-probability (log-probabilities add along
// a path, so the kept set holds every kept node's ancestors, ties aside). A node's row attends to
// the context and its ancestors' rows.
struct Eagle3TreeOptions {
  int32_t depth = 5;          // levels of drafts
  int32_t top_k = 8;          // children per expanded node, and nodes expanded per level
  int32_t total_tokens = 32;  // nodes kept for verification
};

// EAGLE's tree of one step is a DraftTree (block_drafter.h).
using Eagle3Tree = DraftTree;

class Eagle3Drafter {
 public:
  // config.json + *.safetensors (or pytorch_model.bin is refused with the conversion named).
  // Every expected tensor must be there with its shape (d2t/t2d when the draft vocabulary is
  // smaller; embed_tokens optional: the target's is used), any other is an error naming it;
  // d2t must map into the target vocabulary and agree with t2d.
  static absl::StatusOr<std::unique_ptr<Eagle3Drafter>> Load(const std::string& dir,
                                                             at::ScalarType dtype,
                                                             const at::Device& device);
  ~Eagle3Drafter();

  const Eagle3Config& config() const;
  Eagle3Config& mutable_config();
  at::ScalarType dtype() const;
  const at::Device& device() const;
  // The target's embedding [V, T] (used when the checkpoint has none of its own).
  absl::Status SetTargetEmbedding(const at::Tensor& embed_tokens);
  bool has_own_embedding() const;

  std::unique_ptr<Eagle3Cache> NewCache(int64_t capacity) const;
  // Context rows for positions [cache.length, cache.length + n): features [n, A·T] (the target's
  // auxiliary states in target_layer_ids order) and next_tokens[i] = the token at position
  // cache.length + i + 1.
  void AppendContext(Eagle3Cache& cache, const at::Tensor& features,
                     std::span<const int64_t> next_tokens) const;
  // A chain of len − 1 drafts after the context (start = cache.length()): draft-vocabulary logits
  // [len − 1, Vd] (fp32). Steps feed back the argmax draft (as a target id), or, when `forced` is
  // given (len − 2 target ids; −1 where the chain's own draft is fed), those tokens (teacher forcing). With
  // `stop_at` (len − 1 target ids, −1 never matches), drafting stops after the first draft that
  // differs from it (the rows after it are not computed and stay zero).
  at::Tensor DraftChain(Eagle3Cache& cache, int64_t len, std::span<const int64_t> forced = {},
                        std::span<const int64_t> stop_at = {}, int64_t* accepted = nullptr) const;
  // P-EAGLE: a block of len − 1 drafts after the context (start = cache.length()) in one
  // forward: draft-vocabulary logits [len − 1, Vd] (fp32), row 0 the last context row's, rows
  // 1.. the future slots'. The cache's length does not change.
  at::Tensor DraftParallel(Eagle3Cache& cache, int64_t len) const;
  // The draft tree after the context (start = cache.length()), at most `levels` deep (≤
  // options.depth; the replay shortens it at max_length).
  Eagle3Tree DraftTree(Eagle3Cache& cache, const Eagle3TreeOptions& options,
                       int32_t levels) const;
  // Draft ids → target ids, and draft-vocabulary logits [..., Vd] → target-vocabulary logits
  // [..., V] (−inf outside the draft vocabulary).
  int64_t ToTarget(int64_t draft_id) const;
  at::Tensor ToTargetLogits(const at::Tensor& draft_logits) const;

 private:
  Eagle3Drafter();
  void EnsureCapacity(Eagle3Cache& cache, int64_t needed) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The drafter behind the replay's BlockDrafter interface (block_drafter.h; not owned): a block of
// length len is a chain of len − 1 drafts; acceptance stops drafting at the first mismatch.
std::unique_ptr<BlockDrafter> MakeBlockDrafter(const Eagle3Drafter* drafter, int32_t block_size);
// The same with tree acceptance: a block of length len is a tree of len − 1 levels (block_size =
// options.depth + 1). Each step's tree is appended to `trees` when given.
std::unique_ptr<BlockDrafter> MakeTreeBlockDrafter(const Eagle3Drafter* drafter,
                                                   const Eagle3TreeOptions& options,
                                                   std::vector<Eagle3Tree>* trees = nullptr);

// The family row (registry.h).
const DrafterFamily& Eagle3Family();

// The Drafter of the families built on Eagle3Drafter (EAGLE-3, P-EAGLE): the spec its config
// gives, its auxiliary layers resolved for the target's depth, the target's embedding (the head
// is its own, over the draft vocabulary). A family sets its method, tree and drafting shape in
// the spec and gives Chain() (and Tree()).
class Eagle3BasedDrafter : public Drafter {
 public:
  Eagle3BasedDrafter(std::unique_ptr<Eagle3Drafter> drafter, const std::string& dir,
                     std::string config_json);
  const DrafterSpec& spec() const override { return spec_; }
  at::ScalarType dtype() const override;
  const at::Device& device() const override;
  absl::Status FitTargetLayers(int64_t target_layers) override;
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override;
  Eagle3Drafter& drafter() { return *drafter_; }

 protected:
  std::unique_ptr<Eagle3Drafter> drafter_;
  DrafterSpec spec_;
};

// DrafterFamily::detect of those families: the format Detect (DetectEagle3, DetectPEagle) finds
// in the config, by name.
absl::StatusOr<std::optional<std::string>> Eagle3FormatOf(
    absl::StatusOr<std::optional<Eagle3Format>> detected);
template <absl::StatusOr<std::optional<Eagle3Format>> (*Detect)(const std::string&,
                                                                const std::string&)>
absl::StatusOr<std::optional<std::string>> DetectEagle3Based(const nlohmann::json& config,
                                                             const std::string& source) {
  return Eagle3FormatOf(Detect(config.dump(), source));
}

// DrafterFamily::load of those families: Eagle3Drafter::Load wrapped in FamilyDrafter.
template <typename FamilyDrafter>
absl::StatusOr<std::unique_ptr<Drafter>> LoadEagle3Based(const std::string& dir,
                                                         const std::string& format,
                                                         at::ScalarType dtype,
                                                         const at::Device& device) {
  (void)format;  // the loader reads the format from the config itself
  return MakeFamilyDrafter<FamilyDrafter>(dir, Eagle3Drafter::Load(dir, dtype, device));
}

}  // namespace specwire
