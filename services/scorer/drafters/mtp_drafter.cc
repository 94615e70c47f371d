#include "services/scorer/drafters/mtp_drafter.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint.h"
#include "common/json_reader.h"
#include "common/model_config.h"
#include "common/models/attention.h"
#include "common/models/llama.h"
#include "common/models/qwen3_5.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "services/scorer/drafters/draft_weights.h"
#include "services/scorer/drafters/eagle3_drafter.h"

namespace specwire {
namespace {

using json = nlohmann::json;

enum class MtpFormat { kTarget, kSpeculators };

// Where each part of the head lives in a format's checkpoint.
struct MtpNames {
  const char* fc;
  const char* embedding_norm;
  const char* hidden_norm;
  const char* final_norm;
  const char* layer;  // prefix of the decoder layer's own tensors
};
constexpr MtpNames kTargetNames{"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight",
                                "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
                                "mtp.layers.0."};
constexpr MtpNames kSpeculatorsNames{
    "mtp_layers.0.input_proj.weight", "mtp_layers.0.token_layernorm.weight",
    "mtp_layers.0.hidden_layernorm.weight", "mtp_layers.0.final_layernorm.weight",
    "mtp_layers.0."};

struct MtpConfig {
  MtpFormat format = MtpFormat::kTarget;
  // The head's layer architecture: the target's text config (its own, or speculators'
  // transformer_layer_config), num_layers the target's depth.
  ModelConfig layer;
  int64_t layer_index = 0;  // the full-attention layer of `layer` the head is built as
  int32_t speculative_tokens = 0;
  // Drafts per chain when the checkpoint does not say (speculators' default steps).
  static constexpr int32_t kDefaultDrafts = 3;
  int32_t drafts() const { return speculative_tokens > 0 ? speculative_tokens : kDefaultDrafts; }
  const MtpNames& names() const {
    return format == MtpFormat::kTarget ? kTargetNames : kSpeculatorsNames;
  }
  NormKind norm() const {
    return layer.family == ModelFamily::kQwen3_5 ? NormKind::kOnePlusWeight : NormKind::kPlain;
  }
};

const char* FormatName(MtpFormat f) { return f == MtpFormat::kTarget ? "target" : "speculators"; }

// The config a target keeps its text model's keys in (a VLM package's text_config).
JsonReader TextConfig(const JsonReader& root) {
  return root.Has("text_config") && root.raw()["text_config"].is_object()
             ? root.Member("text_config")
             : root;
}

absl::StatusOr<std::optional<MtpFormat>> DetectMtp(const json& doc, const std::string& source) {
  const JsonReader root(doc, source);
  if (root.Has("speculators_model_type")) {
    SW_ASSIGN_OR_RETURN(std::string type, root.String("speculators_model_type"));
    if (type != "mtp") return std::optional<MtpFormat>();
    return std::optional<MtpFormat>(MtpFormat::kSpeculators);
  }
  const JsonReader text = TextConfig(root);
  if (!text.Has("mtp_num_hidden_layers")) return std::optional<MtpFormat>();
  SW_ASSIGN_OR_RETURN(int64_t n, text.Int("mtp_num_hidden_layers"));
  if (n == 0) return std::optional<MtpFormat>();
  if (n != 1) {
    return text.Error("mtp_num_hidden_layers",
                      absl::StrCat("is ", n, "; specwire drafts with a checkpoint's single MTP "
                                   "layer (mtp.layers.0), as Qwen3.5 / Qwen3.6 ship it"));
  }
  return std::optional<MtpFormat>(MtpFormat::kTarget);
}

// The layer the head is built as: the last full-attention layer of a hybrid (speculators picks
// it so), layer 0 otherwise.
absl::StatusOr<int64_t> HeadLayerIndex(const ModelConfig& c, const JsonReader& where) {
  if (c.family != ModelFamily::kQwen3_5) return 0;
  for (int64_t i = c.num_layers - 1; i >= 0; --i) {
    if (c.layer_types[i] == LayerType::kFullAttention) return i;
  }
  return where.Error("layer_types", "has no full_attention layer; an MTP head is one");
}

absl::StatusOr<MtpConfig> ParseMtpConfig(const std::string& text, const std::string& source) {
  SW_ASSIGN_OR_RETURN(json doc, JsonReader::Parse(text, source));
  SW_ASSIGN_OR_RETURN(std::optional<MtpFormat> format, DetectMtp(doc, source));
  if (!format) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not an MTP drafter (neither speculators_model_type \"mtp\" nor a target "
                "config with mtp_num_hidden_layers: 1)"));
  }
  const JsonReader root(doc, source);
  MtpConfig c;
  c.format = *format;
  JsonReader where = TextConfig(root);
  if (c.format == MtpFormat::kSpeculators) {
    SW_ASSIGN_OR_RETURN(where, root.Object("transformer_layer_config"));
    SW_ASSIGN_OR_RETURN(int64_t heads, root.Int("num_nextn_predict_layers", 1));
    if (heads != 1) {
      return root.Error("num_nextn_predict_layers",
                        absl::StrCat("is ", heads, "; speculators' MTP format has one head"));
    }
    SW_ASSIGN_OR_RETURN(c.layer, ParseModelConfig(where.raw().dump(),
                                                  absl::StrCat(source, " transformer_layer_config")));
    if (root.Has("speculators_config")) {
      SW_ASSIGN_OR_RETURN(JsonReader sc, root.Object("speculators_config"));
      SW_ASSIGN_OR_RETURN(c.speculative_tokens, SpeculativeTokensOf(sc));
    }
  } else {
    SW_ASSIGN_OR_RETURN(c.layer, ParseModelConfig(text, source));
  }
  if (c.layer.family == ModelFamily::kQwen2) {
    return where.Error("model_type", absl::StrCat("is \"", c.layer.model_type,
                                                  "\"; MTP heads here are qwen3, llama or "
                                                  "qwen3_5_text layers"));
  }
  SW_ASSIGN_OR_RETURN(c.layer_index, HeadLayerIndex(c.layer, where));
  return c;
}

