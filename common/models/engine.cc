#include "common/models/engine.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/enum_names.h"
#include "common/models/host_copies.h"
#include "common/models/torch_util.h"
#include "common/splitmix.h"
#include "common/status.h"

namespace specwire {

absl::StatusOr<std::unique_ptr<ExtractionEngine>> ExtractionEngine::Load(
    const std::string& model_dir, const LoadOptions& options) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> model, LoadModel(model_dir, options));
  auto engine = std::make_unique<ExtractionEngine>(std::move(model));
  if (options.canary_tokens > 0) SW_RETURN_IF_ERROR(engine->ComputeCanary(options.canary_tokens));
  return engine;
}

namespace {

// fp64 statistics of one tap's states; sketch k adds ±x_i by bit k of SplitMix64(i).
TapFingerprint Fingerprint(const std::string& tap, const at::Tensor& states) {
  const at::Tensor x = states.to(at::kCPU, at::kDouble).contiguous();
  const double* p = x.data_ptr<double>();
  const int64_t n = x.numel();
  double sum = 0, sq = 0;
  std::vector<double> sketch(kCanarySketches, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double v = p[i];
    sum += v;
    sq += v * v;
    const uint64_t bits = SplitMix64(static_cast<uint64_t>(i));
    for (int k = 0; k < kCanarySketches; ++k) sketch[k] += ((bits >> k) & 1) ? v : -v;
  }
  TapFingerprint f;
  f.tap = tap;
  if (n > 0) {
    f.mean = sum / n;
    f.rms = std::sqrt(sq / n);
    f.std = std::sqrt(std::max(0.0, sq / n - f.mean * f.mean));
    for (double& s : sketch) s /= std::sqrt(static_cast<double>(n));
  }
  f.sketch = std::move(sketch);
  return f;
}

}  // namespace

absl::Status ExtractionEngine::ComputeCanary(int64_t n) {
  const int64_t L = config().num_layers;
  CanaryFingerprint c;
  c.token_ids = CanaryTokens(config().vocab_size, n);
  c.compute_dtype = contract().compute_dtype;
  CaptureSpec capture;
  capture.embedding = true;
  capture.final_norm = true;
  for (int64_t k = 0; k < L; ++k) capture.layers.push_back(k);
  SW_ASSIGN_OR_RETURN(std::vector<SequenceStates> states,
                      Extract({c.token_ids}, capture, at::kFloat, BatchLayout::kPacked));
  c.taps.push_back(Fingerprint("embedding", states[0].embedding));
  for (int64_t k = 0; k < L; ++k) {
    c.taps.push_back(Fingerprint(absl::StrCat("layer.", k), states[0].layers.at(k)));
  }
  c.taps.push_back(Fingerprint("final_norm", states[0].final_norm));
  model_->contract.canary = std::move(c);
  return absl::OkStatus();
}

absl::Status ExtractionEngine::Validate(const std::vector<std::vector<int64_t>>& sequences,
                                        const CaptureSpec& capture) const {
  if (sequences.empty()) return absl::InvalidArgumentError("sequences: no sequence given");
  const int64_t vocab = config().vocab_size;
  for (size_t s = 0; s < sequences.size(); ++s) {
    if (sequences[s].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequences[", s, "]: empty"));
    }
    for (size_t i = 0; i < sequences[s].size(); ++i) {
      const int64_t t = sequences[s][i];
      if (t < 0 || t >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("sequences[", s, "].token_ids[", i,
                                                       "] = ", t, " is outside the vocabulary [0, ",
                                                       vocab, ")"));
      }
    }
  }
  if (capture.empty()) {
    return absl::InvalidArgumentError(
        "layer_ids: nothing to capture (give layer ids, or the embedding / final_norm tap)");
  }
  for (int64_t id : capture.layers) {
    if (id < 0 || id >= config().num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer_ids: ", id, " is outside [0, ", config().num_layers,
                       ") (layer k = output of decoder layer k = HF hidden_states[k+1]; use the "
                       "final_norm tap for hidden_states[",
                       config().num_layers, "])"));
    }
  }
  return absl::OkStatus();
}

