#include "services/extractor/server.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/payload_frame.h"
#include "common/rpc/stream_reactor.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "common/wire.h"
#include "services/extractor/stream_convert.h"

namespace specwire {
namespace {

// Encodes the messages of the Extract and Generate streams: a chunk with its bytes as a payload
// that goes out without a copy (payload_frame.h), anything else as protobuf serializes it.
template <class Response>
struct ChunkEncoder {
  static void Encode(const Response& m, Payload payload, grpc::ByteBuffer* out) {
    if (m.has_chunk() && !payload.bytes.empty()) {
      *out = FrameWithPayload(Response::kChunkFieldNumber, m.chunk(),
                              v1::HiddenStateChunk::kDataFieldNumber, std::move(payload));
      return;
    }
    bool own = false;
    // Serializing a message we built cannot fail but for a message over 2 GiB, which the chunk
    // limit rules out.
    (void)grpc::SerializationTraits<Response>::Serialize(m, out, &own);
  }
};

// The reactor of a hidden-state stream: raw, so chunk bytes are sent where they lie.
template <class Response>
using StateStreamReactor = StreamReactor<Response, ChunkEncoder<Response>>;

// What one hidden-state stream sends after the contract, besides its chunks and trailer.
template <class Response>
struct StreamBody {
  // Token ids of each sequence the states cover (their row count), in sequence_index order.
  std::vector<std::vector<int64_t>> sequences;
  // Messages that go before the states; null: none.
  typename StateStreamReactor<Response>::Producer before_states;
};

// The two hidden-state streams: what ExtractorService::StreamHiddenStates needs to know of each.
// kWork / kInputs / kOnDone name the Job members of that kind (scheduler.h).
struct ExtractRpc {
  using Request = v1::ExtractRequest;
  using Response = v1::ExtractResponse;
  using Work = ExtractWork;
  using Output = ExtractOutput;
  static constexpr const char* kMethod = "Extract";
  static constexpr Job::Kind kKind = Job::Kind::kExtract;
  static constexpr auto kWork = &Job::extract;
  static constexpr auto kInputs = &ExtractWork::sequences;
  static constexpr auto kOnDone = &Job::on_extract_done;
  // A SequenceInfo (the token ids as the server saw them) before each sequence's states.
  static constexpr bool kAnnouncesSequences = true;

  static absl::StatusOr<Work> Validate(const ExtractorService& service, const Request& request) {
    return service.ValidateExtract(request);
  }
  // The states cover the inputs themselves.
  static StreamBody<Response> Body(std::vector<std::vector<int64_t>> inputs, const Output&) {
    return {std::move(inputs), nullptr};
  }
};

struct GenerateRpc {
  using Request = v1::GenerateRequest;
  using Response = v1::GenerateResponse;
  using Work = GenerateWork;
  using Output = GenerateOutput;
  static constexpr const char* kMethod = "Generate";
  static constexpr Job::Kind kKind = Job::Kind::kGenerate;
  static constexpr auto kWork = &Job::generate;
  static constexpr auto kInputs = &GenerateWork::prompts;
  static constexpr auto kOnDone = &Job::on_generate_done;
  // Generate streams carry the Completions instead of SequenceInfo.
  static constexpr bool kAnnouncesSequences = false;

  static absl::StatusOr<Work> Validate(const ExtractorService& service, const Request& request) {
    return service.ValidateGenerate(request);
  }
  // Every Completion first; the states cover prompt + completion.
  static StreamBody<Response> Body(std::vector<std::vector<int64_t>> prompts, const Output& out) {
    StreamBody<Response> body;
    auto completions = std::make_shared<std::vector<v1::Completion>>();
    for (size_t i = 0; i < out.completions.size(); ++i) {
      const std::vector<int64_t>& completion = out.completions[i].tokens;
      completions->emplace_back();
      CompletionToProto(static_cast<uint32_t>(i), prompts[i], out.completions[i],
                        &completions->back());
      std::vector<int64_t> seq = std::move(prompts[i]);
      seq.insert(seq.end(), completion.begin(), completion.end());
      body.sequences.push_back(std::move(seq));
    }
    body.before_states = [completions, i = size_t{0}](Response* m) mutable {
      if (i >= completions->size()) return false;
      *m->mutable_completion() = std::move((*completions)[i++]);
      return true;
    };
    return body;
  }
};

// Emits, lazily, the messages of a list of host states: when `Rpc` announces sequences, one
// SequenceInfo before the first state of each sequence; then the state's chunks in row order,
// each chunk's bytes left in `payload` (the reactor's slot) rather than copied into the message.
// Holds the states (and so the engine's buffers) until the stream has written them; a chunk in
// flight holds its own reference.
template <class Rpc>
class ChunkProducer {
 public:
  ChunkProducer(std::vector<HostState> states, std::vector<std::vector<int64_t>> token_ids,
                int64_t max_chunk_bytes, ExtractorMetrics* metrics, Payload* payload)
      : states_(std::move(states)),
        token_ids_(std::move(token_ids)),
        max_chunk_bytes_(max_chunk_bytes),
        metrics_(metrics),
        payload_(payload) {}

