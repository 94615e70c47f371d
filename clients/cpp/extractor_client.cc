#include "clients/cpp/extractor_client.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/payload_frame.h"
#include "common/status.h"
#include "common/wire.h"
#include "clients/cpp/extractor_convert.h"
#include "proto/convert.h"
#include "proto/specwire/v1/extractor.grpc.pb.h"

namespace specwire {

struct ExtractorClient::Rpc {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Extractor::Stub> stub;
  // The hidden-state streams are read raw: chunk bytes are copied once, from gRPC's receive
  // buffers into the state (common/rpc/payload_frame.h).
  std::unique_ptr<grpc::GenericStub> generic;
};

namespace {

// A stream that does not follow the proto's conventions: the features cannot be trusted.
absl::Status StreamError(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("stream: ", what));
}

// A header the wire conversion refuses (a value outside the proto's enums) breaks the stream.
template <class T>
absl::StatusOr<T> FromStream(absl::StatusOr<T> converted) {
  if (!converted.ok()) return StreamError(converted.status().message());
  return converted;
}

void SetDeadline(const ExtractorClientOptions& o, grpc::ClientContext* ctx) {
  if (o.timeout_seconds > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(
                          std::chrono::duration<double>(o.timeout_seconds)));
  }
}

// Keeps a call's context registered with its CallCancellation (if any) while the call runs.
class CancelRegistration {
 public:
  CancelRegistration(CallCancellation* cancel, grpc::ClientContext* ctx)
      : cancel_(cancel), ctx_(ctx) {
    if (cancel_ != nullptr && !cancel_->Register(ctx_)) {
      cancel_ = nullptr;
      refused_ = true;
    }
  }
  ~CancelRegistration() {
    if (cancel_ != nullptr) cancel_->Unregister(ctx_);
  }
  CancelRegistration(const CancelRegistration&) = delete;
  CancelRegistration& operator=(const CancelRegistration&) = delete;
  // The job was cancelled before this call started: do not start it.
  bool refused() const { return refused_; }

 private:
  CallCancellation* cancel_;
  grpc::ClientContext* ctx_;
  bool refused_ = false;
};

// Rebuilds the states of one stream from its chunks. A state is handed to the sink the moment its
// last row arrives, and its buffer leaves the collector with it.
class StateCollector {
 public:
  StateCollector(const ExtractorClient::StateSink& sink, int64_t hidden_size)
      : sink_(sink), hidden_size_(hidden_size) {}

  // Rows every state of sequence `seq` must have (its token count), when known.
  void ExpectRows(uint32_t seq, int64_t rows) { expected_rows_[seq] = rows; }

  // `pieces` hold the chunk's bytes (views of the received message; c.data() is not read).
  absl::Status Add(const v1::HiddenStateChunk& c,
                   std::span<const std::span<const std::byte>> pieces) {
    const Key key{c.sequence_index(), static_cast<int>(c.state().tap()),
                  c.state().tap() == v1::TAP_LAYER_OUTPUT ? c.state().layer_id() : 0};
    auto it = pending_.find(key);
    if (it == pending_.end()) {
      SW_ASSIGN_OR_RETURN(auto state, StartState(c));
      if (done_.count(key)) {
        return StreamError(
            absl::StrCat(state.TensorName(), ": chunk after the state was complete"));
      }
      const DType dtype = state.dtype;
      Pending p{std::move(state), StateAssembler(c.sequence_length(), c.hidden_size(), dtype)};
      it = pending_.emplace(key, std::move(p)).first;
    }
    Pending& p = it->second;
    if (c.sequence_length() != p.assembler.rows()) {
      return StreamError(absl::StrCat(p.state.TensorName(), ": sequence_length ",
                                      c.sequence_length(), " differs from the state's ",
                                      p.assembler.rows()));
    }
    SW_ASSIGN_OR_RETURN(DType dtype, FromStream(WireDTypeFromProto(c.dtype())));
    absl::Status added = p.assembler.AddPieces(c.token_start(), c.token_count(), c.hidden_size(),
                                               dtype, pieces, c.crc32c());
    if (!added.ok()) return StreamError(absl::StrCat(p.state.TensorName(), ": ", added.message()));
    ++chunks_;
    for (std::span<const std::byte> piece : pieces) bytes_ += piece.size();
    if (p.assembler.complete()) {
      p.state.bytes = p.assembler.Release();
      ReceivedState done = std::move(p.state);
      pending_.erase(it);
      done_.insert(key);
      SW_RETURN_IF_ERROR(sink_(std::move(done)));
    }
    return absl::OkStatus();
  }

