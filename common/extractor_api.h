// The extractor API's plain types that both sides use: the client (clients/cpp) and the service
// with its engine (services/extractor). No torch, no protobuf, no gRPC: proto/convert.h maps the
// shared ones to messages; each side's own types (a request's parameters, a captured state on
// the host or one reassembled from the wire) live with that side. extractor.proto has the
// contracts these mirror.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace specwire {

// Where a captured state comes from (layer ids per common/contract.h: layer k is the output of
// decoder layer k, transformers' hidden_states[k + 1]).
enum class StateTap { kLayerOutput, kEmbedding, kFinalNorm };

// Which hidden states to capture: what a client asks for and what the service validated.
struct StateSelection {
  std::vector<int64_t> layer_ids;
  bool embedding = false;   // hidden_states[0]
  bool final_norm = false;  // hidden_states[num_layers]
  bool empty() const { return layer_ids.empty() && !embedding && !final_norm; }
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

// One input sequence: token ids, or text the server tokenizes with the model's tokenizer.
struct InputSequence {
  std::vector<int64_t> token_ids;
  std::string text;
  bool is_text = false;

  static InputSequence Tokens(std::vector<int64_t> ids) { return {std::move(ids), {}, false}; }
  static InputSequence Text(std::string text) { return {{}, std::move(text), true}; }
};

// A stored target tensor (GetTensors), in its stored dtype, as the service holds it: `owner`
// keeps the bytes alive.
struct TensorBytes {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  std::shared_ptr<const void> owner;
  std::span<const std::byte> bytes;
  std::string digest;
};

// A stream's trailer.
struct StreamTotals {
  std::string request_id;
  uint32_t sequences = 0;
  uint64_t tokens = 0;
  uint64_t chunks = 0;
  uint64_t bytes = 0;
  double queue_seconds = 0;
  double compute_seconds = 0;
};

// How a live session's verification accepts drafts (extractor.proto's Rule): the drafter's
// argmax (q one-hot), or drafts sampled from the drafter's distribution q (sent with them).
enum class DraftRule { kArgmaxDraft, kDraftDistribution };

// A session's commit: what the target holds after it.
struct SessionCommitted {
  int64_t tokens = 0;  // prompt + committed completion
  int64_t next_token = -1;
  int64_t rollback_tokens = 0;
};

// A session's verification of one chain or tree, with the target's states of the rows it ran:
// `State` is the engine's host state on the service side and the reassembled state on the
// client's.
template <typename State>
struct SessionVerified {
  int64_t position = 0;
  int32_t accepted = 0;
  std::vector<int64_t> accepted_tokens;
  std::vector<int32_t> path;
  int64_t next_token = -1;
  std::vector<int64_t> target_argmax;
  std::string rule;            // "argmax_draft" | "draft_distribution" | "tree"
  std::vector<State> states;   // the rows verification ran
  std::optional<SessionCommitted> committed;  // with commit_accepted
};

}  // namespace specwire