  // Fills the next message into `m`; false when exhausted.
  bool Next(typename Rpc::Response* m) {
    while (state_ < states_.size()) {
      const HostState& s = states_[state_];
      if (static_cast<int64_t>(s.sequence_index) != last_sequence_) {
        last_sequence_ = s.sequence_index;
        if constexpr (Rpc::kAnnouncesSequences) {
          SequenceInfoToProto(s.sequence_index, token_ids_[s.sequence_index],
                              m->mutable_sequence());
          return true;
        }
      }
      if (chunk_ == 0) {
        plan_ = PlanChunks(s.bytes, s.rows, s.hidden * static_cast<int64_t>(DTypeSize(s.dtype)),
                           max_chunk_bytes_);
      }
      if (chunk_ < plan_.size()) {
        const ChunkSpan& c = plan_[chunk_++];
        HiddenStateChunkHeaderToProto(s, c, m->mutable_chunk());
        *payload_ = Payload{c.bytes, s.owner};
        ++chunks_;
        bytes_ += static_cast<int64_t>(c.bytes.size());
        metrics_->BytesStreamed(static_cast<int64_t>(c.bytes.size()));
        return true;
      }
      // State fully written: release its buffer early.
      states_[state_].owner.reset();
      ++state_;
      chunk_ = 0;
    }
    return false;
  }

