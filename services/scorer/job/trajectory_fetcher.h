// Step 5a of a job: the greedy trajectories and their features, fetched from the extractors (one
// thread each) ahead of the replay, with retries on whichever extractor is free next. No torch
// and no protobuf: trajectories are plain bytes (scorer_backend.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/cpp/extractor_client.h"
#include "common/safetensors.h"
#include "services/scorer/job/extractor_pool.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

// The decoder states a drafter needs from the extractor, and how its features are built from
// them. dflash's extract_context_feature takes HF hidden_states[id + 1]; for id = L − 1 that is
// the final-norm output (transformers puts the normed state there), which the extractor serves
// as the final_norm tap — layer id L − 1 of the extractor is the raw, un-normed output. EAGLE-3
// drafters (last_layer_is_final_norm false) read that raw output.
StateSelection DrafterStates(const std::vector<int64_t>& target_layer_ids, int64_t num_layers,
                              bool last_layer_is_final_norm = true);
// The states of target_layer_ids, in that order (moved out of `received`; a layer listed twice
// is copied for its second use), each of `rows` rows: DATA_LOSS naming a missing state or a
// wrong row count. `what` names the reply in messages ("Generate reply").
absl::StatusOr<std::vector<FeatureState>> DrafterFeatureStates(
    std::vector<ReceivedState>& received, const std::vector<int64_t>& target_layer_ids,
    int64_t num_layers, bool last_layer_is_final_norm, int64_t rows, const std::string& what);

// The trajectory of one Generate reply (one prompt): tokens, prompt length, and the states in
// target_layer_ids order (moved out of `reply`); with `final_norm`, also the final-norm state.
absl::StatusOr<Trajectory> TrajectoryFromReply(GenerateReply& reply,
                                               const std::vector<int64_t>& target_layer_ids,
                                               int64_t num_layers, int64_t max_new_tokens,
                                               bool final_norm = false,
                                               bool last_layer_is_final_norm = true);

// How trajectories are fetched.
struct TrajectoryOptions {
  // Wire dtype of the features: kF32 or kBF16.
  DType wire_dtype = DType::kF32;
  // Trajectories fetched ahead of the replay, per extractor (memory: one trajectory's features
  // each).
  int64_t prefetch_per_extractor = 1;
  // Generate calls in flight at once per extractor: the extractor decodes them in one batch
  // (continuous batching), so a few keep its decoding steps full (--generates_per_extractor:
  // 8).
  int64_t generates_per_extractor = 1;
  // Generate calls that fail with a retryable code are tried again.
  ExtractorRetryPolicy retry;
};

// What one fetch produced.
struct FetchedTrajectory {
  int64_t index = 0;
  absl::StatusOr<Trajectory> trajectory;
  std::string finish_reason;
};

// What every Generate of a job asks for.
struct TrajectoryRequest {
  const std::vector<std::vector<int64_t>>* prompts = nullptr;  // by prompt index
  std::vector<int64_t> todo;                                   // the indices to fetch
  int64_t max_new_tokens = 0;
  std::vector<int64_t> target_layer_ids;  // the drafter's
  int64_t num_layers = 0;                 // the target's
  std::string request_id_prefix;          // "score-<drafter>-"
  // Also the final-norm state (Trajectory::final_norm), for the target's distributions.
  bool final_norm = false;
  // Target layer id num_layers − 1 is the final-norm output (DFlash) or the last layer's own
  // output (EAGLE-3).
  bool last_layer_is_final_norm = true;
};

// Fetches a job's trajectories: generates_per_extractor threads per extractor, each with one
// Generate in flight, and at most extractors × (generates_per_extractor +
// prefetch_per_extractor) trajectories fetched or in flight at once. A prompt
// whose Generate fails with a retryable code goes back to the queue for whichever extractor asks
// next, until every extractor has used up its attempts at it. Stopping (or destroying) the
// fetcher cancels the Generate calls in flight: the extractor frees their work at once.
class TrajectoryFetcher {
 public:
  TrajectoryFetcher(std::vector<ExtractorEndpoint*> endpoints, TrajectoryRequest request,
                    TrajectoryOptions options, const std::atomic<bool>& cancelled,
                    std::function<void(const std::string&)> log);
  ~TrajectoryFetcher();
  TrajectoryFetcher(const TrajectoryFetcher&) = delete;
  TrajectoryFetcher& operator=(const TrajectoryFetcher&) = delete;

  // The next fetched trajectory, in completion order, waiting up to `wait`; nullopt on timeout.
  std::optional<FetchedTrajectory> Next(std::chrono::milliseconds wait);
  // Stops the threads and cancels the calls in flight (idempotent).
  void Stop();

 private:
  class Queue;
  class Tasks;
  void FetchLoop(ExtractorEndpoint* endpoint);

  const std::vector<ExtractorEndpoint*> endpoints_;
  const TrajectoryRequest request_;
  const TrajectoryOptions options_;
  const std::atomic<bool>& cancelled_;
  const std::function<void(const std::string&)> log_;
  const StateSelection states_;
  std::unique_ptr<Queue> queue_;
  std::unique_ptr<Tasks> tasks_;
  CallCancellation in_flight_;
  std::vector<std::thread> threads_;
};

}  // namespace specwire
