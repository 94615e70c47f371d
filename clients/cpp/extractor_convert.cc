#include "clients/cpp/extractor_convert.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specwire {
namespace {

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

ReceivedCompletion CompletionFromProto(const v1::Completion& p) {
  return {p.sequence_index(), TokenIdsFromProto(p.prompt_token_ids()),
          TokenIdsFromProto(p.completion_token_ids()), p.finish_reason()};
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

absl::StatusOr<ReceivedTensor> ReceivedTensorFromChunk(const v1::TensorChunk& c) {
  ReceivedTensor t;
  t.name = c.name();
  t.shape.assign(c.shape().begin(), c.shape().end());
  SW_ASSIGN_OR_RETURN(t.dtype, WireDTypeFromProto(c.dtype()));
  t.digest = c.digest();
  return t;
}

}  // namespace specwire
