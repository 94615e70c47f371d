#include "proto/convert.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specwire {
namespace {

// One row per wire enum value; both directions of a conversion read the same table.
struct WireDTypeRow {
  DType dtype;
  v1::WireDType wire;
};
constexpr WireDTypeRow kWireDTypes[] = {
    {DType::kBF16, v1::WIRE_DTYPE_BF16},
    {DType::kF32, v1::WIRE_DTYPE_F32},
    {DType::kF16, v1::WIRE_DTYPE_F16},
};

struct TapRow {
  StateTap tap;
  v1::Tap wire;
};
constexpr TapRow kTaps[] = {
    {StateTap::kLayerOutput, v1::TAP_LAYER_OUTPUT},
    {StateTap::kEmbedding, v1::TAP_EMBEDDING},
    {StateTap::kFinalNorm, v1::TAP_FINAL_NORM},
};

// ReceivedState::state: "layer.{k}" | "embedding" | "final_norm" (specwire-extract's names).
std::string StateName(StateTap tap, int32_t layer_id) {
  switch (tap) {
    case StateTap::kLayerOutput:
      return absl::StrCat("layer.", layer_id);
    case StateTap::kEmbedding:
      return "embedding";
    case StateTap::kFinalNorm:
      return "final_norm";
  }
  return "";
}

}  // namespace

void ContractToProto(const ExtractionContract& c, v1::ExtractionContract* out) {
  out->set_architecture(c.architecture);
  out->set_model_type(c.model_type);
  out->set_source_layout(c.source_layout);
  out->set_source_architecture(c.source_architecture);
  out->set_weight_prefix(c.weight_prefix);
  out->set_tensors_loaded(c.tensors_loaded);
  out->set_tensors_skipped(c.tensors_skipped);
  for (const auto& s : c.skipped) {
    auto* p = out->add_skipped();
    p->set_prefix(s.prefix);
    p->set_count(s.count);
    p->set_reason(s.reason);
  }
  out->set_num_layers(static_cast<int32_t>(c.num_layers));
  out->set_hidden_size(static_cast<int32_t>(c.hidden_size));
  out->set_vocab_size(static_cast<int32_t>(c.vocab_size));
  for (const auto& t : c.layer_types) out->add_layer_types(t);
  out->set_compute_dtype(c.compute_dtype);
  for (const auto& d : c.devices) out->add_devices(d);
  out->set_kernel_variant(c.kernel_variant);
  out->set_weights_digest(c.weights_digest);
  out->set_tokenizer_digest(c.tokenizer_digest);
  out->set_chat_template_digest(c.chat_template_digest);
  out->set_specwire_version(c.specwire_version);
  auto* canary = out->mutable_canary();
  for (int64_t id : c.canary.token_ids) canary->add_token_ids(static_cast<int32_t>(id));
  canary->set_compute_dtype(c.canary.compute_dtype);
  for (const TapFingerprint& t : c.canary.taps) {
    auto* tap = canary->add_taps();
    tap->set_tap(t.tap);
    tap->set_mean(t.mean);
    tap->set_std(t.std);
    tap->set_rms(t.rms);
    for (double v : t.sketch) tap->add_sketch(v);
  }
}

ExtractionContract ContractFromProto(const v1::ExtractionContract& p) {
  ExtractionContract c;
  c.architecture = p.architecture();
  c.model_type = p.model_type();
  c.source_layout = p.source_layout();
  c.source_architecture = p.source_architecture();
  c.weight_prefix = p.weight_prefix();
  c.tensors_loaded = p.tensors_loaded();
  c.tensors_skipped = p.tensors_skipped();
  for (const auto& s : p.skipped()) c.skipped.push_back({s.prefix(), s.count(), s.reason()});
  c.num_layers = p.num_layers();
  c.hidden_size = p.hidden_size();
  c.vocab_size = p.vocab_size();
  c.layer_types.assign(p.layer_types().begin(), p.layer_types().end());
  c.compute_dtype = p.compute_dtype();
  c.devices.assign(p.devices().begin(), p.devices().end());
  c.kernel_variant = p.kernel_variant();
  c.weights_digest = p.weights_digest();
  c.tokenizer_digest = p.tokenizer_digest();
  c.chat_template_digest = p.chat_template_digest();
  c.specwire_version = p.specwire_version();
  c.canary.token_ids.assign(p.canary().token_ids().begin(), p.canary().token_ids().end());
  c.canary.compute_dtype = p.canary().compute_dtype();
  for (const auto& t : p.canary().taps()) {
    c.canary.taps.push_back(
        {t.tap(), t.mean(), t.std(), t.rms(), std::vector<double>(t.sketch().begin(), t.sketch().end())});
  }
  return c;
}