  int64_t chunks() const { return chunks_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<HostState> states_;
  std::vector<std::vector<int64_t>> token_ids_;
  int64_t max_chunk_bytes_;
  ExtractorMetrics* metrics_;
  Payload* payload_;
  size_t state_ = 0;
  size_t chunk_ = 0;
  std::vector<ChunkSpan> plan_;
  int64_t last_sequence_ = -1;
  int64_t chunks_ = 0;
  int64_t bytes_ = 0;
};

// The job's completion callback (on the worker thread): after the contract, the stream carries
// the body's messages, the states' chunks, then the trailer; or it fails with the job's error.
template <class Rpc>
auto OnJobDone(StateStreamReactor<typename Rpc::Response>* r, ExtractorMetrics* metrics,
               std::string request_id, int64_t chunk_bytes,
               std::vector<std::vector<int64_t>> inputs) {
  using Response = typename Rpc::Response;
  return [r, metrics, request_id = std::move(request_id), chunk_bytes, inputs = std::move(inputs)](
             absl::StatusOr<typename Rpc::Output> out, const Job::Timing& timing) mutable {
    metrics->QueueWait(timing.queue_seconds);
    if (!out.ok()) {
      r->Fail(out.status());
      r->ReleaseWork();
      return;
    }
    StreamBody<Response> body = Rpc::Body(std::move(inputs), *out);
    StreamTotals totals;
    totals.request_id = request_id;
    totals.sequences = static_cast<uint32_t>(body.sequences.size());
    for (const auto& s : body.sequences) totals.tokens += s.size();
    totals.queue_seconds = timing.queue_seconds;
    totals.compute_seconds = timing.compute_seconds;
    metrics->Tokens(Rpc::kMethod, static_cast<int64_t>(totals.tokens));
    if (body.before_states) r->Send(std::move(body.before_states));
    auto producer = std::make_shared<ChunkProducer<Rpc>>(
        std::move(out->states), std::move(body.sequences), chunk_bytes, metrics,
        r->payload_slot());
    r->Send([producer](Response* m) { return producer->Next(m); });
    r->Send([producer, totals, sent = false](Response* m) mutable {
      if (sent) return false;
      totals.chunks = static_cast<uint64_t>(producer->chunks());
      totals.bytes = static_cast<uint64_t>(producer->bytes());
      StreamTotalsToProto(totals, m->mutable_trailer());
      return sent = true;
    });
    r->Complete();
    r->ReleaseWork();
  };
}

}  // namespace

ExtractorService::ExtractorService(ExtractorBackend* backend, Scheduler* scheduler,
                                   const Tokenizer* tokenizer, ExtractorMetrics* metrics,
                                   ExtractorLimits limits)
    : backend_(backend),
      scheduler_(scheduler),
      tokenizer_(tokenizer),
      metrics_(metrics),
      limits_(limits),
      idle_watchdog_(
          std::chrono::milliseconds(static_cast<int64_t>(limits.stream_idle_seconds * 1000)),
          "--stream_idle_seconds"),
      sessions_(backend, scheduler, metrics,
                SessionLimits{limits.max_sessions, limits.max_session_tokens,
                              /*max_draft_tokens=*/64, limits.session_idle_seconds,
                              limits.session_cache_bytes, limits.default_chunk_bytes,
                              limits.max_chunk_bytes},
                [this](const v1::SessionOpen& open) { return ValidateSessionOpen(open); }) {}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* ExtractorService::Session(
    grpc::CallbackServerContext* ctx) {
  return sessions_.Start(ctx);
}

absl::StatusOr<SessionWork> ExtractorService::ValidateSessionOpen(
    const v1::SessionOpen& request) const {
  SessionWork work;
  google::protobuf::RepeatedPtrField<v1::SequenceInput> prompts;
  *prompts.Add() = request.prompt();
  SW_ASSIGN_OR_RETURN(auto resolved,
                      ResolveInputs(prompts, request.add_special_tokens(), "open.prompt"));
  work.prompt = std::move(resolved.front());
  work.max_new_tokens = request.max_new_tokens() == 0 ? 256 : request.max_new_tokens();
  if (work.max_new_tokens > limits_.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("open.max_new_tokens: ", work.max_new_tokens,
                                                   " exceeds the limit of ",
                                                   limits_.max_new_tokens,
                                                   " (--max_new_tokens_limit)"));
  }
  work.max_draft_tokens = request.max_draft_tokens() == 0 ? 15 : request.max_draft_tokens();
  const v1::SessionSampling& s = request.sampling();
  if (!(s.temperature() >= 0) || !std::isfinite(s.temperature())) {
    return absl::InvalidArgumentError(absl::StrCat("open.sampling.temperature: ",
                                                   s.temperature(), " must be finite and ≥ 0"));
  }
  if (!(s.top_p() >= 0 && s.top_p() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("open.sampling.top_p: ", s.top_p(), " must be in (0, 1] (0: 1)"));
  }
  work.temperature = s.temperature();
  work.top_p = s.top_p() == 0 ? 1 : s.top_p();
  work.top_k = s.top_k();
  work.seed = s.seed();
  SW_ASSIGN_OR_RETURN(work.selection, ResolveSelection(request.layers()));
  SW_ASSIGN_OR_RETURN(work.wire_dtype, ResolveDType(request.dtype(), "open.dtype"));
  return work;
}

std::function<void(const std::string&, double)> ExtractorService::DoneHook(const char* method) {
  return [this, method](const std::string& code, double seconds) {
    metrics_->RequestDone(method, code, seconds);
  };
}

// The slot is given back when the final status is handed to gRPC, not at OnDone: the client may
// already hold that status and open its next stream before OnDone runs.
std::function<void()> ExtractorService::SlotRelease(bool holds_slot, std::string peer) {
  if (!holds_slot) return nullptr;
  return [this, peer = std::move(peer)] { CloseStream(peer); };
}

namespace {

// "ipv4:127.0.0.1:53412" → "ipv4:127.0.0.1" (a client's connections differ in the port only).
std::string PeerAddress(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  const size_t first = peer.find(':');
  return colon == std::string::npos || colon == first ? peer : peer.substr(0, colon);
}

}  // namespace

absl::Status ExtractorService::TryOpenStream(const grpc::CallbackServerContext* ctx,
                                             std::string* peer) {
  if (active_streams_.fetch_add(1) >= limits_.max_concurrent_streams) {
    active_streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat("too many concurrent streams (",
                                                     limits_.max_concurrent_streams,
                                                     ", --max_concurrent_streams); retry later"));
  }
  *peer = PeerAddress(ctx->peer());
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    int64_t& n = streams_by_peer_[*peer];
    if (limits_.max_streams_per_peer > 0 && n >= limits_.max_streams_per_peer) {
      if (n == 0) streams_by_peer_.erase(*peer);
      active_streams_.fetch_sub(1);
      return absl::ResourceExhaustedError(absl::StrCat("too many concurrent streams from ", *peer,
                                                       " (", limits_.max_streams_per_peer,
                                                       ", --max_streams_per_peer); retry later"));
    }
    ++n;
  }
  metrics_->StreamOpened();
  UpdateCapacity();
  return absl::OkStatus();
}

