#include "common/models/target_session.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/models/generate.h"
#include "common/status.h"

namespace specwire {
namespace {

// The stream of the draws that verify the block starting at position `start`.
uint64_t BlockStream(int64_t start) { return 2 * static_cast<uint64_t>(start) + 1; }
constexpr uint64_t kFirstTokenStream = 0;

at::Tensor Ids(std::span<const int64_t> tokens) {
  return at::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), at::kLong)
      .view({1, static_cast<int64_t>(tokens.size())});
}

absl::Status CheckVocab(std::span<const int64_t> tokens, int64_t vocab, const std::string& field) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "] = ", tokens[i], " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void AppendCaptured(CapturedStates& into, CapturedStates&& part) {
  auto cat = [](at::Tensor& a, at::Tensor&& b) {
    if (!b.defined()) return;
    a = a.defined() ? at::cat({a, b}, 1) : std::move(b);
  };
  cat(into.embedding, std::move(part.embedding));
  for (auto& [id, t] : part.layers) cat(into.layers[id], std::move(t));
  cat(into.final_norm, std::move(part.final_norm));
}

TargetSession::TargetSession(DecoderModel& model, std::span<const int64_t> prompt,
                             const TargetSessionOptions& options)
    : model_(model),
      options_(options),
      prompt_(prompt.begin(), prompt.end()),
      prompt_len_(static_cast<int64_t>(prompt.size())) {}

absl::StatusOr<std::unique_ptr<TargetSession>> TargetSession::Open(
    DecoderModel& model, std::span<const int64_t> prompt, const TargetSessionOptions& options) {
  const int64_t vocab = model.config().vocab_size;
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  SW_RETURN_IF_ERROR(CheckVocab(prompt, vocab, "prompt"));
  if (options.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens = ", options.max_new_tokens, ": must be at least 1"));
  }
  if (options.max_draft_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_draft_tokens = ", options.max_draft_tokens, " is negative"));
  }
  const int64_t capacity =
      static_cast<int64_t>(prompt.size()) + options.max_new_tokens + options.max_draft_tokens + 1;
  if (capacity > kMaxSequenceTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens = ", options.max_new_tokens,
                     ", max_draft_tokens = ", options.max_draft_tokens,
                     ": prompt + completion + draft would exceed ", kMaxSequenceTokens, " tokens"));
  }
  const SamplingParams& s = options.sampling;
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature = ", s.temperature, ": must be finite and ≥ 0"));
  }
  if (!(s.top_p > 0 && s.top_p <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p = ", s.top_p, ": must be in (0, 1]"));
  }
  if (s.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.top_k = ", s.top_k, " is negative"));
  }
  for (int64_t id : options.capture.layers) {
    if (id < 0 || id >= model.num_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer id ", id, " is outside [0, ", model.num_layers(), ")"));
    }
  }
  std::unique_ptr<TargetSession> session(new TargetSession(model, prompt, options));
  c10::InferenceMode inference;
  session->cache_ = model.NewCache(1, capacity);
  for (int64_t done = 0; done < session->prompt_len_;) {
    const int64_t n = std::min(kPrefillChunkTokens, session->prompt_len_ - done);
    CapturedStates part;
    session->prompt_logits_ = model
                                  .Forward(Ids(prompt.subspan(done, n)), session->cache_.get(),
                                           options.capture, &part, LogitsMode::kLast)
                                  .select(0, 0);
    AppendCaptured(session->prompt_states_, std::move(part));
    done += n;
  }
  session->pending_ = session->Draw(session->prompt_logits_, kFirstTokenStream);
  session->completion_.push_back(session->pending_);
  return session;
}

int64_t TargetSession::Draw(const at::Tensor& logits_row, uint64_t stream) const {
  return SampleToken(SamplingDistribution(logits_row, options_.sampling),
                     UniformAt(options_.seed, stream, 0));
}

int64_t TargetSession::bytes() const {
  int64_t total = 0;
  for (const auto& layer : cache_->layers) total += layer->bytes();
  return total;
}

std::vector<std::unique_ptr<LayerCache>> TargetSession::SaveStates() const {
  std::vector<std::unique_ptr<LayerCache>> saved;
  for (const auto& layer : cache_->layers) saved.push_back(layer->SaveState());
  return saved;
}