// ---------------------------------------------------------------------------------------------

struct MtpHead {
  MtpConfig config;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  std::unique_ptr<Checkpoint> checkpoint;  // the weights are views of its mapped files
  std::unique_ptr<DecoderLayer> layer;
  at::Tensor fc_w, embedding_norm, hidden_norm, final_norm;
  at::Tensor embed_tokens, lm_head;  // the target's (SetTargetHead)
  std::vector<std::string> tensors;  // the checkpoint tensors that became the head

  int64_t H() const { return config.layer.hidden_size; }
  at::Tensor Norm(const at::Tensor& x, const at::Tensor& w) const {
    return RmsNorm(x, w, config.layer.rms_norm_eps, config.norm());
  }

  void ForEachWeight(const WeightVisitor& visit) {
    const MtpNames& n = config.names();
    const int64_t h = H();
    visit({n.fc, {h, 2 * h}, &fc_w});
    visit({n.embedding_norm, {h}, &embedding_norm});
    visit({n.hidden_norm, {h}, &hidden_norm});
    visit({n.final_norm, {h}, &final_norm});
    layer->ForEachWeight([&](const WeightSlot& slot) {
      WeightSlot named = slot;
      named.name = absl::StrCat(n.layer, slot.name);
      visit(named);
    });
  }

  // Rows (hidden states g [n, H], tokens [n]) at positions [past, past + n) through the head,
  // their K/V into `cache`: the normed outputs y [n, H].
  at::Tensor Rows(KvCache& cache, int64_t past, const at::Tensor& g,
                  std::span<const int64_t> tokens) const {
    const int64_t n = g.size(0);
    at::Tensor ids = at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::kLong);
    at::Tensor e = embed_tokens.index_select(0, ids.to(device));
    at::Tensor x = at::linear(at::cat({Norm(e, embedding_norm), Norm(g, hidden_norm)}, -1), fc_w);
    const ForwardContext ctx(past, n, dtype);
    at::Tensor y = layer->Forward(x.unsqueeze(0), ctx, &cache).squeeze(0);
    return Norm(y, final_norm);
  }

  at::Tensor Logits(const at::Tensor& y) const { return at::linear(y, lm_head).to(at::kFloat); }
};

