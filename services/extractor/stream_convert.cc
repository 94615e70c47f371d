#include "services/extractor/stream_convert.h"

namespace specwire {

void CompletionToProto(uint32_t sequence_index, std::span<const int64_t> prompt,
                       const CompletionOutput& c, v1::Completion* out) {
  out->set_sequence_index(sequence_index);
  TokenIdsToProto(prompt, out->mutable_prompt_token_ids());
  TokenIdsToProto(c.tokens, out->mutable_completion_token_ids());
  out->set_finish_reason(c.finish_reason);
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

}  // namespace specwire
