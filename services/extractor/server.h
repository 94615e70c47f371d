// The Extractor gRPC service (callback API). Reactions validate, enqueue work on the Scheduler and
// stream results; they never run the engine themselves.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/rpc/stream_watchdog.h"
#include "proto/convert.h"
#include "proto/specwire/v1/extractor.grpc.pb.h"
#include "services/extractor/metrics.h"
#include "services/extractor/scheduler.h"
#include "services/extractor/session_service.h"
#include "services/extractor/work.h"

namespace specwire {

class Tokenizer;

// Request limits, from flags (see extractor_main.cc for their documentation).
struct ExtractorLimits {
  int64_t max_sequences_per_request = 256;
  int64_t max_tokens_per_sequence = 32768;
  int64_t max_tokens_per_request = 262144;
  int64_t max_new_tokens = 4096;
  int64_t max_concurrent_streams = 64;
  // Streams open at once from one client address (ip, any port); 0: no cap beyond the total.
  int64_t max_streams_per_peer = 0;
  // A stream whose client has not read for this long (a write waiting on flow control) is
  // cancelled, freeing its slot and its work; 0: never.
  double stream_idle_seconds = 60;
  int64_t default_chunk_bytes = 1 << 20;
  int64_t max_chunk_bytes = 4 << 20;
  // A text input (Extract / Generate / Tokenize) is refused above this many bytes, before it is
  // tokenized (a byte-level BPE token holds at least one byte).
  int64_t max_text_bytes = 1 << 20;
  // The largest message the server sends (ServerStartOptions::max_send_message_bytes): a
  // Tokenize answer that could exceed it is refused before the work.
  int64_t max_send_message_bytes = 5 << 20;
  // Live verification sessions (session_service.h); chunk sizes are the ones above.
  int64_t max_sessions = 16;
  int64_t max_session_tokens = 16384;
  double session_idle_seconds = 300;
  int64_t session_cache_bytes = int64_t{4} << 30;
};

// Extract and Generate are raw methods (their requests parsed here, their chunks' bytes sent
// without a copy: common/rpc/payload_frame.h); the wire is the proto's.
class ExtractorService final
    : public v1::Extractor::WithRawCallbackMethod_Extract<
          v1::Extractor::WithRawCallbackMethod_Generate<v1::Extractor::CallbackService>> {
 public:
  // Everything passed in must outlive the service. `tokenizer` may be null (text inputs then get
  // FAILED_PRECONDITION).
  ExtractorService(ExtractorBackend* backend, Scheduler* scheduler, const Tokenizer* tokenizer,
                   ExtractorMetrics* metrics, ExtractorLimits limits);

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ExtractionContract* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Extract(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerWriteReactor<v1::TensorChunk>* GetTensors(
      grpc::CallbackServerContext* ctx, const v1::GetTensorsRequest* request) override;
  grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* Session(
      grpc::CallbackServerContext* ctx) override;

  // The checks Extract and Generate make before any work is queued, callable without a call
  // (fuzz/): the validated work, or INVALID_ARGUMENT / FAILED_PRECONDITION naming the field.
  absl::StatusOr<ExtractWork> ValidateExtract(const v1::ExtractRequest& request) const;
  absl::StatusOr<GenerateWork> ValidateGenerate(const v1::GenerateRequest& request) const;
  // A session's open request (the prompt, states, bounds and sampling), as above.
  absl::StatusOr<SessionWork> ValidateSessionOpen(const v1::SessionOpen& request) const;
  int64_t open_sessions() const { return sessions_.open_sessions(); }
  // The server begins to drain (SessionService::BeginDrain).
  void BeginDrain() { sessions_.BeginDrain(); }

  // Streams currently open (for the concurrency limit).
  int64_t active_streams() const { return active_streams_.load(); }
  // Called with false when every stream slot is taken (a new Extract / Generate / GetTensors
  // would be refused) and with true when one frees again: health then says NOT_SERVING while
  // no work can be admitted. Set before the server serves.
  void set_capacity_observer(std::function<void(bool has_room)> f) {
    capacity_observer_ = std::move(f);
  }

 private:
  // The one skeleton of the Extract and Generate streams (server.cc; `Rpc` is ExtractRpc or
  // GenerateRpc there, naming what differs): a stream slot, the request parsed, validation, the
  // contract as the first message, the job queued on the Scheduler with its cancel hook; when
  // the job is done, the call's own messages (Generate's completions), the states' chunks and
  // the trailer.
  template <class Rpc>
  grpc::ServerWriteReactor<grpc::ByteBuffer>* StreamHiddenStates(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& raw_request);
  struct Inputs;
  absl::StatusOr<std::vector<std::vector<int64_t>>> ResolveInputs(
      const google::protobuf::RepeatedPtrField<v1::SequenceInput>& inputs, bool add_special,
      const char* field) const;
  absl::StatusOr<StateSelection> ResolveSelection(const v1::LayerSelection& s) const;
  absl::StatusOr<DType> ResolveDType(v1::WireDType d, const char* field) const;
  absl::StatusOr<int64_t> ResolveChunkBytes(uint32_t requested) const;
  // A stream slot for the call's peer: OK, or RESOURCE_EXHAUSTED naming the limit hit.
  absl::Status TryOpenStream(const grpc::CallbackServerContext* ctx, std::string* peer);
  void CloseStream(const std::string& peer);
  // Records a finished stream's metrics (at OnDone).
  std::function<void(const std::string&, double)> DoneHook(const char* method);
  // Frees a stream's concurrency slot (as its final status is handed to gRPC); null if none held.
  std::function<void()> SlotRelease(bool holds_slot, std::string peer);

  ExtractorBackend* backend_;
  Scheduler* scheduler_;
  const Tokenizer* tokenizer_;
  mutable std::mutex tokenizer_mu_;  // the tokenizer's BPE cache is not thread-safe
  ExtractorMetrics* metrics_;
  ExtractorLimits limits_;
  std::atomic<int64_t> active_streams_{0};
  // Tells capacity_observer_ when "a slot is free" changes (under capacity_mu_).
  void UpdateCapacity();
  std::function<void(bool)> capacity_observer_;
  std::mutex capacity_mu_;
  bool had_room_ = true;
  std::mutex peers_mu_;
  std::map<std::string, int64_t> streams_by_peer_;  // open streams per client address
  StreamWatchdog idle_watchdog_;
  std::mutex tensors_mu_;  // GetTensors digests are computed lazily by the backend
  SessionService sessions_;  // last: its idle check runs while the rest is alive
};

}  // namespace specwire
