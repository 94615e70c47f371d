// Plain types between the scorer's job logic / rpc code (protobuf, gRPC) and its drafter
// (libtorch). Neither side's headers appear here: torch and protobuf never meet in one
// translation unit. The torch side is scorer_backend.cc (DFlashDrafter + AcceptanceReplay); the
// rpc side (server.cc) and the job runner (score_job.cc) see only this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/drafters/drafter_spec.h"

namespace specwire {

// One target state of a trajectory, [rows, hidden] row-major little-endian in `dtype` (the wire
// bytes as the extractor client reassembled them).
struct FeatureState {
  int64_t layer_id = 0;  // the drafter target layer id it stands for
  DType dtype = DType::kBF16;
  int64_t rows = 0;
  int64_t hidden = 0;
  std::vector<std::byte> bytes;
};

// A greedy trajectory and its features: what one AcceptanceReplay::Run consumes.
struct Trajectory {
  std::vector<int64_t> tokens;  // prompt + completion
  int64_t prompt_len = 0;
  int64_t max_length = 0;  // prompt_len + max_new_tokens (dflash's max_length)
  // One per drafter target_layer_id, in that order (concatenated → features [T, n × H]).
  std::vector<FeatureState> states;
  // The final-norm state (HF hidden_states[num_layers]) when the job asks for the target's
  // distributions (teacher-forced acceptance at T > 0).
  std::optional<FeatureState> final_norm;
};

// A target tensor held by someone else (a mapped cache file, a checkpoint, a received buffer);
// `owner` keeps `bytes` alive.
struct HeldTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> owner;
};

// The target's frozen embedding and lm_head the drafter shares.
struct TargetHead {
  std::string key;          // the target's weights digest: one head per target
  HeldTensor embed_tokens;  // [V, H]
  HeldTensor lm_head;       // [V, H]
};

// The target's half of a live loop: one open verification session (the extractor's Session
// method through the client; fakes in tests). States come in target_layer_ids order, one
// FeatureState per id, over the rows the verification ran.
class LiveTarget {
 public:
  virtual ~LiveTarget() = default;
  struct Verified {
    int32_t accepted = 0;     // drafted tokens accepted
    int64_t next_token = -1;  // the correction or the bonus token
    std::vector<FeatureState> states;
  };
  // draft_probs: [k, V] row-major for the draft_distribution rule; empty: the argmax rule.
  // commit_accepted: the accepted drafts are committed by the same call (no Commit after it).
  virtual absl::StatusOr<Verified> Verify(const std::vector<int64_t>& draft,
                                          const std::vector<float>& draft_probs,
                                          bool commit_accepted) = 0;
  virtual absl::Status Commit(int64_t accepted) = 0;
};

// How the live loop drafts and verifies.
struct LiveSettings {
  SamplingSetting setting{0, 1, 0};  // the target's (and the drafter's q) sampling; 0: greedy
  // kRuleArgmaxDraft: the drafter's argmax, verified with q one-hot (vLLM's rule for DFlash);
  // kRuleDraftDistribution: drafts sampled from the drafter's own q at the setting.
  std::string rule = kRuleArgmaxDraft;
  uint64_t seed = 0;  // the drafter's draws (the target's come from the session's seed)
  int64_t max_new_tokens = 256;
  std::vector<int64_t> stop_token_ids;
};

// Where a live loop starts: the session as opened.
struct LiveStart {
  std::vector<int64_t> prompt;
  int64_t first_token = -1;          // the pending token the session drew
  std::vector<FeatureState> states;  // the prompt's rows, target_layer_ids order
};

struct LiveResult {
  std::vector<int64_t> completion;  // through the first stop token, at most max_new_tokens
  std::string finish_reason;        // "stop_token" | "max_new_tokens"
  // Per step, the committed length a + 1, cut at the completion's end as the replay cuts them
  // (replay.h): for greedy verification, equal to the replay of the same trajectory.
  std::vector<int32_t> step_lengths;
  int64_t verify_calls = 0;
  int64_t drafted_tokens = 0;
  int64_t accepted_tokens = 0;
  double drafter_seconds = 0;
  double target_seconds = 0;  // in the target's calls, round trips included
};