void ExtractorService::UpdateCapacity() {
  if (!capacity_observer_) return;
  std::lock_guard<std::mutex> lock(capacity_mu_);
  const bool room = active_streams_.load() < limits_.max_concurrent_streams;
  if (room == had_room_) return;
  had_room_ = room;
  capacity_observer_(room);
}

void ExtractorService::CloseStream(const std::string& peer) {
  {
    std::lock_guard<std::mutex> lock(peers_mu_);
    auto it = streams_by_peer_.find(peer);
    if (it != streams_by_peer_.end() && --it->second <= 0) streams_by_peer_.erase(it);
  }
  active_streams_.fetch_sub(1);
  metrics_->StreamClosed();
  UpdateCapacity();
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ExtractorService::ResolveInputs(
    const google::protobuf::RepeatedPtrField<v1::SequenceInput>& inputs, bool add_special,
    const char* field) const {
  if (inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": no sequence given"));
  if (inputs.size() > limits_.max_sequences_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", inputs.size(), " sequences exceed the limit of ",
                     limits_.max_sequences_per_request, " (--max_sequences_per_request)"));
  }
  const int64_t vocab = backend_->vocab_size();
  std::vector<std::vector<int64_t>> out;
  int64_t total = 0;
  for (int i = 0; i < inputs.size(); ++i) {
    const v1::SequenceInput& in = inputs[i];
    std::vector<int64_t> ids;
    if (in.has_tokens()) {
      const auto& t = in.tokens().ids();
      for (int j = 0; j < t.size(); ++j) {
        if (t[j] < 0 || t[j] >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat(field, "[", i, "].tokens.ids[", j, "] = ", t[j],
                           " is outside the vocabulary [0, ", vocab, ")"));
        }
        ids.push_back(t[j]);
      }
    } else if (in.input_case() == v1::SequenceInput::kText) {
      if (static_cast<int64_t>(in.text().size()) > limits_.max_text_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, "[", i, "].text: ", in.text().size(), " bytes exceed the limit of ",
                         limits_.max_text_bytes, " (--max_text_bytes)"));
      }
      if (tokenizer_ == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat(field, "[", i,
                         "].text: this extractor has no tokenizer (no tokenizer.json); send "
                         "token ids"));
      }
      std::lock_guard<std::mutex> lock(tokenizer_mu_);
      auto enc = tokenizer_->Encode(in.text(), add_special);
      if (!enc.ok()) return Annotate(enc.status(), absl::StrCat(field, "[", i, "].text"));
      ids = std::move(*enc);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: neither tokens nor text given"));
    }
    if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: empty"));
    if (static_cast<int64_t>(ids.size()) > limits_.max_tokens_per_sequence) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", ids.size(), " tokens exceed the limit of ",
                       limits_.max_tokens_per_sequence, " (--max_tokens_per_sequence)"));
    }
    total += static_cast<int64_t>(ids.size());
    out.push_back(std::move(ids));
  }
  if (total > limits_.max_tokens_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", total, " tokens in all exceed the limit of ",
                     limits_.max_tokens_per_request, " (--max_tokens_per_request)"));
  }
  return out;
}

