#include "services/extractor/server.h"

#include <chrono>
#include <deque>
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/stream_reactor.h"
#include "common/tokenizer.h"
#include "common/wire.h"

namespace specwire {
namespace {

v1::Tap ToProtoTap(StateTap t) {
  switch (t) {
    case StateTap::kEmbedding:
      return v1::TAP_EMBEDDING;
    case StateTap::kFinalNorm:
      return v1::TAP_FINAL_NORM;
    case StateTap::kLayerOutput:
      return v1::TAP_LAYER_OUTPUT;
  }
  return v1::TAP_LAYER_OUTPUT;
}

// Emits, lazily, the SequenceInfo and HiddenStateChunk messages of a list of host states: one
// SequenceInfo before the first state of each sequence, then the state's chunks in row order.
// Holds the states (and so the engine's buffers) until the stream has written them.
class ChunkProducer {
 public:
  ChunkProducer(std::vector<HostState> states, std::vector<std::vector<int64_t>> token_ids,
                int64_t max_chunk_bytes, ExtractorMetrics* metrics)
      : states_(std::move(states)),
        token_ids_(std::move(token_ids)),
        max_chunk_bytes_(max_chunk_bytes),
        metrics_(metrics) {}

  // Fills the next message into `info` or `chunk` (exactly one); false when exhausted.
  bool Next(v1::SequenceInfo* info, v1::HiddenStateChunk* chunk, bool* is_info) {
    while (state_ < states_.size()) {
      const HostState& s = states_[state_];
      if (static_cast<int64_t>(s.sequence_index) != last_sequence_) {
        last_sequence_ = s.sequence_index;
        info->set_sequence_index(s.sequence_index);
        for (int64_t id : token_ids_[s.sequence_index])
          info->add_token_ids(static_cast<int32_t>(id));
        *is_info = true;
        return true;
      }
      if (chunk_ == 0) {
        plan_ = PlanChunks(s.bytes, s.rows, s.hidden * static_cast<int64_t>(DTypeSize(s.dtype)),
                           max_chunk_bytes_);
      }
      if (chunk_ < plan_.size()) {
        const ChunkSpan& c = plan_[chunk_++];
        chunk->set_sequence_index(s.sequence_index);
        chunk->mutable_state()->set_tap(ToProtoTap(s.tap));
        chunk->mutable_state()->set_layer_id(s.tap == StateTap::kLayerOutput ? s.layer_id : 0);
        chunk->set_hf_hidden_states_index(s.hf_index);
        chunk->set_token_start(static_cast<uint32_t>(c.row_start));
        chunk->set_token_count(static_cast<uint32_t>(c.row_count));
        chunk->set_sequence_length(static_cast<uint32_t>(s.rows));
        chunk->set_hidden_size(static_cast<uint32_t>(s.hidden));
        chunk->set_dtype(WireDTypeToProto(s.dtype));
        chunk->set_data(reinterpret_cast<const char*>(c.bytes.data()), c.bytes.size());
        chunk->set_crc32c(Crc32c(c.bytes));
        ++chunks_;
        bytes_ += static_cast<int64_t>(c.bytes.size());
        metrics_->BytesStreamed(static_cast<int64_t>(c.bytes.size()));
        *is_info = false;
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
  size_t state_ = 0;
  size_t chunk_ = 0;
  std::vector<ChunkSpan> plan_;
  int64_t last_sequence_ = -1;
  int64_t chunks_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace

ExtractorService::ExtractorService(ExtractorBackend* backend, Scheduler* scheduler,
                                   const Tokenizer* tokenizer, ExtractorMetrics* metrics,
                                   ExtractorLimits limits)
    : backend_(backend),
      scheduler_(scheduler),
      tokenizer_(tokenizer),
      metrics_(metrics),
      limits_(limits) {}

std::function<void(const std::string&, double)> ExtractorService::DoneHook(const char* method) {
  return [this, method](const std::string& code, double seconds) {
    metrics_->RequestDone(method, code, seconds);
  };
}

// The slot is given back when the final status is handed to gRPC, not at OnDone: the client may
// already hold that status and open its next stream before OnDone runs.
std::function<void()> ExtractorService::SlotRelease(bool holds_slot) {
  if (!holds_slot) return nullptr;
  return [this] { CloseStream(); };
}

bool ExtractorService::TryOpenStream() {
  if (active_streams_.fetch_add(1) >= limits_.max_concurrent_streams) {
    active_streams_.fetch_sub(1);
    return false;
  }
  metrics_->StreamOpened();
  return true;
}

void ExtractorService::CloseStream() {
  active_streams_.fetch_sub(1);
  metrics_->StreamClosed();
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
  StateSelection sel;
  const int64_t L = backend_->num_layers();
  for (int i = 0; i < s.layer_ids_size(); ++i) {
    const int64_t id = s.layer_ids(i);
    if (id < 0 || id >= L) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers.layer_ids[", i, "] = ", id, " is outside [0, ", L,
          "): layer k is the output of decoder layer k (HF hidden_states[k+1]); use final_norm "
          "for HF hidden_states[",
          L, "] and embedding for hidden_states[0]"));
    }
    if (std::find(sel.layer_ids.begin(), sel.layer_ids.end(), id) == sel.layer_ids.end()) {
      sel.layer_ids.push_back(id);
    }
  }
  sel.embedding = s.embedding();
  sel.final_norm = s.final_norm();
  return sel;
}

absl::StatusOr<DType> ExtractorService::ResolveDType(v1::WireDType d, const char* field) const {
  switch (d) {
    case v1::WIRE_DTYPE_UNSPECIFIED:
    case v1::WIRE_DTYPE_BF16:
      return DType::kBF16;
    case v1::WIRE_DTYPE_F32:
      return DType::kF32;
    default:
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", static_cast<int>(d),
                                                     " is not a hidden-state dtype (BF16 or F32)"));
  }
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
                                                   " (--max_new_tokens)"));
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

grpc::ServerWriteReactor<v1::ExtractResponse>* ExtractorService::Extract(
    grpc::CallbackServerContext* ctx, const v1::ExtractRequest* request) {
  const bool slot = TryOpenStream();
  auto* r = new StreamReactor<v1::ExtractResponse>(SteadyDeadline(ctx), DoneHook("Extract"),
                                                   SlotRelease(slot));
  if (!slot) {
    r->Fail(absl::ResourceExhaustedError(absl::StrCat("too many concurrent streams (",
                                                      limits_.max_concurrent_streams,
                                                      ", --max_concurrent_streams); retry later")));
    return r;
  }
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kExtract;
  absl::StatusOr<ExtractWork> valid = ValidateExtract(*request);
  if (!valid.ok()) {
    r->Fail(valid.status());
    return r;
  }
  job->extract = *std::move(valid);
  const int64_t chunk_bytes = ResolveChunkBytes(request->max_chunk_bytes()).value();
  v1::ExtractionContract contract;
  ContractToProto(backend_->contract(), &contract);
  r->Pause();
  v1::ExtractResponse first;
  *first.mutable_contract() = std::move(contract);
  r->SendMessage(std::move(first));

  job->deadline = SteadyDeadline(ctx);
  const std::string request_id = request->request_id();
  int64_t tokens = 0;
  for (const auto& s : job->extract.sequences) tokens += static_cast<int64_t>(s.size());
  ExtractorMetrics* metrics = metrics_;
  std::vector<std::vector<int64_t>> token_ids = job->extract.sequences;
  job->on_extract_done = [r, metrics, request_id, tokens, chunk_bytes,
                          token_ids = std::move(token_ids)](absl::StatusOr<ExtractOutput> out,
                                                            const Job::Timing& timing) mutable {
    metrics->QueueWait(timing.queue_seconds);
    if (!out.ok()) {
      r->Fail(out.status());
      r->ReleaseWork();
      return;
    }
    metrics->Tokens("Extract", tokens);
    const uint32_t n_seq = static_cast<uint32_t>(token_ids.size());
    auto producer = std::make_shared<ChunkProducer>(std::move(out->states), std::move(token_ids),
                                                    chunk_bytes, metrics);
    r->Send([producer](v1::ExtractResponse* m) {
      v1::SequenceInfo info;
      v1::HiddenStateChunk chunk;
      bool is_info = false;
      if (!producer->Next(&info, &chunk, &is_info)) return false;
      if (is_info) {
        *m->mutable_sequence() = std::move(info);
      } else {
        *m->mutable_chunk() = std::move(chunk);  // a swap: the payload is not copied again
      }
      return true;
    });
    r->Send([producer, request_id, n_seq, tokens, timing,
             sent = false](v1::ExtractResponse* m) mutable {
      if (sent) return false;
      auto* t = m->mutable_trailer();
      t->set_request_id(request_id);
      t->set_sequences(n_seq);
      t->set_tokens(static_cast<uint64_t>(tokens));
      t->set_chunks(static_cast<uint64_t>(producer->chunks()));
      t->set_bytes(static_cast<uint64_t>(producer->bytes()));
      t->set_queue_seconds(timing.queue_seconds);
      t->set_compute_seconds(timing.compute_seconds);
      return sent = true;
    });
    r->Complete();
    r->ReleaseWork();
  };
  Scheduler* scheduler = scheduler_;
  r->AttachWork([job, scheduler](bool deadline) {
    job->cancelled = true;
    // A queued job leaves the queue now (its callback fails the stream); a running one stops at
    // its next check.
    scheduler->Remove(job, deadline ? absl::DeadlineExceededError("deadline exceeded")
                                    : absl::CancelledError("request cancelled"));
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

grpc::ServerWriteReactor<v1::GenerateResponse>* ExtractorService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  const bool slot = TryOpenStream();
  auto* r = new StreamReactor<v1::GenerateResponse>(SteadyDeadline(ctx), DoneHook("Generate"),
                                                    SlotRelease(slot));
  if (!slot) {
    r->Fail(absl::ResourceExhaustedError(absl::StrCat("too many concurrent streams (",
                                                      limits_.max_concurrent_streams,
                                                      ", --max_concurrent_streams); retry later")));
    return r;
  }
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kGenerate;
  absl::StatusOr<GenerateWork> valid = ValidateGenerate(*request);
  if (!valid.ok()) {
    r->Fail(valid.status());
    return r;
  }
  job->generate = *std::move(valid);
  const int64_t chunk_bytes = ResolveChunkBytes(request->max_chunk_bytes()).value();
  v1::ExtractionContract contract;
  ContractToProto(backend_->contract(), &contract);
  r->Pause();
  v1::GenerateResponse first;
  *first.mutable_contract() = std::move(contract);
  r->SendMessage(std::move(first));
  job->deadline = SteadyDeadline(ctx);
  const std::string request_id = request->request_id();
  ExtractorMetrics* metrics = metrics_;
  std::vector<std::vector<int64_t>> prompts = job->generate.prompts;
  job->on_generate_done = [r, metrics, request_id, chunk_bytes, prompts = std::move(prompts)](
                              absl::StatusOr<GenerateOutput> out, const Job::Timing& timing) {
    metrics->QueueWait(timing.queue_seconds);
    if (!out.ok()) {
      r->Fail(out.status());
      r->ReleaseWork();
      return;
    }
    int64_t tokens = 0;
    std::vector<std::vector<int64_t>> full;
    auto completions = std::make_shared<std::vector<v1::Completion>>();
    for (size_t i = 0; i < out->completions.size(); ++i) {
      v1::Completion c;
      c.set_sequence_index(static_cast<uint32_t>(i));
      for (int64_t t : prompts[i]) c.add_prompt_token_ids(static_cast<int32_t>(t));
      for (int64_t t : out->completions[i].tokens)
        c.add_completion_token_ids(static_cast<int32_t>(t));
      c.set_finish_reason(out->completions[i].finish_reason);
      completions->push_back(std::move(c));
      std::vector<int64_t> seq = prompts[i];
      seq.insert(seq.end(), out->completions[i].tokens.begin(), out->completions[i].tokens.end());
      tokens += static_cast<int64_t>(seq.size());
      full.push_back(std::move(seq));
    }
    metrics->Tokens("Generate", tokens);
    r->Send([completions, i = size_t{0}](v1::GenerateResponse* m) mutable {
      if (i >= completions->size()) return false;
      *m->mutable_completion() = std::move((*completions)[i++]);
      return true;
    });
    const uint32_t n_seq = static_cast<uint32_t>(full.size());
    auto producer = std::make_shared<ChunkProducer>(std::move(out->states), std::move(full),
                                                    chunk_bytes, metrics);
    r->Send([producer](v1::GenerateResponse* m) {
      // Generate streams carry completions instead of SequenceInfo: skip those.
      v1::SequenceInfo info;
      v1::HiddenStateChunk chunk;
      bool is_info = true;
      while (is_info) {
        info.Clear();
        if (!producer->Next(&info, &chunk, &is_info)) return false;
      }
      *m->mutable_chunk() = std::move(chunk);
      return true;
    });
    r->Send([producer, request_id, n_seq, tokens, timing,
             sent = false](v1::GenerateResponse* m) mutable {
      if (sent) return false;
      auto* t = m->mutable_trailer();
      t->set_request_id(request_id);
      t->set_sequences(n_seq);
      t->set_tokens(static_cast<uint64_t>(tokens));
      t->set_chunks(static_cast<uint64_t>(producer->chunks()));
      t->set_bytes(static_cast<uint64_t>(producer->bytes()));
      t->set_queue_seconds(timing.queue_seconds);
      t->set_compute_seconds(timing.compute_seconds);
      return sent = true;
    });
    r->Complete();
    r->ReleaseWork();
  };
  Scheduler* scheduler = scheduler_;
  r->AttachWork([job, scheduler](bool deadline) {
    job->cancelled = true;
    // A queued job leaves the queue now (its callback fails the stream); a running one stops at
    // its next check.
    scheduler->Remove(job, deadline ? absl::DeadlineExceededError("deadline exceeded")
                                    : absl::CancelledError("request cancelled"));
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

grpc::ServerUnaryReactor* ExtractorService::Tokenize(grpc::CallbackServerContext* ctx,
                                                     const v1::TokenizeRequest* request,
                                                     v1::TokenizeResponse* response) {
  auto* r = ctx->DefaultReactor();
  absl::Status status = [&]() -> absl::Status {
    if (tokenizer_ == nullptr) {
      return absl::FailedPreconditionError("this extractor has no tokenizer (no tokenizer.json)");
    }
    std::lock_guard<std::mutex> lock(tokenizer_mu_);
    for (int i = 0; i < request->texts_size(); ++i) {
      auto ids = tokenizer_->Encode(request->texts(i), request->add_special_tokens());
      if (!ids.ok()) return Annotate(ids.status(), absl::StrCat("texts[", i, "]"));
      auto* out = response->add_sequences();
      for (int64_t id : *ids) out->add_ids(static_cast<int32_t>(id));
    }
    response->set_tokenizer_digest(backend_->contract().tokenizer_digest);
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
      std::vector<int64_t> ids(request->sequences(i).ids().begin(),
                               request->sequences(i).ids().end());
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
  const bool slot = TryOpenStream();
  auto* r = new StreamReactor<v1::TensorChunk>(SteadyDeadline(ctx), DoneHook("GetTensors"),
                                               SlotRelease(slot));
  if (!slot) {
    r->Fail(absl::ResourceExhaustedError("too many concurrent streams; retry later"));
    return r;
  }
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
        m->set_name(t.name);
        for (int64_t d : t.shape) m->add_shape(d);
        m->set_dtype(WireDTypeToProto(t.dtype));
        m->set_offset(offset);
        m->set_total_bytes(t.bytes.size());
        m->set_data(reinterpret_cast<const char*>(piece.data()), piece.size());
        m->set_crc32c(Crc32c(piece));
        m->set_digest(t.digest);
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