// What a job asks of each replay beside the drafter's chain: each tree budget's replay (`trees`,
// resolved for the drafter by ResolveTrees), the teacher-forced acceptance at each sampling
// setting (needs trajectory.final_norm), and, from a family that predicts its acceptance
// (DSpark's confidence head), the adaptive verify length at these cutoffs beside its
// predictions (ResponseAcceptance::predicted).
struct ReplayAsks {
  TreeSettings trees;
  std::vector<SamplingSetting> sampling;
  std::vector<double> predicted_cutoffs;
};

// The drafter side of the scorer. Implementations run on the scorer's worker thread; calls never
// overlap on one instance.
class ScorerBackend {
 public:
  virtual ~ScorerBackend() = default;
  // Loads (or keeps, when the directory has not changed) the drafter in `dir` and makes it the
  // current one. NOT_FOUND / INVALID_ARGUMENT from the checkpoint, naming the file and key.
  virtual absl::StatusOr<DrafterSpec> LoadDrafter(const std::string& dir) = 0;
  // Resolves what the current drafter leaves to the target (EAGLE-3's default auxiliary layers
  // come from the target's depth) and checks the layer ids in the drafter's own convention;
  // FAILED_PRECONDITION naming the key. `spec` is LoadDrafter's, updated in place.
  virtual absl::Status FitDrafterToTarget(DrafterSpec& spec, int64_t target_layers) {
    (void)spec;
    (void)target_layers;
    return absl::OkStatus();
  }
  // The key of the target head in use ("" when none).
  virtual std::string target_head_key() const = 0;
  // Copies the head (converted to the drafter's dtype and device); every drafter gets it at its
  // first Replay (INVALID_ARGUMENT there when the shapes do not fit the drafter).
  virtual absl::Status SetTargetHead(const TargetHead& head) = 0;
  // The replay of one trajectory with the current drafter and head: its chain (DFlash's block,
  // DFlash2's path, EAGLE-3's chain) and what the job asks beside it (ReplayAsks).
  virtual absl::StatusOr<ResponseAcceptance> Replay(const Trajectory& trajectory,
                                                    const ReplayAsks& asks) = 0;
  // The same for several trajectories at once: result i is Replay(*batch[i], ...), step for
  // step; the torch backend replays them in lockstep (one drafter forward for all their
  // blocks). The default replays them one by one.
  // The real loop on a live target session: draft with the current drafter (its chain; no
  // trees yet), verify on the target, commit the accepted drafts, continue from what was
  // accepted, until a stop token or max_new_tokens.
  virtual absl::StatusOr<LiveResult> Live(const LiveStart& start, LiveTarget& target,
                                          const LiveSettings& settings) {
    (void)start;
    (void)target;
    (void)settings;
    return absl::UnimplementedError("this scorer backend has no live loop");
  }
  virtual absl::StatusOr<std::vector<ResponseAcceptance>> ReplayBatch(
      const std::vector<const Trajectory*>& batch, const ReplayAsks& asks) {
    std::vector<ResponseAcceptance> out;
    for (const Trajectory* t : batch) {
      auto r = Replay(*t, asks);
      if (!r.ok()) return r.status();
      out.push_back(std::move(*r));
    }
    return out;
  }
};

struct TorchScorerOptions {
  std::string dtype = "float32";  // drafter compute dtype: float32 | bfloat16 | float16
  std::string device = "cpu";     // cpu | cuda | cuda:N
  int threads = 0;                // intra-op CPU threads; 0: torch's default
};

// The libtorch backend (DFlashDrafter / Eagle3Drafter + AcceptanceReplay of
// services/scorer/{drafter,eagle3_drafter,replay}.h).
absl::StatusOr<std::unique_ptr<ScorerBackend>> MakeTorchScorerBackend(
    const TorchScorerOptions& options);

}  // namespace specwire
