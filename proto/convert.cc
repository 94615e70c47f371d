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

struct RuleRow {
  DraftRule rule;
  v1::VerifyRule wire;
};
constexpr RuleRow kRules[] = {
    {DraftRule::kArgmaxDraft, v1::RULE_ARGMAX_DRAFT},
    {DraftRule::kDraftDistribution, v1::RULE_DRAFT_DISTRIBUTION},
};


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
    for (const std::string& n : s.names) p->add_names(n);
    p->set_digest(s.digest);
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
  out->set_config_json(c.config_json);
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
  for (const auto& s : p.skipped()) {
    c.skipped.push_back({s.prefix(), s.count(), s.reason(),
                         std::vector<std::string>(s.names().begin(), s.names().end()),
                         s.digest()});
  }
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
  c.config_json = p.config_json();
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

void LayerSelectionToProto(const StateSelection& s, v1::LayerSelection* out) {
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

v1::VerifyRule DraftRuleToProto(DraftRule r) {
  for (const RuleRow& row : kRules) {
    if (row.rule == r) return row.wire;
  }
  return v1::RULE_ARGMAX_DRAFT;
}

absl::StatusOr<DraftRule> DraftRuleFromProto(v1::VerifyRule r) {
  for (const RuleRow& row : kRules) {
    if (row.wire == r) return row.rule;
  }
  return absl::InvalidArgumentError(absl::StrCat(static_cast<int>(r), " is not a rule"));
}

void SessionCommittedToProto(const SessionCommitted& c, v1::SessionCommitted* out) {
  out->set_tokens(static_cast<uint32_t>(c.tokens));
  out->set_next_token(static_cast<int32_t>(c.next_token));
  out->set_rollback_tokens(static_cast<uint32_t>(c.rollback_tokens));
}

SessionCommitted SessionCommittedFromProto(const v1::SessionCommitted& p) {
  return {p.tokens(), p.next_token(), p.rollback_tokens()};
}

}  // namespace specwire