absl::StatusOr<StateSelection> ExtractorService::ResolveSelection(
    const v1::LayerSelection& s) const {
  StateSelection sel = StateSelectionFromProto(s);
  const int64_t L = backend_->num_layers();
  std::vector<int64_t> unique;
  for (size_t i = 0; i < sel.layer_ids.size(); ++i) {
    const int64_t id = sel.layer_ids[i];
    if (id < 0 || id >= L) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers.layer_ids[", i, "] = ", id, " is outside [0, ", L,
          "): layer k is the output of decoder layer k (HF hidden_states[k+1]); use final_norm "
          "for HF hidden_states[",
          L, "] and embedding for hidden_states[0]"));
    }
    if (std::find(unique.begin(), unique.end(), id) == unique.end()) unique.push_back(id);
  }
  sel.layer_ids = std::move(unique);
  return sel;
}

absl::StatusOr<DType> ExtractorService::ResolveDType(v1::WireDType d, const char* field) const {
  const absl::StatusOr<DType> dtype = WireDTypeFromProto(d);
  if (dtype.ok() && (*dtype == DType::kBF16 || *dtype == DType::kF32)) return *dtype;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", static_cast<int>(d), " is not a hidden-state dtype (BF16 or F32)"));
}

absl::StatusOr<int64_t> ExtractorService::ResolveChunkBytes(uint32_t requested) const {
  if (requested == 0) return limits_.default_chunk_bytes;
  return std::min<int64_t>(requested, limits_.max_chunk_bytes);
}

absl::StatusOr<ExtractWork> ExtractorService::ValidateExtract(
    const v1::ExtractRequest& request) const {
  ExtractWork work;
  SW_ASSIGN_OR_RETURN(work.sequences, ResolveInputs(request.sequences(),
                                                    request.add_special_tokens(), "sequences"));
  SW_ASSIGN_OR_RETURN(work.selection, ResolveSelection(request.layers()));
  if (work.selection.empty()) {
    return absl::InvalidArgumentError(
        "layers: nothing requested (give layer_ids, embedding or final_norm)");
  }
  SW_ASSIGN_OR_RETURN(work.wire_dtype, ResolveDType(request.dtype(), "dtype"));
  return work;
}

absl::StatusOr<GenerateWork> ExtractorService::ValidateGenerate(
    const v1::GenerateRequest& request) const {
  GenerateWork work;
  SW_ASSIGN_OR_RETURN(work.prompts,
                      ResolveInputs(request.prompts(), request.add_special_tokens(), "prompts"));
  if (request.max_new_tokens() == 0) {
    return absl::InvalidArgumentError("max_new_tokens: must be at least 1");
  }
  if (request.max_new_tokens() > limits_.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: ", request.max_new_tokens(),
                                                   " exceeds the limit of ", limits_.max_new_tokens,
                                                   " (--max_new_tokens_limit)"));
  }
  work.max_new_tokens = request.max_new_tokens();
  for (int i = 0; i < request.stop_token_ids_size(); ++i) {
    const int64_t id = request.stop_token_ids(i);
    if (id < 0 || id >= backend_->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("stop_token_ids[", i, "] = ", id,
                                                     " is outside the vocabulary [0, ",
                                                     backend_->vocab_size(), ")"));
    }
    work.stop_token_ids.push_back(id);
  }
  work.use_model_eos = !request.ignore_model_eos();
  SW_ASSIGN_OR_RETURN(work.selection, ResolveSelection(request.layers()));
  SW_ASSIGN_OR_RETURN(work.wire_dtype, ResolveDType(request.dtype(), "dtype"));
  return work;
}

grpc::ServerUnaryReactor* ExtractorService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                         const v1::GetModelInfoRequest*,
                                                         v1::ExtractionContract* response) {
  ContractToProto(backend_->contract(), response);
  metrics_->RequestDone("GetModelInfo", "OK", 0);
  auto* r = ctx->DefaultReactor();
  r->Finish(grpc::Status::OK);
  return r;
}

