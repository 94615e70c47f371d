#include "services/scorer/replay/in_process_target.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/models/torch_util.h"
#include "common/status.h"

namespace specwire {

absl::StatusOr<std::unique_ptr<InProcessTarget>> InProcessTarget::Open(
    DecoderModel& model, const std::vector<int64_t>& prompt, TargetSessionOptions options,
    const std::vector<int64_t>& target_layer_ids, bool last_layer_is_final_norm) {
  const int64_t L = model.num_layers();
  options.capture = CaptureSpec();
  for (int64_t id : target_layer_ids) {
    if (id < 0 || id >= L) {
      return absl::FailedPreconditionError(
          absl::StrCat("target_layer_ids: ", id, " is outside the target's [0, ", L, ")"));
    }
    if (last_layer_is_final_norm && id == L - 1) {
      options.capture.final_norm = true;
    } else if (std::find(options.capture.layers.begin(), options.capture.layers.end(), id) ==
               options.capture.layers.end()) {
      options.capture.layers.push_back(id);
    }
  }
  SW_ASSIGN_OR_RETURN(std::unique_ptr<TargetSession> session,
                      TargetSession::Open(model, prompt, options));
  std::unique_ptr<InProcessTarget> t(
      new InProcessTarget(std::move(session), target_layer_ids, L, last_layer_is_final_norm));
  t->start_.prompt = prompt;
  t->start_.first_token = t->session_->pending_token();
  SW_ASSIGN_OR_RETURN(t->start_.states, t->States(t->session_->prompt_states()));
  return t;
}

InProcessTarget::InProcessTarget(std::unique_ptr<TargetSession> session, std::vector<int64_t> ids,
                                 int64_t L, bool last_is_final_norm)
    : session_(std::move(session)),
      ids_(std::move(ids)),
      num_layers_(L),
      last_is_final_norm_(last_is_final_norm) {}

absl::StatusOr<std::vector<FeatureState>> InProcessTarget::States(
    const CapturedStates& captured) const {
  std::vector<FeatureState> out;
  for (int64_t id : ids_) {
    const bool norm = last_is_final_norm_ && id == num_layers_ - 1;
    const at::Tensor& t = norm ? captured.final_norm : captured.layers.at(id);
    const at::Tensor rows = t.select(0, 0).to(at::kCPU).contiguous();  // [rows, H]
    FeatureState f;
    f.layer_id = id;
    SW_ASSIGN_OR_RETURN(f.dtype, FromScalarType(rows.scalar_type()));
    f.rows = rows.size(0);
    f.hidden = rows.size(1);
    f.bytes.resize(rows.nbytes());
    std::memcpy(f.bytes.data(), rows.data_ptr(), rows.nbytes());
    out.push_back(std::move(f));
  }
  return out;
}

absl::StatusOr<LiveTarget::Verified> InProcessTarget::Verify(const std::vector<int64_t>& draft,
                                                             const std::vector<float>& draft_probs,
                                                             bool commit_accepted) {
  VerifyDraft d;
  d.tokens = draft;
  d.rule = draft_probs.empty() ? VerifyRule::kArgmaxDraft : VerifyRule::kDraftDistribution;
  if (!draft_probs.empty()) {
    const int64_t k = static_cast<int64_t>(draft.size());
    const int64_t n = static_cast<int64_t>(draft_probs.size());
    if (k == 0 || n % k != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft_probs: ", n, " values for ", k, " drafted tokens"));
    }
    d.draft_q = at::tensor(draft_probs, at::kFloat).view({k, n / k});
  }
  Verified v;
  SW_RETURN_IF_ERROR(RunGuarded("session verify", [&]() -> absl::Status {
    SW_ASSIGN_OR_RETURN(VerifyOutcome o, session_->Verify(d));
    v.accepted = o.accepted;
    v.next_token = o.next_token;
    SW_ASSIGN_OR_RETURN(v.states, States(o.states));
    if (commit_accepted) SW_RETURN_IF_ERROR(session_->Commit(o.accepted));
    return absl::OkStatus();
  }));
  return v;
}

absl::Status InProcessTarget::Commit(int64_t accepted) {
  return RunGuarded("session commit", [&] { return session_->Commit(accepted); });
}

}  // namespace specwire
