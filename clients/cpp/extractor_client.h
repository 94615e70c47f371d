// A C++ client of the extractor (specwire.v1.Extractor): requests in, plain structs out.
//
// No protobuf or gRPC type appears in this header (the stub lives behind a pimpl), so code that
// includes torch — the scorer — can use the client too (torch and protobuf never meet in one
// translation unit). Streams are checked as they arrive: the contract comes first, every chunk's
// crc32c and geometry are checked by StateAssembler, every state must be complete and the stream
// must end with a trailer whose totals match what was received. A stream that breaks any of this
// is an error (DATA_LOSS), never a partial result.
//
// Thread-safe: every call has its own gRPC context; one client (one channel) may serve many
// threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract.h"
#include "common/extractor_api.h"
#include "common/safetensors.h"
#include "common/rpc/security.h"

namespace grpc {
class ClientContext;
}

namespace specwire {

// Cancels, from any thread, the streaming calls (Extract, Generate) made with it: a call in
// flight ends at once with CANCELLED (the server frees its work), a later call fails before it
// starts. The owner of a job keeps one per job and passes it in the params; it must outlive the
// calls made with it.
class CallCancellation {
 public:
  void Cancel();
  bool cancelled() const;

  // The client's side: a call registers its context for its lifetime. Register is false (and
  // registers nothing) when already cancelled.
  bool Register(grpc::ClientContext* ctx);
  void Unregister(grpc::ClientContext* ctx);

 private:
  mutable std::mutex mu_;
  bool cancelled_ = false;
  std::set<grpc::ClientContext*> calls_;  // not owned: the calls in flight
};

struct ExtractorClientOptions {
  std::string target = "127.0.0.1:50051";  // host:port
  // Deadline of each call, from its start to its last message; 0: none. A call to an address
  // where nothing listens fails at once (UNAVAILABLE) either way.
  double timeout_seconds = 0;
  // Largest message accepted. The server caps chunks at --max_chunk_bytes (4 MiB by default)
  // plus framing; gRPC's own default (4 MiB) would refuse a full-size chunk.
  int max_receive_message_bytes = 64 << 20;
  // Reconnect backoff of the channel after its server went away (first delay, longest delay). gRPC's defaults (1 s growing to
  // 120 s) would keep a channel failing long after a restarted server listens again; callers
  // that retry (the scorer) want the channel to try again within a second.
  int initial_reconnect_backoff_ms = 100;
  int max_reconnect_backoff_ms = 1000;
  // TLS / mTLS material and the bearer token (common/rpc/security.h; LoadClientSecurity reads them
  // from files and the environment). Default: plaintext, no token.
  ClientSecurity security;
};

struct ExtractParams {
  std::vector<InputSequence> sequences;
  StateSelection states;
  DType dtype = DType::kBF16;       // kBF16 or kF32
  uint32_t max_chunk_bytes = 0;     // 0: the server's default
  std::string request_id;           // echoed in the trailer and the server's logs
  bool add_special_tokens = false;  // for text inputs
  // Optional, not owned: cancels this call from another thread.
  CallCancellation* cancel = nullptr;
};

struct GenerateParams {
  std::vector<InputSequence> prompts;
  uint32_t max_new_tokens = 32;
  std::vector<int64_t> stop_token_ids;
  bool ignore_model_eos = false;  // by default the model's eos_token_id also stops
  StateSelection states;         // over prompt + completion; empty: completions only
  DType dtype = DType::kBF16;
  uint32_t max_chunk_bytes = 0;
  std::string request_id;
  bool add_special_tokens = false;
  // Optional, not owned: cancels this call from another thread.
  CallCancellation* cancel = nullptr;
};

// One hidden state of one sequence, reassembled: [rows, hidden] row-major little-endian in `dtype`.
struct ReceivedState {
  uint32_t sequence_index = 0;
  std::string state;      // "layer.{k}" | "embedding" | "final_norm"
  int32_t layer_id = -1;  // k for "layer.{k}", else -1
  int32_t hf_hidden_states_index = 0;
  int64_t rows = 0;
  int64_t hidden = 0;
  DType dtype = DType::kBF16;
  std::vector<std::byte> bytes;