void TargetSession::RestoreStates(const std::vector<std::unique_ptr<LayerCache>>& saved) {
  for (size_t i = 0; i < saved.size(); ++i) {
    if (saved[i]) cache_->layers[i]->RestoreState(*saved[i]);
  }
}

absl::Status TargetSession::CheckDraft(const VerifyDraft& draft, const std::string& field) const {
  if (outstanding_) {
    return absl::FailedPreconditionError(
        "the last verification awaits its commit: send commit before the next verify");
  }
  const int64_t k = static_cast<int64_t>(draft.tokens.size());
  const int64_t vocab = model_.config().vocab_size;
  if (k > options_.max_draft_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".draft_tokens: ", k, " tokens, the session allows ",
                     options_.max_draft_tokens, " (open.max_draft_tokens)"));
  }
  SW_RETURN_IF_ERROR(CheckVocab(draft.tokens, vocab, absl::StrCat(field, ".draft_tokens")));
  if (cache_->length + k + 1 > capacity()) {
    return absl::OutOfRangeError(absl::StrCat(field, ".draft_tokens: a block of ", k + 1,
                                              " tokens at position ", cache_->length,
                                              " would pass the session's ", capacity(),
                                              " positions (prompt + open.max_new_tokens + "
                                              "open.max_draft_tokens + 1)"));
  }
  if (!draft.parents.empty()) {
    if (draft.parents.size() != draft.tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parents: ", draft.parents.size(), " entries for ", k,
                       " draft tokens (one parent per node, or none for a chain)"));
    }
    for (int64_t j = 0; j < k; ++j) {
      if (draft.parents[j] < -1 || draft.parents[j] >= j) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".parents[", j, "] = ", draft.parents[j],
                         ": a node's parent is −1 (the pending token) or an earlier node"));
      }
    }
    if (draft.rule == VerifyRule::kDraftDistribution) {
      return absl::InvalidArgumentError(
          absl::StrCat(field,
                       ".rule: a tree is verified by the target's draws (draft_distribution is for "
                       "chains)"));
    }
  }
  if (draft.rule == VerifyRule::kDraftDistribution) {
    const at::Tensor& q = draft.draft_q;
    if (!q.defined() || q.dim() != 2 || q.size(0) != k || q.size(1) != vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".draft_probs: the draft_distribution rule needs [", k, ", ", vocab,
                       "] probabilities, got ", q.defined() ? q.numel() : 0, " values"));
    }
    if (k > 0) {
      const at::Tensor qd = q.to(at::kDouble);
      if (!at::isfinite(qd).all().item<bool>() || (qd < 0).any().item<bool>()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".draft_probs: probabilities must be finite and ≥ 0"));
      }
      const at::Tensor sums = qd.sum(1);
      if ((sums - 1).abs().max().item<double>() > 1e-3) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ".draft_probs: each row must sum to 1 (a row sums to ",
                         sums[(sums - 1).abs().argmax()].item<double>(), ")"));
      }
      for (int64_t i = 0; i < k; ++i) {
        if (qd[i][draft.tokens[i]].item<double>() <= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, ".draft_probs[", i, "]: the drafted token ", draft.tokens[i],
                           " has probability 0 under the drafter's own distribution"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifyOutcome> TargetSession::Verify(const VerifyDraft& draft) {
  SW_RETURN_IF_ERROR(CheckDraft(draft, "verify"));
  c10::InferenceMode inference;
  return draft.parents.empty() ? VerifyChainBlock(draft) : VerifyTreeWalk(draft);
}

absl::StatusOr<VerifyOutcome> TargetSession::VerifyChainBlock(const VerifyDraft& draft) {
  Outstanding o;
  o.start = cache_->length;
  o.saved = SaveStates();
  o.rows.push_back(pending_);
  o.rows.insert(o.rows.end(), draft.tokens.begin(), draft.tokens.end());
  VerifyOutcome out;
  out.position = o.start;
  at::Tensor logits =
      model_.Forward(Ids(o.rows), cache_.get(), options_.capture, &out.states, LogitsMode::kAll)
          .select(0, 0);  // [k + 1, V]
  const int64_t rows = logits.size(0);
  at::Tensor argmax = logits.argmax(-1).to(at::kCPU).contiguous();
  out.target_argmax.assign(argmax.data_ptr<int64_t>(), argmax.data_ptr<int64_t>() + rows);
  ChainVerification v;
  if (options_.sampling.temperature <= 0) {
    // Greedy: p is one-hot at the argmax (first index on ties, as SamplingDistribution), so
    // every rule accepts the drafts equal to it and emits the argmax after them.
    while (v.accepted < static_cast<int32_t>(draft.tokens.size()) &&
           draft.tokens[v.accepted] == out.target_argmax[v.accepted]) {
      ++v.accepted;
    }
    v.next_token = out.target_argmax[v.accepted];
  } else {
    std::vector<at::Tensor> p;
    for (int64_t i = 0; i < rows; ++i) {
      p.push_back(SamplingDistribution(logits[i], options_.sampling));
    }
    v = VerifyChain(at::stack(p), draft.tokens, draft.draft_q, draft.rule, options_.seed,
                    BlockStream(o.start));
  }
  out.accepted = v.accepted;
  out.accepted_tokens.assign(draft.tokens.begin(), draft.tokens.begin() + v.accepted);
  out.next_token = v.next_token;
  out.logits = logits;
  o.accepted = out.accepted_tokens;
  o.next_token = v.next_token;
  outstanding_ = std::move(o);
  return out;
}

absl::StatusOr<VerifyOutcome> TargetSession::VerifyTreeWalk(const VerifyDraft& draft) {
  // The walk of VerifyTree, one forward per row: the pending token, then each accepted node.
  Outstanding o;
  o.start = cache_->length;
  o.saved = SaveStates();
  VerifyOutcome out;
  out.position = o.start;
  std::vector<at::Tensor> logits;
  int32_t node = -1;
  int64_t token = pending_;
  for (uint64_t d = 0;; ++d) {
    o.rows.push_back(token);
    CapturedStates part;
    const int64_t one[] = {token};
    at::Tensor row =
        model_.Forward(Ids(one), cache_.get(), options_.capture, &part, LogitsMode::kLast)
            .select(0, 0);
    AppendCaptured(out.states, std::move(part));
    logits.push_back(row);
    out.target_argmax.push_back(row.argmax().item<int64_t>());
    const int64_t t = SampleToken(SamplingDistribution(row, options_.sampling),
                                  UniformAt(options_.seed, BlockStream(o.start), d));
    int32_t next = -1;
    for (size_t j = 0; j < draft.tokens.size(); ++j) {
      if (draft.parents[j] == node && draft.tokens[j] == t) {
        next = static_cast<int32_t>(j);
        break;
      }
    }
    if (next < 0) {
      out.next_token = t;
      break;
    }
    out.path.push_back(next);
    out.accepted_tokens.push_back(t);
    node = next;
    token = t;
  }
  out.accepted = static_cast<int32_t>(out.path.size());
  out.logits = at::stack(logits);
  o.accepted = out.accepted_tokens;
  o.next_token = out.next_token;
  outstanding_ = std::move(o);
  return out;
}

absl::Status TargetSession::Commit(int64_t n) {
  if (!outstanding_) {
    return absl::FailedPreconditionError("commit: no verification to commit (send verify first)");
  }
  Outstanding& o = *outstanding_;
  const int64_t a = static_cast<int64_t>(o.accepted.size());
  if (n < 0 || n > a) {
    return absl::InvalidArgumentError(absl::StrCat("commit.accepted = ", n,
                                                   ": the last verification accepted ", a,
                                                   " drafted tokens; commit at most those"));
  }
  c10::InferenceMode inference;
  // Rows the verification ran that are committed: the pending token and n accepted drafts.
  const int64_t ran = static_cast<int64_t>(o.rows.size());
  const bool rows_are_committed =
      n + 1 == ran && std::equal(o.accepted.begin(), o.accepted.begin() + n, o.rows.begin() + 1);
  if (!rows_are_committed) {
    cache_->length = o.start;
    RestoreStates(o.saved);
    std::vector<int64_t> keep = {o.rows.front()};
    keep.insert(keep.end(), o.accepted.begin(), o.accepted.begin() + n);
    model_.Forward(Ids(keep), cache_.get(), CaptureSpec(), nullptr, LogitsMode::kNone);
    ++rollback_forwards_;
    rollback_tokens_ += static_cast<int64_t>(keep.size());
  }
  completion_.insert(completion_.end(), o.accepted.begin(), o.accepted.begin() + n);
  pending_ = n < a ? o.accepted[n] : o.next_token;
  completion_.push_back(pending_);
  outstanding_.reset();
  return absl::OkStatus();
}

}  // namespace specwire
