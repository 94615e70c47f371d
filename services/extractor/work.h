// Plain types between the extractor's rpc code (protobuf, gRPC) and its engine (libtorch). Neither
// side's headers appear here: torch and protobuf never meet in one translation unit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract.h"
#include "common/safetensors.h"

namespace specwire {

enum class StateTap { kLayerOutput, kEmbedding, kFinalNorm };

// Which states to capture (layer ids per common/contract.h).
struct StateSelection {
  std::vector<int64_t> layer_ids;
  bool embedding = false;
  bool final_norm = false;
  bool empty() const { return layer_ids.empty() && !embedding && !final_norm; }
};

// One captured state of one sequence, on the host in its wire dtype. `owner` keeps the bytes
// alive (it holds the engine's tensor); the rpc side only reads `bytes`.
struct HostState {
  uint32_t sequence_index = 0;
  StateTap tap = StateTap::kLayerOutput;
  int32_t layer_id = 0;  // for kLayerOutput
  int32_t hf_index = 0;  // index into transformers' output_hidden_states
  int64_t rows = 0;
  int64_t hidden = 0;
  DType dtype = DType::kBF16;
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
};

struct ExtractWork {
  std::vector<std::vector<int64_t>> sequences;  // validated token ids
  StateSelection selection;
  DType wire_dtype = DType::kBF16;
};

struct ExtractOutput {
  std::vector<HostState> states;  // grouped by sequence, in request order
};

struct GenerateWork {
  std::vector<std::vector<int64_t>> prompts;
  int64_t max_new_tokens = 128;
  std::vector<int64_t> stop_token_ids;
  bool use_model_eos = true;
  StateSelection selection;  // states of prompt + completion; empty: none
  DType wire_dtype = DType::kBF16;
};

struct CompletionOutput {
  std::vector<int64_t> tokens;
  std::string finish_reason;
};

struct GenerateOutput {
  std::vector<CompletionOutput> completions;  // one per prompt
  std::vector<HostState> states;              // over prompt + completion, per prompt
};

// A stored target tensor (GetTensors), in its stored dtype.
struct TensorBytes {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
  std::string digest;
};

// What the service needs from an engine. Implementations run on the service's worker thread(s);
// calls never overlap on one instance. `cancelled` is polled between units of work.
class ExtractorBackend {
 public:
  virtual ~ExtractorBackend() = default;
  virtual const ExtractionContract& contract() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t num_layers() const = 0;
  // Runs several requests' sequences as one batch; result i belongs to works[i].
  virtual absl::StatusOr<std::vector<ExtractOutput>> ExtractBatch(
      const std::vector<const ExtractWork*>& works) = 0;
  virtual absl::StatusOr<GenerateOutput> Generate(const GenerateWork& work,
                                                  const std::function<bool()>& cancelled) = 0;
  virtual absl::StatusOr<TensorBytes> GetTensor(const std::string& name) = 0;
};

// HF output_hidden_states index of a state (see common/contract.h).
inline int32_t HfHiddenStatesIndex(StateTap tap, int64_t layer_id, int64_t num_layers) {
  switch (tap) {
    case StateTap::kEmbedding: return 0;
    case StateTap::kFinalNorm: return static_cast<int32_t>(num_layers);
    case StateTap::kLayerOutput: return static_cast<int32_t>(layer_id + 1);
  }
  return -1;
}

}  // namespace specwire