  // At the trailer: nothing half-received, and the server's totals match ours.
  absl::Status Finish(const StreamTotals& t) const {
    if (!pending_.empty()) {
      const Pending& p = pending_.begin()->second;
      return StreamError(absl::StrCat(p.state.TensorName(), ": trailer after ", p.assembler.rows(),
                                      "-row state was only partly sent"));
    }
    if (t.chunks != chunks_ || t.bytes != bytes_) {
      return StreamError(absl::StrCat("trailer counts ", t.chunks, " chunks / ", t.bytes,
                                      " bytes, received ", chunks_, " / ", bytes_));
    }
    return absl::OkStatus();
  }

 private:
  using Key = std::tuple<uint32_t, int, int32_t>;  // sequence, tap, layer id
  struct Pending {
    ReceivedState state;  // everything but the bytes
    StateAssembler assembler;
  };

  absl::StatusOr<ReceivedState> StartState(const v1::HiddenStateChunk& c) const {
    SW_ASSIGN_OR_RETURN(ReceivedState s, FromStream(ReceivedStateFromChunk(c)));
    // Checked before anything is allocated: a chunk's header decides the state's buffer size.
    if (s.hidden != hidden_size_) {
      return StreamError(absl::StrCat(s.TensorName(), ": hidden_size ", s.hidden,
                                      " differs from the contract's ", hidden_size_));
    }
    auto rows = expected_rows_.find(s.sequence_index);
    if (rows == expected_rows_.end()) {
      return StreamError(absl::StrCat(s.TensorName(), ": chunk of a sequence never announced"));
    }
    if (rows->second != s.rows) {
      return StreamError(absl::StrCat(s.TensorName(), ": sequence_length ", s.rows, " but the ",
                                      "sequence has ", rows->second, " tokens"));
    }
    return s;
  }

  const ExtractorClient::StateSink& sink_;
  int64_t hidden_size_;
  std::map<uint32_t, int64_t> expected_rows_;
  std::map<Key, Pending> pending_;
  std::set<Key> done_;
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
};

