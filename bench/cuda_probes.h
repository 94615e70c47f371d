// Probes that only a CUDA device answers, for the GPU benchmarks (bench/decode_bench.cc,
// bench/extract_bench.cc). In a build without CUDA headers they answer "unavailable".
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/models/decoder.h"
#include "nlohmann/json.hpp"

namespace specwire {

// One decoding step of `batch` rows (prompts of 64 tokens, prefilled) run eagerly and as a
// captured CUDA graph replayed: median ms of each over `reps` steps, and whether the replay's
// logits equal the eager step's bit for bit. The step is DecoderModel::DecodeRowsLogits at fixed
// positions (every replay rewrites the same cache rows), which is what a graph per row-count
// bucket would replay if the caches' addresses and the positions were fixed.
nlohmann::json DecodeGraphProbe(DecoderModel& model, int64_t batch, int reps);

// Counts the operations that make the host wait for a CUDA device (torch's sync debug mode,
// "warn") between construction and Stop(): how many, and where (up to 8 distinct places). The
// constructor makes one deliberate wait on `device` first and reports whether it was seen
// ("calibrated"): a count of 0 is then a real 0.
class SyncCounter {
 public:
  explicit SyncCounter(const at::Device& device);
  ~SyncCounter();
  nlohmann::json Stop();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace specwire