template <class Rpc>
grpc::ServerWriteReactor<grpc::ByteBuffer>* ExtractorService::StreamHiddenStates(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& raw_request) {
  using Response = typename Rpc::Response;
  std::string peer;
  const absl::Status slot = TryOpenStream(ctx, &peer);
  auto* r = new StateStreamReactor<Response>(SteadyDeadline(ctx), DoneHook(Rpc::kMethod),
                                             SlotRelease(slot.ok(), peer));
  if (!slot.ok()) {
    r->Fail(slot);
    return r;
  }
  r->WatchIdle(&idle_watchdog_, ctx);
  // A raw method gets the request's bytes: parsed here (Deserialize consumes its buffer).
  typename Rpc::Request request;
  grpc::ByteBuffer request_bytes(raw_request);
  if (!grpc::SerializationTraits<typename Rpc::Request>::Deserialize(&request_bytes, &request)
           .ok()) {
    r->Fail(absl::InvalidArgumentError(absl::StrCat(
        "request: not a valid ", Rpc::Request::descriptor()->full_name(), " message")));
    return r;
  }
  auto job = std::make_shared<Job>();
  job->kind = Rpc::kKind;
  absl::StatusOr<typename Rpc::Work> valid = Rpc::Validate(*this, request);
  if (!valid.ok()) {
    r->Fail(valid.status());
    return r;
  }
  typename Rpc::Work& work = (*job).*Rpc::kWork;
  work = *std::move(valid);
  const int64_t chunk_bytes = ResolveChunkBytes(request.max_chunk_bytes()).value();
  // The contract is queued before the job is submitted, so it is always the first message; writes
  // wait (Pause) until the job is accepted, so a refused submission still reaches the client as a
  // plain error status.
  r->Pause();
  Response first;
  ContractToProto(backend_->contract(), first.mutable_contract());
  r->SendMessage(std::move(first));

  job->deadline = SteadyDeadline(ctx);
  (*job).*Rpc::kOnDone =
      OnJobDone<Rpc>(r, metrics_, request.request_id(), chunk_bytes, work.*Rpc::kInputs);
  Scheduler* scheduler = scheduler_;
  r->AttachWork([job, scheduler](const absl::Status& why) {
    job->cancelled = true;
    // A queued job leaves the queue now (its callback fails the stream); a running one stops at
    // its next check.
    scheduler->Remove(job, why);
  });
  absl::Status submitted = scheduler_->Submit(job);
  metrics_->SetQueueDepth(scheduler_->queue_depth());
  if (!submitted.ok()) {
    r->Fail(submitted);  // before any message: the client sees a plain error status
    r->ReleaseWork();    // the callback will never run
  } else {
    r->Resume();
  }
  return r;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ExtractorService::Extract(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return StreamHiddenStates<ExtractRpc>(ctx, *request);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ExtractorService::Generate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return StreamHiddenStates<GenerateRpc>(ctx, *request);
}

grpc::ServerUnaryReactor* ExtractorService::Tokenize(grpc::CallbackServerContext* ctx,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  auto* r = ctx->DefaultReactor();
  absl::Status status = [&]() -> absl::Status {
    if (tokenizer_ == nullptr) {
      return absl::FailedPreconditionError("this extractor has no tokenizer (no tokenizer.json)");
    }
    // Before the work: every text within --max_text_bytes, and an answer that fits in one
    // message however the texts tokenize. A token holds at least one byte of its text (special
    // tokens added around it aside), and an id takes the varint length of vocab_size - 1 on the
    // wire (3 bytes below 2^21), plus framing per sequence.
    int64_t id_bytes = 1;
    for (uint64_t v = static_cast<uint64_t>(std::max<int64_t>(backend_->vocab_size() - 1, 1));
         v >= 128; v >>= 7) {
      ++id_bytes;
    }
    int64_t bound = 64;
    for (int i = 0; i < request->texts_size(); ++i) {
      const int64_t n = static_cast<int64_t>(request->texts(i).size());
      if (n > limits_.max_text_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("texts[", i, "]: ", n, " bytes exceed the limit of ",
                         limits_.max_text_bytes, " (--max_text_bytes)"));
      }
      bound += id_bytes * (n + 8) + 8;
    }
    if (bound > limits_.max_send_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "texts: ", request->texts_size(), " texts could tokenize to an answer of up to ", bound,
          " bytes, over the largest message this server sends (", limits_.max_send_message_bytes,
          " bytes, set by --max_chunk_bytes): send fewer or shorter texts per call"));
    }
    std::lock_guard<std::mutex> lock(tokenizer_mu_);
    for (int i = 0; i < request->texts_size(); ++i) {
      auto ids = tokenizer_->Encode(request->texts(i), request->add_special_tokens());
      if (!ids.ok()) return Annotate(ids.status(), absl::StrCat("texts[", i, "]"));
      TokenIdsToProto(*ids, response->add_sequences()->mutable_ids());
    }
    response->set_tokenizer_digest(backend_->contract().tokenizer_digest);
    // Normalization can grow a text (NFC: up to 3x in bytes) past the estimate above: the exact
    // size decides, before gRPC would refuse to send it.
    if (static_cast<int64_t>(response->ByteSizeLong()) > limits_.max_send_message_bytes) {
      const int64_t bytes = static_cast<int64_t>(response->ByteSizeLong());
      response->Clear();
      return absl::InvalidArgumentError(absl::StrCat(
          "texts: the answer is ", bytes, " bytes, over the largest message this server sends (",
          limits_.max_send_message_bytes,
          " bytes, set by --max_chunk_bytes): send fewer or shorter texts per call"));
    }
    return absl::OkStatus();
  }();
  metrics_->RequestDone("Tokenize",
                        status.ok() ? "OK" : GrpcCodeName(ToGrpcStatus(status).error_code()), 0);
  r->Finish(ToGrpcStatus(status));
  return r;
}

