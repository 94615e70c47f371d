#include "services/extractor/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/models/torch_util.h"
#include "common/status.h"

namespace specwire {

absl::StatusOr<std::unique_ptr<ExtractionEngine>> ExtractionEngine::Load(
    const std::string& model_dir, const LoadOptions& options) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> model, LoadModel(model_dir, options));
  return std::make_unique<ExtractionEngine>(std::move(model));
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
                       "final_norm tap for hidden_states[", config().num_layers, "])"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SequenceStates>> ExtractionEngine::Extract(
    const std::vector<std::vector<int64_t>>& sequences, const CaptureSpec& capture,
    at::ScalarType out_dtype) {
  SW_RETURN_IF_ERROR(Validate(sequences, capture));
  std::vector<SequenceStates> out(sequences.size());
  absl::Status status = RunGuarded("extract", [&]() -> absl::Status {
    c10::InferenceMode inference;
    const int64_t B = static_cast<int64_t>(sequences.size());
    int64_t T = 0;
    for (const auto& s : sequences) T = std::max<int64_t>(T, s.size());
    // Right padding with token 0: causal layers never let a real token see the padding.
    at::Tensor ids = at::zeros({B, T}, at::kLong);
    auto acc = ids.accessor<int64_t, 2>();
    for (int64_t b = 0; b < B; ++b) {
      for (size_t t = 0; t < sequences[b].size(); ++t) acc[b][t] = sequences[b][t];
    }
    CapturedStates captured;
    model().Forward(ids, nullptr, capture, &captured, LogitsMode::kNone);
    auto take = [&](const at::Tensor& full, int64_t b) {
      const int64_t len = static_cast<int64_t>(sequences[b].size());
      return full.select(0, b).narrow(0, 0, len).to(at::kCPU, out_dtype).contiguous();
    };
    for (int64_t b = 0; b < B; ++b) {
      if (captured.embedding.defined()) out[b].embedding = take(captured.embedding, b);
      for (const auto& [id, t] : captured.layers) out[b].layers[id] = take(t, b);
      if (captured.final_norm.defined()) out[b].final_norm = take(captured.final_norm, b);
    }
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
  const TensorView* view = model_->checkpoint->Find(source);
  if (view == nullptr) {
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" is not in the checkpoint (looked for \"",
                                            source, "\")"));
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
