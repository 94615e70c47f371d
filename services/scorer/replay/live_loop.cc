#include "services/scorer/replay/live_loop.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/models/speculative_sampling.h"
#include "common/status.h"

namespace specwire {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

absl::StatusOr<LiveResult> RunLiveLoop(
    BlockDrafter* drafter, const LiveStart& start, LiveTarget& target, const LiveSettings& settings,
    const std::function<at::Tensor(const std::vector<FeatureState>&)>& to_features) {
  c10::InferenceMode guard;
  const int64_t P = static_cast<int64_t>(start.prompt.size());
  const int64_t B = drafter->block_size();
  const int64_t max_length = P + settings.max_new_tokens;
  const bool sample_drafts = settings.rule == kRuleDraftDistribution;
  const bool conditioned = drafter->conditions_on_drafts();
  const SamplingParams sampling{settings.setting.temperature, settings.setting.top_p,
                                settings.setting.top_k};
  auto is_stop = [&](int64_t t) {
    return std::find(settings.stop_token_ids.begin(), settings.stop_token_ids.end(), t) !=
           settings.stop_token_ids.end();
  };

  LiveResult out;
  std::unique_ptr<DraftSession> session = drafter->NewSession(max_length + B);
  int64_t pending = start.first_token;
  std::vector<int64_t> next = NextTokens(start.prompt, 0, P);
  next.back() = pending;
  auto t0 = std::chrono::steady_clock::now();
  session->AppendContext(to_features(start.states), next);
  out.drafter_seconds += Since(t0);
  out.completion.push_back(pending);
  std::vector<int64_t> starts;     // each step's start
  std::vector<int32_t> committed;  // each step's a + 1
  int64_t pos = P;                 // the pending token's position
  while (!is_stop(pending) &&
         static_cast<int64_t>(out.completion.size()) < settings.max_new_tokens) {
    const int64_t len = std::min(B, max_length - pos);
    std::vector<int64_t> draft;
    std::vector<float> probs;
    t0 = std::chrono::steady_clock::now();
    if (len >= 2) {
      at::Tensor logits = session->DraftLogits(pending, pos, len).to(at::kFloat);
      if (sample_drafts) {
        for (int64_t i = 0; i < len - 1; ++i) {
          // A family whose positions condition on the drafts before them (a chain, a Markov
          // head, a selector) drafts position i given the tokens sampled so far: its rows
          // past `given` follow its own greedy drafts, so they are recomputed only where the
          // last draw left the row's argmax.
          if (i > 0 && conditioned && draft.back() != logits[i - 1].argmax().item<int64_t>()) {
            logits = session->DraftLogits(pending, pos, len, draft).to(at::kFloat);
          }
          const at::Tensor q = SamplingDistribution(logits[i], sampling);
          // Even streams from 2: the session draws from stream 0 and the odd streams 2L + 1 of
          // the same seed, and a draft must not reuse a uniform the target's past tests used.
          const uint64_t stream = 2 * static_cast<uint64_t>(pos) + 2;
          draft.push_back(SampleToken(q, UniformAt(settings.seed, stream, i)));
          const at::Tensor qf = q.to(at::kFloat).contiguous();
          probs.insert(probs.end(), qf.data_ptr<float>(), qf.data_ptr<float>() + qf.numel());
        }
      } else {
        const at::Tensor ids = logits.argmax(-1).to(at::kCPU).contiguous();
        draft.assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
      }
    }
    out.drafter_seconds += Since(t0);
    t0 = std::chrono::steady_clock::now();
    // One call per step: every accepted draft is committed with the verification.
    absl::StatusOr<LiveTarget::Verified> v = target.Verify(draft, probs, /*commit_accepted=*/true);
    if (!v.ok()) return Annotate(v.status(), absl::StrCat("verify at position ", pos));
    const int64_t a = v->accepted;
    if (a < 0 || a > static_cast<int64_t>(draft.size())) {
      return absl::DataLossError(absl::StrCat("verify at position ", pos, ": ", a, " accepted of ",
                                              draft.size(), " drafts"));
    }
    out.target_seconds += Since(t0);
    ++out.verify_calls;
    out.drafted_tokens += static_cast<int64_t>(draft.size());
    out.accepted_tokens += a;
    // The committed rows [pending, d_1 .. d_a] and the tokens after each.
    std::vector<FeatureState> rows = v->states;
    for (FeatureState& f : rows) {
      const int64_t row_bytes = f.rows > 0 ? static_cast<int64_t>(f.bytes.size()) / f.rows : 0;
      if (f.rows < a + 1) {
        return absl::DataLossError(absl::StrCat("verify at position ", pos, ": ", f.rows,
                                                " state rows for ", a + 1, " committed tokens"));
      }
      f.bytes.resize(static_cast<size_t>((a + 1) * row_bytes));
      f.rows = a + 1;
    }
    std::vector<int64_t> after(draft.begin(), draft.begin() + a);
    after.push_back(v->next_token);
    t0 = std::chrono::steady_clock::now();
    session->AppendContext(to_features(rows), after);
    out.drafter_seconds += Since(t0);
    starts.push_back(pos);
    committed.push_back(static_cast<int32_t>(a + 1));
    out.completion.insert(out.completion.end(), after.begin(), after.end());
    pos += a + 1;
    pending = v->next_token;
  }
  // The completion ends at its first stop token or at max_new_tokens, like Generate's.
  out.finish_reason = "max_new_tokens";
  for (size_t i = 0; i < out.completion.size(); ++i) {
    if (is_stop(out.completion[i])) {
      out.completion.resize(i + 1);
      out.finish_reason = "stop_token";
      break;
    }
  }
  if (static_cast<int64_t>(out.completion.size()) > settings.max_new_tokens) {
    out.completion.resize(settings.max_new_tokens);
    out.finish_reason = "max_new_tokens";
  }
  const int64_t T = P + static_cast<int64_t>(out.completion.size());
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i] + 1 >= T) break;
    out.step_lengths.push_back(
        static_cast<int32_t>(std::min<int64_t>(committed[i], T - 1 - starts[i])));
  }
  return out;
}

}  // namespace specwire
