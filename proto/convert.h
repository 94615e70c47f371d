// Conversions between specwire's plain types and the wire messages that the extractor service,
// its C++ client and the scorer all exchange. Every proto <-> plain-struct copy of the extractor
// API lives here, each wire enum in one table read both ways, so the two ends of a stream cannot
// drift. Validation against limits or a loaded model is not conversion: it stays with the service
// (services/extractor/server.cc) and the client's stream checks (clients/cpp/extractor_client.cc).
//
// The plain types come from protobuf-free headers: common/ (contract, dtype, chunk spans), the
// extractor's work types (services/extractor/work.h) and the client's reply types
// (clients/cpp/extractor_client.h). This header itself is rpc-only: it includes a .pb.h, so a
// translation unit that includes torch must never include it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/cpp/extractor_client.h"
#include "common/contract.h"
#include "common/safetensors.h"
#include "common/wire.h"
#include "proto/specwire/v1/extractor.pb.h"
#include "services/extractor/work.h"

namespace specwire {

// The extraction contract.
void ContractToProto(const ExtractionContract& c, v1::ExtractionContract* out);
ExtractionContract ContractFromProto(const v1::ExtractionContract& p);

// The wire dtype enum (flag strings are parsed elsewhere).
v1::WireDType WireDTypeToProto(DType d);
// WIRE_DTYPE_UNSPECIFIED means BF16. INVALID_ARGUMENT "unknown dtype N" for a value outside the
// enum; which dtypes a field accepts (hidden states: BF16 or F32) is the caller's check.
absl::StatusOr<DType> WireDTypeFromProto(v1::WireDType d);

// Token ids: int64 in memory, int32 on the wire.
void TokenIdsToProto(std::span<const int64_t> ids, google::protobuf::RepeatedField<int32_t>* out);
std::vector<int64_t> TokenIdsFromProto(const google::protobuf::RepeatedField<int32_t>& ids);

// Requests, client to server.
void SequenceInputToProto(const InputSequence& in, v1::SequenceInput* out);
void LayerSelectionToProto(const RequestedStates& s, v1::LayerSelection* out);
// As sent: ids unchecked and in request order, duplicates kept (the service validates).
StateSelection StateSelectionFromProto(const v1::LayerSelection& s);
void ExtractRequestToProto(const ExtractParams& p, v1::ExtractRequest* out);
void GenerateRequestToProto(const GenerateParams& p, v1::GenerateRequest* out);

// Stream messages, server to client. A state is named by its tap (and layer id for layer outputs).
v1::Tap TapToProto(StateTap t);
// INVALID_ARGUMENT "unknown tap N" for a value outside the enum.
absl::StatusOr<StateTap> TapFromProto(v1::Tap t);

void SequenceInfoToProto(uint32_t sequence_index, std::span<const int64_t> token_ids,
                         v1::SequenceInfo* out);

void CompletionToProto(uint32_t sequence_index, std::span<const int64_t> prompt,
                       const CompletionOutput& c, v1::Completion* out);
ReceivedCompletion CompletionFromProto(const v1::Completion& p);

// One chunk of a host state without its bytes: the header from `s`, rows from `c` (a span of
// s.bytes) and the crc32c of those bytes; `data` is left empty, as the server sends the bytes
// themselves without a copy (common/rpc/payload_frame.h).
void HiddenStateChunkHeaderToProto(const HostState& s, const ChunkSpan& c,
                                   v1::HiddenStateChunk* out);
// The state a chunk belongs to, from its header (every field of ReceivedState but `bytes`):
// INVALID_ARGUMENT "chunk with unknown tap N" / "unknown dtype N". Geometry and crc are the
// StateAssembler's to check.
absl::StatusOr<ReceivedState> ReceivedStateFromChunk(const v1::HiddenStateChunk& c);

void StreamTotalsToProto(const StreamTotals& t, v1::StreamTrailer* out);
StreamTotals StreamTotalsFromProto(const v1::StreamTrailer& p);

// GetTensors: the chunk of `t` holding `piece` (which starts `offset` bytes into t.bytes).
void TensorChunkToProto(const TensorBytes& t, uint64_t offset, std::span<const std::byte> piece,
                        v1::TensorChunk* out);
// The tensor a chunk belongs to, from its header (name, shape, dtype, digest; no bytes):
// INVALID_ARGUMENT "unknown dtype N".
absl::StatusOr<ReceivedTensor> ReceivedTensorFromChunk(const v1::TensorChunk& c);

}  // namespace specwire