// A server-streaming call read raw through the generic stub, driven synchronously on its own
// completion queue: the request is sent and half-closed at the start, Read() returns each
// message's bytes, Finish() the status. Cancelling the context (CallCancellation, deadline)
// ends pending reads.
class RawStream {
 public:
  RawStream(grpc::GenericStub* stub, grpc::ClientContext* ctx, const std::string& method,
            const google::protobuf::MessageLite& request) {
    call_ = stub->PrepareCall(ctx, method, &cq_);
    call_->StartCall(this);
    open_ = Wait();
    if (open_) {
      grpc::Slice slice(request.SerializeAsString());
      call_->WriteLast(grpc::ByteBuffer(&slice, 1), grpc::WriteOptions(), this);
      open_ = Wait();
    }
  }
  ~RawStream() {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  bool Read(grpc::ByteBuffer* out) {
    if (!open_) return false;
    call_->Read(out, this);
    return open_ = Wait();
  }
  grpc::Status Finish() {
    grpc::Status status;
    call_->Finish(&status, this);
    Wait();
    return status;
  }

 private:
  bool Wait() {
    void* tag;
    bool ok = false;
    return cq_.Next(&tag, &ok) && ok;
  }
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool open_ = false;
};

// Ends a stream (a RawStream, or a typed reader of `Message`): cancels it if we stopped early,
// drains it and merges the two statuses. The server's status wins (it says why the stream
// broke); then ours; then the missing trailer.
template <class Message = grpc::ByteBuffer, class Stream>
absl::Status EndStream(grpc::ClientContext* ctx, Stream* stream, absl::Status ours,
                       bool saw_trailer) {
  if (!ours.ok()) {
    ctx->TryCancel();
    Message ignored;
    while (stream->Read(&ignored)) {
    }
  }
  grpc::Status server = stream->Finish();
  if (!ours.ok()) return ours;
  if (!server.ok()) return FromGrpcStatus(server);
  if (!saw_trailer) {
    return StreamError(
        "ended without a trailer (incomplete: the server failed or the call was cancelled)");
  }
  return absl::OkStatus();
}

// One received message of a hidden-state stream: a chunk is split from its bytes, which stay
// where gRPC received them (`pieces`, views into `slices`); anything else is parsed whole.
template <class Response>
absl::Status DecodeStateMessage(const grpc::ByteBuffer& frame, std::vector<grpc::Slice>* slices,
                                Response* msg,
                                std::vector<std::span<const std::byte>>* pieces) {
  msg->Clear();
  pieces->clear();
  slices->clear();
  if (!frame.Dump(slices).ok()) return StreamError("unreadable message");
  SW_ASSIGN_OR_RETURN(bool split, SplitPayloadFrame(*slices, Response::kChunkFieldNumber,
                                                    v1::HiddenStateChunk::kDataFieldNumber,
                                                    msg->mutable_chunk(), pieces));
  if (split) return absl::OkStatus();
  msg->Clear();
  std::string whole;
  for (const grpc::Slice& s : *slices) {
    whole.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  if (!msg->ParseFromString(whole)) return StreamError("malformed message");
  if (msg->has_chunk() && !msg->chunk().data().empty()) {
    // A chunk in any other shape: its bytes, moved out of the message, are the one piece.
    auto* kept = new std::string(std::move(*msg->mutable_chunk()->mutable_data()));
    slices->clear();
    slices->emplace_back(kept->data(), kept->size(),
                         [](void* p) { delete static_cast<std::string*>(p); }, kept);
    pieces->emplace_back(reinterpret_cast<const std::byte*>(slices->back().begin()),
                         slices->back().size());
  }
  return absl::OkStatus();
}

// The one read loop of the Extract and Generate streams. Opens the call (deadline, cancellation:
// `method` names it in the error of a call cancelled before it started, and the call's path),
// then checks the stream's shape: the contract first and only once; the call's own message (case
// `own_case`: Extract's SequenceInfo, Generate's Completion) to `on_own`, which tells the
// collector how many rows each sequence's states have; every chunk through a StateCollector that
// hands finished states to `on_state`; the trailer, whose totals must match what arrived, and
// nothing after it. Fills `contract` and `totals`; any break of this shape is DATA_LOSS
// (EndStream merges the statuses).
template <class Response, class OnOwn>
absl::Status ReadStateStream(const ExtractorClientOptions& options, CallCancellation* cancel,
                             grpc::GenericStub* stub, const char* method,
                             const google::protobuf::MessageLite& request,
                             typename Response::MessageCase own_case, const OnOwn& on_own,
                             const ExtractorClient::StateSink& on_state,
                             ExtractionContract* contract, StreamTotals* totals) {
  grpc::ClientContext ctx;
  SetDeadline(options, &ctx);
  CancelRegistration registration(cancel, &ctx);
  if (registration.refused()) {
    return absl::CancelledError(absl::StrCat(method, ": cancelled before it started"));
  }
  RawStream stream(stub, &ctx, absl::StrCat("/specwire.v1.Extractor/", method), request);
  std::unique_ptr<StateCollector> states;  // created once the contract gives the hidden size
  bool saw_trailer = false;
  grpc::ByteBuffer frame;
  std::vector<grpc::Slice> slices;
  std::vector<std::span<const std::byte>> pieces;
  Response msg;
  absl::Status ours = [&]() -> absl::Status {
    while (stream.Read(&frame)) {
      SW_RETURN_IF_ERROR(DecodeStateMessage(frame, &slices, &msg, &pieces));
      if (saw_trailer) return StreamError("message after the trailer");
      if (!states && !msg.has_contract()) return StreamError("first message is not the contract");
      const typename Response::MessageCase message = msg.message_case();
      if (message == Response::kContract) {
        if (states) return StreamError("second contract");
        *contract = ContractFromProto(msg.contract());
        states = std::make_unique<StateCollector>(on_state, contract->hidden_size);
      } else if (message == own_case) {
        SW_RETURN_IF_ERROR(on_own(msg, *states));
      } else if (message == Response::kChunk) {
        SW_RETURN_IF_ERROR(states->Add(msg.chunk(), pieces));
      } else if (message == Response::kTrailer) {
        *totals = StreamTotalsFromProto(msg.trailer());
        SW_RETURN_IF_ERROR(states->Finish(*totals));
        saw_trailer = true;
      } else {
        return StreamError("empty message");
      }
    }
    return absl::OkStatus();
  }();
  return EndStream(&ctx, &stream, ours, saw_trailer);
}

}  // namespace

void CallCancellation::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  // TryCancel is safe on a call that has not started yet (it is cancelled when it starts) and
  // on one that already finished.
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
}