v1::WireDType WireDTypeToProto(DType d) {
  for (const WireDTypeRow& row : kWireDTypes) {
    if (row.dtype == d) return row.wire;
  }
  return v1::WIRE_DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> WireDTypeFromProto(v1::WireDType d) {
  if (d == v1::WIRE_DTYPE_UNSPECIFIED) return DType::kBF16;
  for (const WireDTypeRow& row : kWireDTypes) {
    if (row.wire == d) return row.dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(d)));
}

void TokenIdsToProto(std::span<const int64_t> ids, google::protobuf::RepeatedField<int32_t>* out) {
  out->Reserve(out->size() + static_cast<int>(ids.size()));
  for (int64_t id : ids) out->Add(static_cast<int32_t>(id));
}

std::vector<int64_t> TokenIdsFromProto(const google::protobuf::RepeatedField<int32_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

void SequenceInputToProto(const InputSequence& in, v1::SequenceInput* out) {
  if (in.is_text) {
    out->set_text(in.text);
  } else {
    TokenIdsToProto(in.token_ids, out->mutable_tokens()->mutable_ids());
  }
}

void LayerSelectionToProto(const RequestedStates& s, v1::LayerSelection* out) {
  for (int32_t id : s.layer_ids) out->add_layer_ids(id);
  out->set_embedding(s.embedding);
  out->set_final_norm(s.final_norm);
}

StateSelection StateSelectionFromProto(const v1::LayerSelection& s) {
  StateSelection sel;
  sel.layer_ids.assign(s.layer_ids().begin(), s.layer_ids().end());
  sel.embedding = s.embedding();
  sel.final_norm = s.final_norm();
  return sel;
}

void ExtractRequestToProto(const ExtractParams& p, v1::ExtractRequest* out) {
  for (const auto& in : p.sequences) SequenceInputToProto(in, out->add_sequences());
  LayerSelectionToProto(p.states, out->mutable_layers());
  out->set_dtype(WireDTypeToProto(p.dtype));
  out->set_max_chunk_bytes(p.max_chunk_bytes);
  out->set_request_id(p.request_id);
  out->set_add_special_tokens(p.add_special_tokens);
}

void GenerateRequestToProto(const GenerateParams& p, v1::GenerateRequest* out) {
  for (const auto& in : p.prompts) SequenceInputToProto(in, out->add_prompts());
  out->set_max_new_tokens(p.max_new_tokens);
  TokenIdsToProto(p.stop_token_ids, out->mutable_stop_token_ids());
  out->set_ignore_model_eos(p.ignore_model_eos);
  LayerSelectionToProto(p.states, out->mutable_layers());
  out->set_dtype(WireDTypeToProto(p.dtype));
  out->set_max_chunk_bytes(p.max_chunk_bytes);
  out->set_request_id(p.request_id);
  out->set_add_special_tokens(p.add_special_tokens);
}

v1::Tap TapToProto(StateTap t) {
  for (const TapRow& row : kTaps) {
    if (row.tap == t) return row.wire;
  }
  return v1::TAP_LAYER_OUTPUT;
}

absl::StatusOr<StateTap> TapFromProto(v1::Tap t) {
  for (const TapRow& row : kTaps) {
    if (row.wire == t) return row.tap;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown tap ", static_cast<int>(t)));
}

void SequenceInfoToProto(uint32_t sequence_index, std::span<const int64_t> token_ids,
                         v1::SequenceInfo* out) {
  out->set_sequence_index(sequence_index);
  TokenIdsToProto(token_ids, out->mutable_token_ids());
}

void CompletionToProto(uint32_t sequence_index, std::span<const int64_t> prompt,
                       const CompletionOutput& c, v1::Completion* out) {
  out->set_sequence_index(sequence_index);
  TokenIdsToProto(prompt, out->mutable_prompt_token_ids());
  TokenIdsToProto(c.tokens, out->mutable_completion_token_ids());
  out->set_finish_reason(c.finish_reason);
}

ReceivedCompletion CompletionFromProto(const v1::Completion& p) {
  return {p.sequence_index(), TokenIdsFromProto(p.prompt_token_ids()),
          TokenIdsFromProto(p.completion_token_ids()), p.finish_reason()};
}

void HiddenStateChunkHeaderToProto(const HostState& s, const ChunkSpan& c,
                                   v1::HiddenStateChunk* out) {
  out->set_sequence_index(s.sequence_index);
  out->mutable_state()->set_tap(TapToProto(s.tap));
  out->mutable_state()->set_layer_id(s.tap == StateTap::kLayerOutput ? s.layer_id : 0);
  out->set_hf_hidden_states_index(s.hf_index);
  out->set_token_start(static_cast<uint32_t>(c.row_start));
  out->set_token_count(static_cast<uint32_t>(c.row_count));
  out->set_sequence_length(static_cast<uint32_t>(s.rows));
  out->set_hidden_size(static_cast<uint32_t>(s.hidden));
  out->set_dtype(WireDTypeToProto(s.dtype));
  out->set_crc32c(Crc32c(c.bytes));
}

absl::StatusOr<ReceivedState> ReceivedStateFromChunk(const v1::HiddenStateChunk& c) {
  ReceivedState s;
  s.sequence_index = c.sequence_index();
  absl::StatusOr<StateTap> tap = TapFromProto(c.state().tap());
  if (!tap.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk with unknown tap ", static_cast<int>(c.state().tap())));
  }
  if (*tap == StateTap::kLayerOutput) s.layer_id = c.state().layer_id();
  s.state = StateName(*tap, s.layer_id);
  s.hf_hidden_states_index = c.hf_hidden_states_index();
  s.rows = c.sequence_length();
  s.hidden = c.hidden_size();
  SW_ASSIGN_OR_RETURN(s.dtype, WireDTypeFromProto(c.dtype()));
  return s;
}

void StreamTotalsToProto(const StreamTotals& t, v1::StreamTrailer* out) {
  out->set_request_id(t.request_id);
  out->set_sequences(t.sequences);
  out->set_tokens(t.tokens);
  out->set_chunks(t.chunks);
  out->set_bytes(t.bytes);
  out->set_queue_seconds(t.queue_seconds);
  out->set_compute_seconds(t.compute_seconds);
}

StreamTotals StreamTotalsFromProto(const v1::StreamTrailer& p) {
  return {p.request_id(), p.sequences(),     p.tokens(),         p.chunks(),
          p.bytes(),      p.queue_seconds(), p.compute_seconds()};
}

void TensorChunkToProto(const TensorBytes& t, uint64_t offset, std::span<const std::byte> piece,
                        v1::TensorChunk* out) {
  out->set_name(t.name);
  for (int64_t d : t.shape) out->add_shape(d);
  out->set_dtype(WireDTypeToProto(t.dtype));
  out->set_offset(offset);
  out->set_total_bytes(t.bytes.size());
  out->set_data(reinterpret_cast<const char*>(piece.data()), piece.size());
  out->set_crc32c(Crc32c(piece));
  out->set_digest(t.digest);
}

absl::StatusOr<ReceivedTensor> ReceivedTensorFromChunk(const v1::TensorChunk& c) {
  ReceivedTensor t;
  t.name = c.name();
  t.shape.assign(c.shape().begin(), c.shape().end());
  SW_ASSIGN_OR_RETURN(t.dtype, WireDTypeFromProto(c.dtype()));
  t.digest = c.digest();
  return t;
}

}  // namespace specwire