grpc::ServerUnaryReactor* ExtractorService::Detokenize(grpc::CallbackServerContext* ctx,
                                                       const v1::DetokenizeRequest* request,
                                                       v1::DetokenizeResponse* response) {
  auto* r = ctx->DefaultReactor();
  absl::Status status = [&]() -> absl::Status {
    if (tokenizer_ == nullptr) {
      return absl::FailedPreconditionError("this extractor has no tokenizer (no tokenizer.json)");
    }
    std::lock_guard<std::mutex> lock(tokenizer_mu_);
    for (int i = 0; i < request->sequences_size(); ++i) {
      const std::vector<int64_t> ids = TokenIdsFromProto(request->sequences(i).ids());
      auto text = tokenizer_->Decode(ids, request->skip_special_tokens());
      if (!text.ok()) return Annotate(text.status(), absl::StrCat("sequences[", i, "]"));
      response->add_texts(*text);
    }
    return absl::OkStatus();
  }();
  metrics_->RequestDone("Detokenize",
                        status.ok() ? "OK" : GrpcCodeName(ToGrpcStatus(status).error_code()), 0);
  r->Finish(ToGrpcStatus(status));
  return r;
}

grpc::ServerWriteReactor<v1::TensorChunk>* ExtractorService::GetTensors(
    grpc::CallbackServerContext* ctx, const v1::GetTensorsRequest* request) {
  std::string peer;
  const absl::Status slot = TryOpenStream(ctx, &peer);
  auto* r = new StreamReactor<v1::TensorChunk>(SteadyDeadline(ctx), DoneHook("GetTensors"),
                                               SlotRelease(slot.ok(), peer));
  if (!slot.ok()) {
    r->Fail(slot);
    return r;
  }
  r->WatchIdle(&idle_watchdog_, ctx);
  if (request->names().empty()) {
    r->Fail(absl::InvalidArgumentError("names: no tensor named"));
    return r;
  }
  auto tensors = std::make_shared<std::vector<TensorBytes>>();
  for (int i = 0; i < request->names_size(); ++i) {
    absl::StatusOr<TensorBytes> t;
    {
      std::lock_guard<std::mutex> lock(tensors_mu_);
      t = backend_->GetTensor(request->names(i));
    }
    if (!t.ok()) {
      r->Fail(Annotate(t.status(), absl::StrCat("names[", i, "]")));
      return r;
    }
    tensors->push_back(std::move(*t));
  }
  const int64_t chunk_bytes = ResolveChunkBytes(request->max_chunk_bytes()).value();
  ExtractorMetrics* metrics = metrics_;
  r->Send([tensors, chunk_bytes, metrics, ti = size_t{0},
           offset = uint64_t{0}](v1::TensorChunk* m) mutable {
    while (ti < tensors->size()) {
      const TensorBytes& t = (*tensors)[ti];
      if (offset < t.bytes.size() || (offset == 0 && t.bytes.empty())) {
        const uint64_t n = std::min<uint64_t>(chunk_bytes, t.bytes.size() - offset);
        auto piece = t.bytes.subspan(offset, n);
        TensorChunkToProto(t, offset, piece, m);
        metrics->BytesStreamed(static_cast<int64_t>(n));
        offset += n;
        if (t.bytes.empty()) offset = 1;  // an empty tensor sends one empty chunk
        return true;
      }
      ++ti;
      offset = 0;
    }
    return false;
  });
  r->Complete();
  return r;
}

}  // namespace specwire
