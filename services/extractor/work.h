// Plain types between the extractor's rpc code (protobuf, gRPC) and its engine (libtorch). Neither
// side's headers appear here: torch and protobuf never meet in one translation unit.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract.h"
#include "common/extractor_api.h"
#include "common/safetensors.h"

namespace specwire {

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

// One prompt's greedy generation in progress (its cache lives in the backend). The scheduler
// prefills it chunk by chunk and decodes it in steps shared with every other sequence running.
class GenerationSequence {
 public:
  virtual ~GenerationSequence() = default;
  virtual int64_t pending_prompt_tokens() const = 0;  // prompt tokens not yet prefilled
  virtual bool decoding() const = 0;                  // prefilled and not finished
  virtual bool finished() const = 0;
  virtual void Cancel() = 0;
  virtual const std::vector<int64_t>& prompt() const = 0;
  virtual CompletionOutput completion() const = 0;  // what it emitted so far, and why it stopped
};

// A live verification session (common/models/target_session.h has the semantics; the proto's
// Session comments the contract).
struct SessionWork {
  std::vector<int64_t> prompt;
  int64_t max_new_tokens = 256;
  int64_t max_draft_tokens = 15;
  double temperature = 0;  // 0: greedy
  double top_p = 1;
  int64_t top_k = 0;
  uint64_t seed = 0;
  StateSelection selection;
  DType wire_dtype = DType::kBF16;
};

struct VerifyWork {
  std::vector<int64_t> tokens;
  std::vector<int32_t> parents;  // empty: a chain
  DraftRule rule = DraftRule::kArgmaxDraft;
  std::vector<float> draft_probs;  // [k, vocab] row-major for kDraftDistribution
  bool commit_accepted = false;    // commit every accepted draft in the same call
};

struct SessionOpenOutput {
  int64_t next_token = -1;  // the pending token
  int64_t capacity = 0;
  std::vector<HostState> states;  // the prompt's rows
};

using VerifyOutput = SessionVerified<HostState>;

// One session's state in the backend. Calls run on the service's worker thread, one at a time.
class LiveSession {
 public:
  virtual ~LiveSession() = default;
  // INVALID_ARGUMENT / OUT_OF_RANGE / FAILED_PRECONDITION naming the field; nothing changes then.
  virtual absl::StatusOr<VerifyOutput> Verify(const VerifyWork& work) = 0;
  virtual absl::StatusOr<SessionCommitted> Commit(int64_t accepted) = 0;
  virtual int64_t bytes() const = 0;  // what its caches hold
};

// What the service needs from an engine. Implementations run on the service's worker thread;
// calls never overlap on one instance.
class ExtractorBackend {
 public:
  virtual ~ExtractorBackend() = default;
  virtual const ExtractionContract& contract() const = 0;
  // The target's vocabulary and decoder layers: the contract's unless a backend knows better.
  virtual int64_t vocab_size() const { return contract().vocab_size; }
  virtual int64_t num_layers() const { return contract().num_layers; }
  // The model's end-of-sequence token ids (config.json / generation_config.json).
  virtual std::vector<int64_t> eos_token_ids() const { return {}; }
  // Runs several requests' sequences as one batch; result i belongs to works[i].
  virtual absl::StatusOr<std::vector<ExtractOutput>> ExtractBatch(
      const std::vector<const ExtractWork*>& works) = 0;
  virtual absl::StatusOr<TensorBytes> GetTensor(const std::string& name) = 0;

  // Generation, one sequence per prompt (UNIMPLEMENTED by default: a backend that only
  // extracts). Start allocates the sequence's cache for prompt + work.max_new_tokens tokens.
  virtual absl::StatusOr<std::unique_ptr<GenerationSequence>> StartSequence(
      const std::vector<int64_t>& prompt, const GenerateWork& work) {
    return absl::UnimplementedError("this backend does not generate");
  }
  // The next prefill chunk of one sequence (the last emits its first token).
  virtual absl::Status PrefillChunk(GenerationSequence& sequence) {
    return absl::UnimplementedError("this backend does not generate");
  }
  // One token for each sequence (all decoding), in one step.
  virtual absl::Status DecodeStep(const std::vector<GenerationSequence*>& sequences) {
    return absl::UnimplementedError("this backend does not generate");
  }
  // Bytes a sequence's cache holds for `tokens` positions (prompt + max_new_tokens).
  virtual int64_t SequenceBytes(int64_t tokens) const { return 0; }

  // A live verification session: prefills the prompt and draws the pending token.
  virtual absl::StatusOr<std::unique_ptr<LiveSession>> OpenSession(const SessionWork& work,
                                                                   SessionOpenOutput* opened) {
    return absl::UnimplementedError("this backend has no live sessions");
  }
};

}  // namespace specwire
