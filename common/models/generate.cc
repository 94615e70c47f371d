#include "common/models/generate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/models/torch_util.h"
#include "common/status.h"

namespace specwire {

absl::StatusOr<std::unique_ptr<GreedySequence>> GreedySequence::Start(
    DecoderModel& model, std::span<const int64_t> prompt, const GenerateOptions& options) {
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
  if (static_cast<int64_t>(prompt.size()) + options.max_new_tokens > kMaxSequenceTokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens = ", options.max_new_tokens,
                                                   ": prompt + completion would exceed ",
                                                   kMaxSequenceTokens, " tokens"));
  }
  std::unique_ptr<GreedySequence> s(new GreedySequence(model, prompt, options));
  SW_RETURN_IF_ERROR(RunGuarded("generate", [&]() -> absl::Status {
    s->cache_ = model.NewCache(1, s->prompt_len_ + s->max_new_tokens_);
    return absl::OkStatus();
  }));
  return s;
}

GreedySequence::GreedySequence(DecoderModel& model, std::span<const int64_t> prompt,
                               const GenerateOptions& options)
    : model_(model),
      prompt_(prompt.begin(), prompt.end()),
      prompt_len_(static_cast<int64_t>(prompt.size())),
      max_new_tokens_(options.max_new_tokens),
      stops_(options.stop_token_ids) {
  if (options.use_config_eos) {
    stops_.insert(stops_.end(), model.config().eos_token_ids.begin(),
                  model.config().eos_token_ids.end());
  }
  result_.finish_reason = "max_new_tokens";
  finished_ = max_new_tokens_ == 0;
}

void GreedySequence::PrefillChunk() {
  TORCH_CHECK(pending_prompt_tokens() > 0 && !finished_, "nothing to prefill");
  c10::InferenceMode inference;
  const int64_t n = std::min(kPrefillChunkTokens, pending_prompt_tokens());
  at::Tensor ids =
      at::tensor(std::vector<int64_t>(prompt_.begin() + prefilled_, prompt_.begin() + prefilled_ + n),
                 at::kLong)
          .view({1, n});
  CaptureSpec none;
  at::Tensor logits = model_.Forward(ids, cache_.get(), none, nullptr, LogitsMode::kLast);
  prefilled_ += n;
  // argmax picks the first maximal index, like torch.argmax in transformers.
  if (pending_prompt_tokens() == 0) Emit(logits.select(0, 0), logits.argmax(-1).item<int64_t>());
}

void GreedySequence::Emit(const at::Tensor& logits_row, int64_t next) {
  last_logits_ = logits_row;
  result_.tokens.push_back(next);
  if (std::find(stops_.begin(), stops_.end(), next) != stops_.end()) {
    result_.finish_reason = "stop_token";
    finished_ = true;
  } else if (static_cast<int64_t>(result_.tokens.size()) >= max_new_tokens_) {
    finished_ = true;
  }
}

void GreedySequence::Cancel() {
  finished_ = true;
  result_.finish_reason = "cancelled";
}

void DecodeStep(DecoderModel& model, const std::vector<GreedySequence*>& batch) {
  if (batch.empty()) return;
  c10::InferenceMode inference;
  std::vector<int64_t> tokens;
  std::vector<ModelCache*> caches;
  for (GreedySequence* s : batch) {
    TORCH_CHECK(s->decoding(), "DecodeStep on a sequence that is not decoding");
    tokens.push_back(s->result_.tokens.back());
    caches.push_back(s->cache_.get());
  }
  at::Tensor logits = model.DecodeStep(tokens, caches);  // [N, V]
  // Every row's argmax in one call, brought to the host once (one sync on a GPU).
  at::Tensor next = logits.argmax(-1).to(at::kCPU);
  const int64_t* ids = next.data_ptr<int64_t>();
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i]->Emit(logits.select(0, static_cast<int64_t>(i)), ids[i]);
  }
}

absl::StatusOr<GenerateResult> GreedyGenerate(DecoderModel& model, std::span<const int64_t> prompt,
                                              const GenerateOptions& options,
                                              const TokenCallback& on_token) {
  SW_ASSIGN_OR_RETURN(std::unique_ptr<GreedySequence> seq,
                      GreedySequence::Start(model, prompt, options));
  SW_RETURN_IF_ERROR(RunGuarded("generate", [&]() -> absl::Status {
    size_t seen = 0;
    auto report = [&] {
      for (; seen < seq->result().tokens.size(); ++seen) {
        if (on_token && !on_token(seq->result().tokens[seen])) {
          seq->Cancel();
          return;
        }
      }
    };
    while (seq->pending_prompt_tokens() > 0 && !seq->finished()) seq->PrefillChunk();
    report();
    while (seq->decoding()) {
      DecodeStep(model, {seq.get()});
      report();
    }
    return absl::OkStatus();
  }));
  return seq->TakeResult();  // a refused token stays in the completion, nothing after it
}

namespace {

int64_t CacheBytes(const ModelCache& cache) {
  int64_t bytes = 0;
  for (const auto& layer : cache.layers) bytes += layer->bytes();
  return bytes;
}

}  // namespace

CacheCost MeasureCacheCost(const DecoderModel& model) {
  const int64_t one = CacheBytes(*model.NewCache(1, 1));
  const int64_t two = CacheBytes(*model.NewCache(1, 2));
  CacheCost c;
  c.per_token = two - one;
  c.fixed = one - c.per_token;
  return c;
}

}  // namespace specwire