absl::StatusOr<std::unique_ptr<MtpHead>> LoadMtpHead(const std::string& dir, at::ScalarType dtype,
                                                     const at::Device& device) {
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  auto m = std::make_unique<MtpHead>();
  SW_ASSIGN_OR_RETURN(m->config, ParseMtpConfig(config_file.text, config_file.path));
  m->dtype = dtype;
  m->device = device;
  const ModelConfig& lc = m->config.layer;
  auto rope = std::make_shared<const RotaryEmbedding>(lc.rope, lc.head_dim);
  if (lc.family == ModelFamily::kQwen3_5) {
    m->layer = std::make_unique<GatedAttentionLayer>(lc, rope, dtype, KernelSet::kReference);
  } else {
    m->layer = std::make_unique<LlamaDecoderLayer>(lc, m->config.layer_index, rope, dtype,
                                                   KernelSet::kReference);
  }
  SW_ASSIGN_OR_RETURN(m->checkpoint, Checkpoint::Open(dir));
  const Checkpoint* checkpoint = m->checkpoint.get();
  const MtpFormat format = m->config.format;
  absl::Status status = RunGuarded(absl::StrCat("loading MTP drafter ", dir), [&]() -> absl::Status {
    std::set<std::string> consumed;
    SW_RETURN_IF_ERROR(LoadDraftWeights(
        *checkpoint, dir, "MTP", [&](const WeightVisitor& v) { m->ForEachWeight(v); }, dtype,
        consumed));
    // The target format's other tensors are the target's; speculators' holds the head alone.
    for (const auto& [name, view] : checkpoint->tensors()) {
      (void)view;
      if (consumed.count(name)) continue;
      const bool head = format == MtpFormat::kTarget ? name.starts_with("mtp.") : true;
      if (!head || name.ends_with("rotary_emb.inv_freq") || name.starts_with("verifier_")) {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "unexpected tensor \"", name, "\" in MTP drafter ", dir, " (", FormatName(format),
          " format: ", format == MtpFormat::kTarget ? "mtp.layers.0 and mtp.{fc,norm,pre_fc_norm_*}"
                                                    : "mtp_layers.0.*",
          ")"));
    }
    m->tensors.assign(consumed.begin(), consumed.end());
    for (at::Tensor* t : {&m->fc_w, &m->embedding_norm, &m->hidden_norm, &m->final_norm}) {
      *t = t->to(device, dtype).contiguous();
    }
    m->layer->Prepare(device);
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return m;
}

// One response: the head's KV cache over the context rows, and the last row's output (the
// first draft's state). With tree options, each block is EAGLE's top-k tree grown by the head
// (SGLang's EAGLE worker over an MTP head with speculative_eagle_topk > 1), not a chain.
class MtpSession : public DraftSession {
 public:
  MtpSession(const MtpHead* head, int64_t capacity,
             std::optional<Eagle3TreeOptions> tree = std::nullopt,
             std::vector<DraftTree>* trees = nullptr)
      : head_(head), cache_(1, 1, 1, 1, head->dtype, head->device), tree_(tree), trees_(trees) {
    Reserve(std::max<int64_t>(capacity, 16));
  }

  void AppendContext(const at::Tensor& features, std::span<const int64_t> next_tokens) override {
    const int64_t n = features.size(0);
    TORCH_CHECK(head_->embed_tokens.defined(), "MTP drafter: no target head (SetTargetHead)");
    TORCH_CHECK(features.dim() == 2 && features.size(1) == head_->H(),
                "MTP context features must be [n, ", head_->H(),
                "] (the target's final-normed last hidden state), got ", features.sizes());
    TORCH_CHECK(static_cast<int64_t>(next_tokens.size()) == n, "MTP context: ", n, " rows but ",
                next_tokens.size(), " next tokens");
    if (n == 0) return;
    c10::InferenceMode guard;
    // A row whose next token is unknown (the trajectory's end) takes token 0: no chain starts
    // from it.
    std::vector<int64_t> tokens(next_tokens.begin(), next_tokens.end());
    for (int64_t& t : tokens) {
      TORCH_CHECK(t >= -1 && t < head_->embed_tokens.size(0), "MTP context: token ", t,
                  " outside the vocabulary");
      if (t < 0) t = 0;
    }
    Reserve(length_ + n + 16);
    at::Tensor y = head_->Rows(cache_, length_, features.to(head_->device, head_->dtype), tokens);
    length_ += n;
    last_ = y.narrow(0, n - 1, 1).clone();
  }

  at::Tensor DraftLogits(int64_t anchor, int64_t start, int64_t len,
                         std::span<const int64_t> given) override {
    TORCH_CHECK(!tree_, "an MTP tree has no block logits (tree acceptance only)");
    return Chain(anchor, start, len, given, {}, nullptr);
  }

  int64_t AcceptedDrafts(int64_t anchor, int64_t start, int64_t len,
                         const std::vector<int64_t>& truth) override {
    if (tree_) {
      TORCH_CHECK(start == length_, "MTP tree at ", start, " but the context covers [0, ",
                  length_, ")");
      DraftTree tree = Tree(static_cast<int32_t>(len - 1));
      const int64_t a = tree.Accepted(truth);
      if (trees_ != nullptr) trees_->push_back(std::move(tree));
      return a;
    }
    int64_t accepted = 0;
    Chain(anchor, start, len, {}, truth, &accepted);
    return accepted;
  }

  std::map<std::string, at::Tensor> Inspect() const override { return {{"hidden", hidden_}}; }

 private:
  // len − 1 drafts after the context: target-vocabulary logits [len − 1, V] (fp32). Step k ≥ 1
  // is one row at position start − 1 + k (slot start + k − 1, scratch the next context
  // overwrites) pairing the previous step's output with given[k − 1] (its own argmax draft
  // past given's end or where given holds −1). With `stop_at`, drafting stops after the first
  // draft that differs from it (later rows stay zero).
  at::Tensor Chain(int64_t anchor, int64_t start, int64_t len, std::span<const int64_t> given,
                   std::span<const int64_t> stop_at, int64_t* accepted) {
    (void)anchor;  // the last context row already paired its state with it
    TORCH_CHECK(start == length_, "MTP chain at ", start, " but the context covers [0, ", length_,
                ")");
    TORCH_CHECK(length_ >= 1, "MTP: a chain needs at least one context row");
    TORCH_CHECK(len >= 2, "MTP: a chain of ", len - 1, " drafts");
    c10::InferenceMode guard;
    Reserve(length_ + len);
    const int64_t V = head_->lm_head.size(0);
    at::Tensor out = at::zeros({len - 1, V}, at::kFloat);
    hidden_ = at::zeros({len - 1, head_->H()}, at::kFloat);
    at::Tensor y = last_;
    int64_t a = len - 1;
    for (int64_t k = 0; k < len - 1; ++k) {
      if (k > 0) {
        const int64_t forced = k - 1 < static_cast<int64_t>(given.size()) ? given[k - 1] : -1;
        TORCH_CHECK(forced >= -1 && forced < V, "MTP: token ", forced, " outside the vocabulary");
        const int64_t token[1] = {forced >= 0 ? forced : out[k - 1].argmax().item<int64_t>()};
        y = head_->Rows(cache_, length_ + k - 1, y, token);
      }
      out[k].copy_(head_->Logits(y).reshape({-1}).to(at::kCPU));
      hidden_[k].copy_(y.reshape({-1}).to(at::kCPU, at::kFloat));
      if (!stop_at.empty() && out[k].argmax().item<int64_t>() != stop_at[k]) {
        a = k;
        break;
      }
    }
    if (accepted != nullptr) *accepted = a;
    return out;
  }

  // EAGLE's top-k tree of `levels` ≤ depth levels after the context: the root's top_k drafts;
  // at each further level the top_k nodes of the level before (by cumulative log-probability)
  // expanded into top_k children each; the total_tokens best nodes kept. A node of level L has
  // its row at slot length_ + L − 1 (the chain's slot for that depth) pairing its parent's output
  // with its token, so it attends to the context and to its ancestors' rows, which are copied
  // back into slots length_ .. length_ + L − 2 first: the chain's arithmetic along every path.
  DraftTree Tree(int32_t levels) {
    const Eagle3TreeOptions& o = *tree_;
    TORCH_CHECK(length_ >= 1, "MTP: a tree needs at least one context row");
    TORCH_CHECK(o.depth >= 1 && o.top_k >= 1 && o.total_tokens >= 1,
                "MTP tree: depth, top_k and total_tokens must be positive");
    levels = std::min(levels, o.depth);
    TORCH_CHECK(levels >= 1, "MTP tree of ", levels, " levels");
    c10::InferenceMode guard;
    Reserve(length_ + levels + 1);
    std::vector<at::Tensor> out, key, value;  // per expanded node: its row's output and K/V
    auto log_probs = [&](const at::Tensor& y) {
      return at::log_softmax(head_->Logits(y).reshape({-1}), -1).to(at::kCPU);
    };
    auto expand = [&](const DraftTree& tree, int64_t f) {
      out.resize(tree.token.size());
      key.resize(tree.token.size());
      value.resize(tree.token.size());
      for (int64_t a = tree.parent[f]; a >= 0; a = tree.parent[a]) {
        const int64_t slot = length_ + tree.level[a] - 1;
        cache_.k.narrow(2, slot, 1).copy_(key[a]);
        cache_.v.narrow(2, slot, 1).copy_(value[a]);
      }
      const int64_t slot = length_ + tree.level[f] - 1;
      const at::Tensor& parent = tree.parent[f] >= 0 ? out[tree.parent[f]] : last_;
      const int64_t token[1] = {tree.token[f]};
      out[f] = head_->Rows(cache_, slot, parent, token);
      key[f] = cache_.k.narrow(2, slot, 1).clone();
      value[f] = cache_.v.narrow(2, slot, 1).clone();
      return log_probs(out[f]);
    };
    return GrowTopKTree(levels, o.top_k, o.total_tokens, log_probs(last_), expand,
                        [](int64_t t) { return t; });
  }

  void Reserve(int64_t needed) {
    if (needed <= capacity_) return;
    const int64_t cap = std::max<int64_t>(needed, capacity_ * 2);
    std::vector<at::Tensor> k, v;
    if (capacity_ > 0) {
      k.push_back(cache_.k);
      v.push_back(cache_.v);
    }
    const ModelConfig& c = head_->config.layer;
    GrowKv(k, v, 1, c.num_kv_heads, c.head_dim, length_, cap,
           at::TensorOptions().dtype(head_->dtype).device(head_->device));
    cache_.k = k[0];
    cache_.v = v[0];
    capacity_ = cap;
  }

  const MtpHead* head_;
  KvCache cache_;
  int64_t capacity_ = 0;
  int64_t length_ = 0;
  at::Tensor last_;    // [1, H]: the last context row's output
  at::Tensor hidden_;  // the last chain's outputs (Inspect)
  std::optional<Eagle3TreeOptions> tree_;
  std::vector<DraftTree>* trees_;
};

class MtpBlockDrafter : public BlockDrafter {
 public:
  MtpBlockDrafter(const MtpHead* head, int32_t block_size,
                  std::optional<Eagle3TreeOptions> tree = std::nullopt,
                  std::vector<DraftTree>* trees = nullptr)
      : head_(head), block_size_(block_size), tree_(tree), trees_(trees) {}
  int32_t block_size() const override { return block_size_; }
  bool conditions_on_drafts() const override { return true; }  // a chain, or a tree
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return std::make_unique<MtpSession>(head_, capacity, tree_, trees_);
  }

 private:
  const MtpHead* head_;
  int32_t block_size_;
  std::optional<Eagle3TreeOptions> tree_;
  std::vector<DraftTree>* trees_;
};

