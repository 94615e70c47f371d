// The target's half of the live loop in this process: a TargetSession over a loaded target,
// behind the LiveTarget interface the scorer's live loop drives (services/scorer/live_loop.h).
// specwire-replay --live runs the real loop with it, without an extractor service in between:
// the same loop and the same session arithmetic as the service path, on whatever device the
// target runs (a GPU included).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/models/target_session.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

class InProcessTarget : public LiveTarget {
 public:
  // Opens the session on `prompt`. The drafter's target layers (`target_layer_ids`, in its own
  // convention: id L − 1 is the final-norm state when `last_layer_is_final_norm`) are captured
  // for the prompt and every verified block; `options.capture` is set from them.
  static absl::StatusOr<std::unique_ptr<InProcessTarget>> Open(
      DecoderModel& model, const std::vector<int64_t>& prompt, TargetSessionOptions options,
      const std::vector<int64_t>& target_layer_ids, bool last_layer_is_final_norm);

  // The session as opened: the prompt, the first token it drew and the prompt's states.
  const LiveStart& start() const { return start_; }
  const TargetSession& session() const { return *session_; }

  absl::StatusOr<Verified> Verify(const std::vector<int64_t>& draft,
                                  const std::vector<float>& draft_probs,
                                  bool commit_accepted) override;
  absl::Status Commit(int64_t accepted) override;

 private:
  InProcessTarget(std::unique_ptr<TargetSession> session, std::vector<int64_t> ids, int64_t L,
                  bool last_is_final_norm);
  // The drafter's states (target_layer_ids order) of captured rows [1, rows, H].
  absl::StatusOr<std::vector<FeatureState>> States(const CapturedStates& captured) const;

  std::unique_ptr<TargetSession> session_;
  std::vector<int64_t> ids_;
  int64_t num_layers_;
  bool last_is_final_norm_;
  LiveStart start_;
};

}  // namespace specwire
