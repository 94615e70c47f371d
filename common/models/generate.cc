#include "common/models/generate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/models/torch_util.h"
#include "common/status.h"

namespace specwire {

absl::StatusOr<GenerateResult> GreedyGenerate(DecoderModel& model, std::span<const int64_t> prompt,
                                              const GenerateOptions& options,
                                              const TokenCallback& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  const int64_t vocab = model.config().vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt[", i, "] = ", prompt[i],
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (options.max_new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens = ", options.max_new_tokens, " is negative"));
  }
  // The KV cache is allocated up front for prompt + max_new_tokens positions.
  constexpr int64_t kMaxTotalTokens = 1 << 20;
  if (static_cast<int64_t>(prompt.size()) + options.max_new_tokens > kMaxTotalTokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens = ", options.max_new_tokens,
                                                   ": prompt + completion would exceed ",
                                                   kMaxTotalTokens, " tokens"));
  }
  std::vector<int64_t> stops = options.stop_token_ids;
  if (options.use_config_eos) {
    stops.insert(stops.end(), model.config().eos_token_ids.begin(),
                 model.config().eos_token_ids.end());
  }

  GenerateResult result;
  result.finish_reason = "max_new_tokens";
  if (options.max_new_tokens == 0) return result;
  absl::Status status = RunGuarded("generate", [&]() -> absl::Status {
    c10::InferenceMode inference;
    const int64_t P = static_cast<int64_t>(prompt.size());
    auto cache = model.NewCache(1, P + options.max_new_tokens);
    at::Tensor ids = at::tensor(std::vector<int64_t>(prompt.begin(), prompt.end()), at::kLong)
                         .view({1, P});
    CaptureSpec none;
    at::Tensor logits = model.Forward(ids, cache.get(), none, nullptr, LogitsMode::kLast);
    while (true) {
      // argmax picks the first maximal index, like torch.argmax in transformers.
      const int64_t next = logits.argmax(-1).item<int64_t>();
      result.tokens.push_back(next);
      if (on_token && !on_token(next)) {
        result.finish_reason = "cancelled";
        break;
      }
      if (std::find(stops.begin(), stops.end(), next) != stops.end()) {
        result.finish_reason = "stop_token";
        break;
      }
      if (static_cast<int64_t>(result.tokens.size()) >= options.max_new_tokens) break;
      at::Tensor step = at::full({1, 1}, next, at::kLong);
      logits = model.Forward(step, cache.get(), none, nullptr, LogitsMode::kLast);
    }
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return result;
}

}  // namespace specwire