bool CallCancellation::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool CallCancellation::Register(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return false;
  calls_.insert(ctx);
  return true;
}

void CallCancellation::Unregister(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(mu_);
  calls_.erase(ctx);
}

std::string ReceivedState::TensorName() const {
  return absl::StrCat("seq.", sequence_index, ".", state);
}

ExtractorClient::ExtractorClient(ExtractorClientOptions options)
    : options_(std::move(options)), rpc_(std::make_unique<Rpc>()) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  // Only the first delay is shortened: gRPC also takes GRPC_ARG_MIN_RECONNECT_BACKOFF_MS as the
  // timeout of each connection attempt, and 100 ms would fail handshakes on a loaded host.
  if (options_.initial_reconnect_backoff_ms > 0) {
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, options_.initial_reconnect_backoff_ms);
  }
  if (options_.max_reconnect_backoff_ms > 0) {
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options_.max_reconnect_backoff_ms);
  }
  rpc_->channel = MakeChannel(options_.target, options_.security, args);
  rpc_->stub = v1::Extractor::NewStub(rpc_->channel);
  rpc_->generic = std::make_unique<grpc::GenericStub>(rpc_->channel);
}

ExtractorClient::~ExtractorClient() = default;

absl::StatusOr<ExtractionContract> ExtractorClient::Info() {
  grpc::ClientContext ctx;
  SetDeadline(options_, &ctx);
  v1::ExtractionContract reply;
  grpc::Status s = rpc_->stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return ContractFromProto(reply);
}

absl::StatusOr<ExtractReply> ExtractorClient::Extract(const ExtractParams& params) {
  std::vector<ReceivedState> states;
  SW_ASSIGN_OR_RETURN(ExtractReply reply, Extract(params, [&](ReceivedState&& s) {
                        states.push_back(std::move(s));
                        return absl::OkStatus();
                      }));
  reply.states = std::move(states);
  return reply;
}