constexpr EnumName<BatchLayout> kBatchLayoutNames[] = {{BatchLayout::kPacked, "packed"},
                                                       {BatchLayout::kPerSequence, "per_sequence"},
                                                       {BatchLayout::kPadded, "padded"}};

absl::StatusOr<BatchLayout> ParseBatchLayout(absl::string_view name, absl::string_view field) {
  if (std::optional<BatchLayout> layout =
          ValueOf(kBatchLayoutNames, std::string_view(name.data(), name.size()))) {
    return *layout;
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": \"", name,
                                                 "\" is not a batch layout (auto, ",
                                                 NamesOf(kBatchLayoutNames, ", "), ")"));
}

const char* BatchLayoutName(BatchLayout layout) { return NameOf(kBatchLayoutNames, layout); }

namespace {

// One sequence's captured rows ([length, hidden] each), on the host in `out_dtype` once
// `copies` has finished.
void TakeStates(const CapturedStates& rows, at::ScalarType out_dtype, HostCopies& copies,
                SequenceStates& o) {
  auto take = [&](const at::Tensor& t) { return copies.Queue(t, out_dtype); };
  if (rows.embedding.defined()) o.embedding = take(rows.embedding);
  for (const auto& [id, t] : rows.layers) o.layers[id] = take(t);
  if (rows.final_norm.defined()) o.final_norm = take(rows.final_norm);
}

// One forward over `sequences` right-padded with token 0 (causal layers never let a real token
// see the padding); each sequence's states go to out[first + b].
void ForwardPadded(DecoderModel& model, const std::vector<std::vector<int64_t>>& sequences,
                   size_t first, size_t count, const CaptureSpec& capture, at::ScalarType out_dtype,
                   HostCopies& copies, std::vector<SequenceStates>& out) {
  const int64_t B = static_cast<int64_t>(count);
  int64_t T = 0;
  for (size_t b = 0; b < count; ++b) T = std::max<int64_t>(T, sequences[first + b].size());
  at::Tensor ids = at::zeros({B, T}, at::kLong);
  auto acc = ids.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) {
    const auto& seq = sequences[first + b];
    for (size_t t = 0; t < seq.size(); ++t) acc[b][t] = seq[t];
  }
  CapturedStates captured;
  model.Forward(ids, nullptr, capture, &captured, LogitsMode::kNone);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = static_cast<int64_t>(sequences[first + b].size());
    TakeStates(captured.Rows(b, 0, len), out_dtype, copies, out[first + b]);
  }
}

}  // namespace

ExtractionEngine::ExtractionEngine(std::unique_ptr<LoadedModel> model) : model_(std::move(model)) {
  SetBatchLayout(DefaultBatchLayout());
}

BatchLayout ExtractionEngine::DefaultBatchLayout() const {
  const DecoderModel& m = *model_->model;
  bool cuda = false;
  for (int64_t i = 0; i < m.num_layers(); ++i) cuda |= m.layer(i).device().is_cuda();
  return cuda ? BatchLayout::kPerSequence : BatchLayout::kPacked;
}

void ExtractionEngine::SetBatchLayout(BatchLayout layout) {
  std::string& k = model_->contract.kernel_variant;
  const size_t at = k.find("; batch layout ");
  if (at != std::string::npos) k.resize(at);
  layout_ = layout;
  const bool invariant =
      layout == BatchLayout::kPerSequence ||
      (layout == BatchLayout::kPacked && DefaultBatchLayout() == BatchLayout::kPacked);
  absl::StrAppend(&k, "; batch layout ", BatchLayoutName(layout),
                  invariant ? " (batch-invariant)" : " (not batch-invariant)");
}