class MtpFamilyDrafter : public Drafter {
 public:
  MtpFamilyDrafter(std::unique_ptr<MtpHead> head, const std::string& dir, std::string config_json)
      : head_(std::move(head)) {
    const MtpConfig& c = head_->config;
    DrafterSpec& s = spec_;
    s.path = dir;
    s.config_json = std::move(config_json);
    s.method = "mtp";
    s.format = FormatName(c.format);
    s.tree = kTreeEagle;  // its chain, or EAGLE's top-k tree grown by the head
    s.uses_mask_token = false;
    s.needs_target_head = true;
    s.autoregressive = true;
    s.last_layer_is_final_norm = true;  // hidden_states[L], as the engines feed the head
    s.block_size = c.drafts() + 1;
    s.num_layers = 1;
    s.hidden_size = head_->H();
    s.target_hidden_size = head_->H();
    s.fc_in_features = head_->H();
    s.num_target_layers = c.layer.num_layers;
    s.target_layer_ids = {c.layer.num_layers - 1};
    s.mask_token_id = 0;
    s.vocab_size = c.layer.vocab_size;
    s.dtype = ScalarTypeName(head_->dtype);
    s.device = head_->device.str();
    s.tensors = head_->tensors;
  }
  const DrafterSpec& spec() const override { return spec_; }
  at::ScalarType dtype() const override { return head_->dtype; }
  const at::Device& device() const override { return head_->device; }
  absl::Status FitTargetLayers(int64_t target_layers) override {
    const int64_t own = head_->config.layer.num_layers;
    if (target_layers != own) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the MTP head was built for a target of ", own, " layers (",
          head_->config.format == MtpFormat::kTarget ? "num_hidden_layers"
                                                     : "transformer_layer_config.num_hidden_layers",
          ") but the target has ", target_layers));
    }
    spec_.target_layer_ids = {target_layers - 1};
    return absl::OkStatus();
  }
  absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) override {
    MtpHead& m = *head_;
    for (const auto& [name, t] :
         {std::pair<const char*, const at::Tensor&>{"embed_tokens", embed_tokens},
          {"lm_head", lm_head}}) {
      if (!t.defined() || t.dim() != 2 || t.size(0) != m.config.layer.vocab_size ||
          t.size(1) != m.H()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target ", name, " must be [", m.config.layer.vocab_size, ", ", m.H(),
            "] (the MTP head's vocab_size and hidden_size), got ",
            t.defined() ? absl::StrCat("[", absl::StrJoin(t.sizes(), ", "), "]") : "nothing"));
      }
    }
    return RunGuarded("setting the target head", [&]() -> absl::Status {
      m.embed_tokens = embed_tokens.to(m.device, m.dtype);
      m.lm_head = lm_head.to(m.device, m.dtype);
      return absl::OkStatus();
    });
  }
  std::unique_ptr<BlockDrafter> Chain() override {
    return std::make_unique<MtpBlockDrafter>(head_.get(), spec_.block_size);
  }
  std::unique_ptr<BlockDrafter> Tree(const TreeSettings& trees, int32_t budget,
                                     std::vector<DraftTree>* record) override {
    return std::make_unique<MtpBlockDrafter>(
        head_.get(), trees.depth + 1, Eagle3TreeOptions{trees.depth, trees.top_k, budget}, record);
  }

 private:
  std::unique_ptr<MtpHead> head_;
  DrafterSpec spec_;
};

absl::StatusOr<std::optional<std::string>> DetectMtpFamily(const json& config,
                                                           const std::string& source) {
  SW_ASSIGN_OR_RETURN(std::optional<MtpFormat> f, DetectMtp(config, source));
  if (!f) return std::optional<std::string>();
  return std::optional<std::string>(FormatName(*f));
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadMtpFamily(const std::string& dir, const std::string&,
                                                       at::ScalarType dtype,
                                                       const at::Device& device) {
  return MakeFamilyDrafter<MtpFamilyDrafter>(dir, LoadMtpHead(dir, dtype, device));
}

}  // namespace

const DrafterFamily& MtpFamily() {
  static const DrafterFamily f{"mtp",
                               "MTP heads (a checkpoint's own mtp.* layers; speculators' format)",
                               &DetectMtpFamily, &LoadMtpFamily};
  return f;
}

}  // namespace specwire