absl::StatusOr<ExtractReply> ExtractorClient::Extract(const ExtractParams& params,
                                                      const StateSink& on_state) {
  v1::ExtractRequest req;
  ExtractRequestToProto(params, &req);
  ExtractReply reply;
  reply.token_ids.resize(params.sequences.size());
  // A SequenceInfo: the token ids the server saw, and so the rows of that sequence's states.
  auto on_sequence = [&](const v1::ExtractResponse& msg, StateCollector& states) -> absl::Status {
    const uint32_t i = msg.sequence().sequence_index();
    if (i >= reply.token_ids.size()) {
      return StreamError(absl::StrCat("sequence_index ", i, " but ", reply.token_ids.size(),
                                      " sequences were sent"));
    }
    reply.token_ids[i] = TokenIdsFromProto(msg.sequence().token_ids());
    states.ExpectRows(i, static_cast<int64_t>(reply.token_ids[i].size()));
    return absl::OkStatus();
  };
  SW_RETURN_IF_ERROR(ReadStateStream<v1::ExtractResponse>(
      options_, params.cancel, rpc_->generic.get(), "Extract", req,
      v1::ExtractResponse::kSequence, on_sequence, on_state, &reply.contract, &reply.totals));
  return reply;
}

absl::StatusOr<GenerateReply> ExtractorClient::Generate(const GenerateParams& params) {
  v1::GenerateRequest req;
  GenerateRequestToProto(params, &req);
  GenerateReply reply;
  const StateSink keep = [&](ReceivedState&& s) {
    reply.states.push_back(std::move(s));
    return absl::OkStatus();
  };
  // A Completion: its states cover prompt + completion.
  auto on_completion = [&](const v1::GenerateResponse& msg,
                           StateCollector& states) -> absl::Status {
    const v1::Completion& c = msg.completion();
    if (c.sequence_index() >= params.prompts.size()) {
      return StreamError(absl::StrCat("completion for prompt ", c.sequence_index(), " but ",
                                      params.prompts.size(), " prompts were sent"));
    }
    ReceivedCompletion r = CompletionFromProto(c);
    states.ExpectRows(r.sequence_index, static_cast<int64_t>(r.prompt_token_ids.size() +
                                                             r.completion_token_ids.size()));
    reply.completions.push_back(std::move(r));
    return absl::OkStatus();
  };
  SW_RETURN_IF_ERROR(ReadStateStream<v1::GenerateResponse>(
      options_, params.cancel, rpc_->generic.get(), "Generate", req,
      v1::GenerateResponse::kCompletion, on_completion, keep, &reply.contract, &reply.totals));
  if (reply.completions.size() != params.prompts.size()) {
    return StreamError(absl::StrCat(reply.completions.size(), " completions for ",
                                    params.prompts.size(), " prompts"));
  }
  return reply;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ExtractorClient::Tokenize(
    const std::vector<std::string>& texts, bool add_special_tokens) {
  v1::TokenizeRequest req;
  for (const auto& t : texts) req.add_texts(t);
  req.set_add_special_tokens(add_special_tokens);
  grpc::ClientContext ctx;
  SetDeadline(options_, &ctx);
  v1::TokenizeResponse reply;
  grpc::Status s = rpc_->stub->Tokenize(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  std::vector<std::vector<int64_t>> out;
  for (const auto& seq : reply.sequences()) out.push_back(TokenIdsFromProto(seq.ids()));
  return out;
}

absl::StatusOr<std::vector<std::string>> ExtractorClient::Detokenize(
    const std::vector<std::vector<int64_t>>& sequences, bool skip_special_tokens) {
  v1::DetokenizeRequest req;
  for (const auto& seq : sequences) TokenIdsToProto(seq, req.add_sequences()->mutable_ids());
  req.set_skip_special_tokens(skip_special_tokens);
  grpc::ClientContext ctx;
  SetDeadline(options_, &ctx);
  v1::DetokenizeResponse reply;
  grpc::Status s = rpc_->stub->Detokenize(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<std::string>(reply.texts().begin(), reply.texts().end());
}

absl::StatusOr<std::map<std::string, ReceivedTensor>> ExtractorClient::GetTensors(
    const std::vector<std::string>& names, uint32_t max_chunk_bytes) {
  v1::GetTensorsRequest req;
  for (const auto& n : names) req.add_names(n);
  req.set_max_chunk_bytes(max_chunk_bytes);
  grpc::ClientContext ctx;
  SetDeadline(options_, &ctx);
  auto reader = rpc_->stub->GetTensors(&ctx, req);

  std::map<std::string, ReceivedTensor> out;
  ReceivedTensor current;  // the tensor being received; empty name: none
  uint64_t total_bytes = 0;
  bool started = false;
  // A tensor is done when its last byte arrived; its digest is checked then.
  auto finish_current = [&]() -> absl::Status {
    if (!started) return absl::OkStatus();
    if (current.bytes.size() != total_bytes) {
      return StreamError(absl::StrCat(current.name, ": ", current.bytes.size(), " of ", total_bytes,
                                      " bytes received"));
    }
    const std::string digest = DigestBytes(current.bytes);
    if (digest != current.digest) {
      return absl::DataLossError(absl::StrCat(current.name, ": digest ", digest,
                                              " of the received bytes, server says ",
                                              current.digest));
    }
    out[current.name] = std::move(current);
    current = ReceivedTensor();
    started = false;
    return absl::OkStatus();
  };
  v1::TensorChunk c;
  absl::Status ours = [&]() -> absl::Status {
    while (reader->Read(&c)) {
      if (!started || c.name() != current.name) {
        SW_RETURN_IF_ERROR(finish_current());
        if (c.offset() != 0) {
          return StreamError(absl::StrCat(c.name(), ": first chunk at offset ", c.offset()));
        }
        SW_ASSIGN_OR_RETURN(current, FromStream(ReceivedTensorFromChunk(c)));
        total_bytes = c.total_bytes();
        uint64_t expected = DTypeSize(current.dtype);
        for (int64_t d : current.shape) expected *= static_cast<uint64_t>(d);
        if (expected != total_bytes) {
          return StreamError(absl::StrCat(c.name(), ": total_bytes ", total_bytes,
                                          " but the shape holds ", expected));
        }
        current.bytes.reserve(total_bytes);
        started = true;
      }
      if (c.offset() != current.bytes.size() || c.offset() + c.data().size() > total_bytes) {
        return StreamError(absl::StrCat(c.name(), ": chunk at offset ", c.offset(), " (",
                                        c.data().size(), " bytes) after ", current.bytes.size(),
                                        " of ", total_bytes, " bytes"));
      }
      const auto* data = reinterpret_cast<const std::byte*>(c.data().data());
      std::span<const std::byte> piece(data, c.data().size());
      if (Crc32c(piece) != c.crc32c()) {
        return absl::DataLossError(
            absl::StrCat(c.name(), ": crc32c mismatch in the chunk at offset ", c.offset()));
      }
      current.bytes.insert(current.bytes.end(), piece.begin(), piece.end());
    }
    return finish_current();
  }();
  // GetTensors streams have no trailer: completeness is every requested name present.
  SW_RETURN_IF_ERROR(EndStream<v1::TensorChunk>(&ctx, reader.get(), ours, /*saw_trailer=*/true));
  for (const auto& n : names) {
    if (!out.count(n)) return StreamError(absl::StrCat(n, ": requested but not sent"));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Live verification sessions.

namespace {
std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
}  // namespace

struct ExtractorSession::Stream {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionResponse>> rw;
  int64_t hidden_size = 0;
  absl::Status broken;  // set once the stream failed: every later call returns it
  bool closed = false;

  // The stream's end status, once a read or write failed.
  absl::Status End() {
    if (!closed) {
      closed = true;
      grpc::Status s = rw->Finish();
      broken = s.ok() ? absl::AbortedError("session: the server ended the stream")
                      : FromGrpcStatus(s);
    }
    return broken;
  }

  // Sends one request and reads its answers: the chunks of `rows`-row states, then one answer
  // (`answer` gets it). A `refused` answer is returned as its status.
  absl::Status Call(const v1::SessionRequest& request, v1::SessionResponse* answer,
                    std::vector<ReceivedState>* states) {
    if (!broken.ok()) return broken;
    if (!rw->Write(request)) return End();
    struct Pending {
      ReceivedState state;
      StateAssembler assembler;
    };
    std::map<std::tuple<int, int32_t>, Pending> pending;
    std::vector<std::tuple<int, int32_t>> order;
    v1::SessionResponse r;
    while (true) {
      if (!rw->Read(&r)) return End();
      if (r.message_case() != v1::SessionResponse::kChunk) break;
      const v1::HiddenStateChunk& c = r.chunk();
      const std::tuple<int, int32_t> key{static_cast<int>(c.state().tap()),
                                         c.state().layer_id()};
      auto it = pending.find(key);
      if (it == pending.end()) {
        absl::StatusOr<ReceivedState> s = ReceivedStateFromChunk(c);
        if (!s.ok() || s->hidden != hidden_size) {
          broken = StreamError(s.ok() ? absl::StrCat(s->TensorName(), ": hidden_size ", s->hidden,
                                                     " differs from the contract's ", hidden_size)
                                      : std::string(s.status().message()));
          return broken;
        }
        Pending p{*s, StateAssembler(c.sequence_length(), c.hidden_size(), s->dtype)};
        it = pending.emplace(key, std::move(p)).first;
        order.push_back(key);
      }
      absl::StatusOr<DType> dtype = WireDTypeFromProto(c.dtype());
      absl::Status added =
          dtype.ok() ? it->second.assembler.Add(c.token_start(), c.token_count(), c.hidden_size(),
                                                *dtype, AsBytes(c.data()), c.crc32c())
                     : dtype.status();
      if (!added.ok()) {
        broken = StreamError(absl::StrCat(it->second.state.TensorName(), ": ", added.message()));
        return broken;
      }
    }
    if (r.message_case() == v1::SessionResponse::kRefused) {
      if (!pending.empty()) {
        broken = StreamError("states sent before a refusal");
        return broken;
      }
      return absl::Status(static_cast<absl::StatusCode>(r.refused().code()), r.refused().message());
    }
    *answer = std::move(r);
    const uint32_t rows = answer->has_opened()     ? answer->opened().state_rows()
                          : answer->has_verified() ? answer->verified().state_rows()
                                                   : 0;
    for (const auto& key : order) {
      Pending& p = pending.at(key);
      if (!p.assembler.complete() || p.assembler.rows() != rows) {
        broken = StreamError(absl::StrCat(p.state.TensorName(), ": ", p.assembler.rows(),
                                          " rows, partly sent or not the answer's ", rows));
        return broken;
      }
      p.state.bytes = p.assembler.Release();
      states->push_back(std::move(p.state));
    }
    return absl::OkStatus();
  }
};

ExtractorSession::ExtractorSession(std::unique_ptr<Stream> stream) : stream_(std::move(stream)) {}

ExtractorSession::~ExtractorSession() {
  if (stream_ && !stream_->closed) (void)Close();
}

absl::Status ExtractorSession::Close() {
  if (stream_->closed) return stream_->broken.ok() ? absl::OkStatus() : stream_->broken;
  stream_->rw->WritesDone();
  v1::SessionResponse r;
  while (stream_->rw->Read(&r)) {
  }
  stream_->closed = true;
  const absl::Status s = FromGrpcStatus(stream_->rw->Finish());
  stream_->broken = s.ok() ? absl::FailedPreconditionError("session: closed") : s;
  return s;
}

absl::StatusOr<SessionVerifyReply> ExtractorSession::Verify(const SessionVerifyParams& params) {
  v1::SessionRequest req;
  v1::SessionVerify* v = req.mutable_verify();
  TokenIdsToProto(params.draft_tokens, v->mutable_draft_tokens());
  v->set_rule(DraftRuleToProto(params.rule));
  if (!params.draft_probs.empty()) {
    v->set_draft_probs(params.draft_probs.data(), params.draft_probs.size() * sizeof(float));
  }
  v->mutable_parents()->Add(params.parents.begin(), params.parents.end());
  v->set_commit_accepted(params.commit_accepted);
  v1::SessionResponse answer;
  SessionVerifyReply out;
  SW_RETURN_IF_ERROR(stream_->Call(req, &answer, &out.states));
  if (!answer.has_verified()) return StreamError("verify answered with another message");
  const v1::SessionVerified& a = answer.verified();
  out.position = a.position();
  out.accepted = static_cast<int32_t>(a.accepted());
  out.accepted_tokens = TokenIdsFromProto(a.accepted_tokens());
  out.path.assign(a.path().begin(), a.path().end());
  out.next_token = a.next_token();
  out.target_argmax = TokenIdsFromProto(a.target_argmax());
  out.rule = a.rule();
  if (a.has_committed()) {
    out.committed = SessionCommittedFromProto(a.committed());
  }
  return out;
}

absl::StatusOr<SessionCommitted> ExtractorSession::Commit(int64_t accepted) {
  if (accepted < 0) {
    return absl::InvalidArgumentError(absl::StrCat("commit.accepted = ", accepted, " is negative"));
  }
  v1::SessionRequest req;
  req.mutable_commit()->set_accepted(static_cast<uint32_t>(accepted));
  v1::SessionResponse answer;
  std::vector<ReceivedState> none;
  SW_RETURN_IF_ERROR(stream_->Call(req, &answer, &none));
  if (!answer.has_committed()) return StreamError("commit answered with another message");
  return SessionCommittedFromProto(answer.committed());
}

absl::StatusOr<std::unique_ptr<ExtractorSession>> ExtractorClient::OpenSession(
    const SessionOpenParams& params) {
  SW_ASSIGN_OR_RETURN(const ExtractionContract contract, Info());
  auto stream = std::make_unique<ExtractorSession::Stream>();
  stream->hidden_size = contract.hidden_size;
  ExtractorClientOptions o = options_;
  if (params.timeout_seconds > 0) o.timeout_seconds = params.timeout_seconds;
  SetDeadline(o, &stream->ctx);
  stream->rw = rpc_->stub->Session(&stream->ctx);
  v1::SessionRequest req;
  v1::SessionOpen* open = req.mutable_open();
  SequenceInputToProto(params.prompt, open->mutable_prompt());
  open->set_add_special_tokens(params.add_special_tokens);
  LayerSelectionToProto(params.states, open->mutable_layers());
  open->set_dtype(WireDTypeToProto(params.dtype));
  open->set_max_new_tokens(params.max_new_tokens);
  open->set_max_draft_tokens(params.max_draft_tokens);
  open->mutable_sampling()->set_temperature(params.temperature);
  open->mutable_sampling()->set_top_p(params.top_p);
  open->mutable_sampling()->set_top_k(params.top_k);
  open->mutable_sampling()->set_seed(params.seed);
  open->set_request_id(params.request_id);
  open->set_max_chunk_bytes(params.max_chunk_bytes);
  v1::SessionResponse answer;
  std::unique_ptr<ExtractorSession> session(new ExtractorSession(std::move(stream)));
  SW_RETURN_IF_ERROR(session->stream_->Call(req, &answer, &session->opened_.states));
  if (!answer.has_opened()) return StreamError("open answered with another message");
  const v1::SessionOpened& a = answer.opened();
  SessionOpenReply& r = session->opened_;
  r.session_id = a.session_id();
  r.prompt_token_ids = TokenIdsFromProto(a.prompt_token_ids());
  r.next_token = a.next_token();
  r.capacity = a.capacity();
  r.max_draft_tokens = a.max_draft_tokens();
  r.eos_token_ids = TokenIdsFromProto(a.eos_token_ids());
  return session;
}

}  // namespace specwire