  // "seq.{i}.{state}": the naming of specwire-extract's safetensors files.
  std::string TensorName() const;
};

struct ExtractReply {
  ExtractionContract contract;
  std::vector<std::vector<int64_t>> token_ids;  // per sequence, as the server saw them
  std::vector<ReceivedState> states;            // in arrival order
  StreamTotals totals;
};

struct ReceivedCompletion {
  uint32_t sequence_index = 0;
  std::vector<int64_t> prompt_token_ids;
  std::vector<int64_t> completion_token_ids;  // includes the stop token when one stopped it
  std::string finish_reason;                  // "stop_token" | "max_new_tokens"
};

struct GenerateReply {
  ExtractionContract contract;
  std::vector<ReceivedCompletion> completions;
  std::vector<ReceivedState> states;  // over prompt + completion of each prompt
  StreamTotals totals;
};

// A stored target tensor (GetTensors), in its stored dtype; its digest was checked on arrival.
struct ReceivedTensor {
  std::string name;
  std::vector<int64_t> shape;
  DType dtype = DType::kBF16;
  std::vector<std::byte> bytes;
  std::string digest;  // "xxh3-128:<hex>"
};

// A live verification session (the Session method; extractor.proto has the contract).
struct SessionOpenParams {
  InputSequence prompt;
  bool add_special_tokens = false;
  StateSelection states;  // returned for the prompt and for every verified block
  DType dtype = DType::kBF16;
  uint32_t max_new_tokens = 256;
  uint32_t max_draft_tokens = 15;
  double temperature = 0;  // 0: greedy
  double top_p = 1;
  uint32_t top_k = 0;
  uint64_t seed = 0;
  std::string request_id;
  uint32_t max_chunk_bytes = 0;
  double timeout_seconds = 0;  // the whole session's deadline; 0: the client's timeout_seconds
};

struct SessionOpenReply {
  std::string session_id;
  std::vector<int64_t> prompt_token_ids;
  int64_t next_token = -1;  // the pending token
  int64_t capacity = 0;
  int64_t max_draft_tokens = 0;
  std::vector<int64_t> eos_token_ids;
  std::vector<ReceivedState> states;  // the prompt's rows
};

struct SessionVerifyParams {
  std::vector<int64_t> draft_tokens;
  DraftRule rule = DraftRule::kArgmaxDraft;
  std::vector<float> draft_probs;  // [k, vocab] for kDraftDistribution
  std::vector<int32_t> parents;    // a tree; empty: a chain
  bool commit_accepted = false;    // commit every accepted draft in the same call
};

using SessionVerifyReply = SessionVerified<ReceivedState>;

// One open session: its calls in order from one thread. A refused verify or commit returns the
// server's status and the session goes on unchanged; any other error ends it (later calls fail).
// The destructor closes the stream (the server frees the session).
class ExtractorSession {
 public:
  ~ExtractorSession();
  ExtractorSession(const ExtractorSession&) = delete;
  ExtractorSession& operator=(const ExtractorSession&) = delete;

  const SessionOpenReply& opened() const { return opened_; }
  absl::StatusOr<SessionVerifyReply> Verify(const SessionVerifyParams& params);
  absl::StatusOr<SessionCommitted> Commit(int64_t accepted);
  // Half-closes the stream and returns its final status.
  absl::Status Close();

 private:
  friend class ExtractorClient;
  struct Stream;
  explicit ExtractorSession(std::unique_ptr<Stream> stream);
  std::unique_ptr<Stream> stream_;
  SessionOpenReply opened_;
};

class ExtractorClient {
 public:
  explicit ExtractorClient(ExtractorClientOptions options);
  ~ExtractorClient();
  ExtractorClient(const ExtractorClient&) = delete;
  ExtractorClient& operator=(const ExtractorClient&) = delete;

  const ExtractorClientOptions& options() const { return options_; }

  // The extraction contract of the loaded target.
  absl::StatusOr<ExtractionContract> Info();

  // Hidden states, collected in memory.
  absl::StatusOr<ExtractReply> Extract(const ExtractParams& params);
  // The same, handing each state to `on_state` as soon as its last chunk arrived (the reply then
  // holds no states): memory stays at one request's in-flight states. An error from `on_state`
  // cancels the call and is returned.
  using StateSink = std::function<absl::Status(ReceivedState&&)>;
  absl::StatusOr<ExtractReply> Extract(const ExtractParams& params, const StateSink& on_state);

  absl::StatusOr<GenerateReply> Generate(const GenerateParams& params);

  absl::StatusOr<std::vector<std::vector<int64_t>>> Tokenize(const std::vector<std::string>& texts,
                                                             bool add_special_tokens);
  absl::StatusOr<std::vector<std::string>> Detokenize(
      const std::vector<std::vector<int64_t>>& sequences, bool skip_special_tokens);

  // Opens a live verification session: the prompt is prefilled and the first token drawn.
  absl::StatusOr<std::unique_ptr<ExtractorSession>> OpenSession(const SessionOpenParams& params);

  // Named target tensors (e.g. "model.embed_tokens.weight", "lm_head.weight"), keyed by name.
  absl::StatusOr<std::map<std::string, ReceivedTensor>> GetTensors(
      const std::vector<std::string>& names, uint32_t max_chunk_bytes = 0);

 private:
  struct Rpc;  // channel + stub
  ExtractorClientOptions options_;
  std::unique_ptr<Rpc> rpc_;
};

}  // namespace specwire