absl::Status ExtractionEngine::SetBatchLayout(absl::string_view name, absl::string_view field) {
  if (name == "auto") {
    SetBatchLayout(DefaultBatchLayout());
    return absl::OkStatus();
  }
  SW_ASSIGN_OR_RETURN(const BatchLayout layout, ParseBatchLayout(name, field));
  SetBatchLayout(layout);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SequenceStates>> ExtractionEngine::Extract(
    const std::vector<std::vector<int64_t>>& sequences, const CaptureSpec& capture,
    at::ScalarType out_dtype) {
  return Extract(sequences, capture, out_dtype, layout_);
}

absl::StatusOr<std::vector<SequenceStates>> ExtractionEngine::Extract(
    const std::vector<std::vector<int64_t>>& sequences, const CaptureSpec& capture,
    at::ScalarType out_dtype, BatchLayout layout) {
  SW_RETURN_IF_ERROR(Validate(sequences, capture));
  std::vector<SequenceStates> out(sequences.size());
  absl::Status status = RunGuarded("extract", [&]() -> absl::Status {
    c10::InferenceMode inference;
    // Each forward's states are copied to the host while the next forward runs (on a GPU).
    HostCopies copies(model().output_device());
    if (layout == BatchLayout::kPadded) {
      // Longest first, grouped while padding at most doubles a group's tokens: one long
      // sequence never makes every short one as long (the memory and work a padded batch costs
      // stay within twice the real tokens).
      std::vector<size_t> order(sequences.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return sequences[a].size() > sequences[b].size();
      });
      std::vector<std::vector<int64_t>> group;
      std::vector<size_t> members;
      std::vector<SequenceStates> group_out;
      int64_t real = 0;
      auto flush = [&] {
        if (group.empty()) return;
        group_out.assign(group.size(), SequenceStates());
        ForwardPadded(model(), group, 0, group.size(), capture, out_dtype, copies, group_out);
        for (size_t k = 0; k < members.size(); ++k) out[members[k]] = std::move(group_out[k]);
        group.clear();
        members.clear();
        real = 0;
      };
      for (size_t i : order) {
        const int64_t len = static_cast<int64_t>(sequences[i].size());
        const int64_t longest = group.empty() ? len : static_cast<int64_t>(group.front().size());
        if (!group.empty() &&
            static_cast<int64_t>(group.size() + 1) * longest > 2 * (real + len)) {
          flush();
        }
        group.push_back(sequences[i]);
        members.push_back(i);
        real += len;
      }
      flush();
    } else if (layout == BatchLayout::kPacked) {
      // In request order, a forward closed before it would pass packed_rows_ tokens.
      std::vector<std::vector<int64_t>> group;
      size_t first = 0;
      int64_t tokens = 0;
      auto flush = [&] {
        if (group.empty()) return;
        std::vector<CapturedStates> states = model().ForwardPacked(group, capture);
        for (size_t k = 0; k < states.size(); ++k) {
          TakeStates(states[k], out_dtype, copies, out[first + k]);
        }
        first += group.size();
        group.clear();
        tokens = 0;
      };
      for (const auto& seq : sequences) {
        const int64_t len = static_cast<int64_t>(seq.size());
        if (!group.empty() && tokens + len > packed_rows_) flush();
        group.push_back(seq);
        tokens += len;
      }
      flush();
    } else {
      for (size_t b = 0; b < sequences.size(); ++b) {
        ForwardPadded(model(), sequences, b, 1, capture, out_dtype, copies, out);
      }
    }
    copies.Finish();
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return out;
}

absl::StatusOr<GenerateResult> ExtractionEngine::Generate(const std::vector<int64_t>& prompt,
                                                          const GenerateOptions& options,
                                                          const TokenCallback& on_token) {
  return GreedyGenerate(model(), prompt, options, on_token);
}

absl::StatusOr<TensorBytes> ExtractionEngine::StoredTensor(const std::string& name) {
  std::string canonical = name;
  if (canonical == "lm_head.weight" && config().tie_word_embeddings) {
    canonical = "model.embed_tokens.weight";
  }
  std::string source = canonical;
  if (source.starts_with("model.")) source = contract().weight_prefix + source.substr(6);
  if (model_->checkpoint == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("tensor \"", name, "\": the target's weights are random (no checkpoint)"));
  }
  const TensorView* view = model_->checkpoint->Find(source);
  if (view == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "tensor \"", name, "\" is not in the checkpoint (looked for \"", source, "\")"));
  }
  TensorBytes t;
  t.name = name;
  t.shape = view->shape;
  t.dtype = view->dtype;
  t.bytes = std::span<const std::byte>(view->data, view->nbytes);
  auto it = digests_.find(source);
  if (it == digests_.end()) it = digests_.emplace(source, DigestBytes(t.bytes)).first;
  t.digest = it->second;
  return t;
}

}  // namespace specwire
