// Conversions between the extractor API's shared plain types (common/: the contract, dtypes,
// common/extractor_api.h) and the wire messages that the extractor service, its C++ client and
// the scorer all exchange; each wire enum in one table read both ways, so the two ends of a
// stream cannot drift. A side's own types convert beside it: the service's captured states and
// tensors in services/extractor/stream_convert.h, the client's requests and reassembled replies
// in clients/cpp/extractor_convert.h, both on the tables here. Validation against limits or a
// loaded model is not conversion: it stays with the service and the client's stream checks.
//
// This header is rpc-only: it includes a .pb.h, so a translation unit that includes torch must
// never include it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/contract.h"
#include "common/extractor_api.h"
#include "common/safetensors.h"
#include "common/wire.h"
#include "proto/specwire/v1/extractor.pb.h"

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
void LayerSelectionToProto(const StateSelection& s, v1::LayerSelection* out);
// As sent: ids unchecked and in request order, duplicates kept (the service validates).
StateSelection StateSelectionFromProto(const v1::LayerSelection& s);

// Stream messages, server to client. A state is named by its tap (and layer id for layer outputs).
v1::Tap TapToProto(StateTap t);
// INVALID_ARGUMENT "unknown tap N" for a value outside the enum.
absl::StatusOr<StateTap> TapFromProto(v1::Tap t);

void SequenceInfoToProto(uint32_t sequence_index, std::span<const int64_t> token_ids,
                         v1::SequenceInfo* out);



void StreamTotalsToProto(const StreamTotals& t, v1::StreamTrailer* out);
StreamTotals StreamTotalsFromProto(const v1::StreamTrailer& p);


// A live session's verification rule. INVALID_ARGUMENT "N is not a rule" outside the enum.
v1::VerifyRule DraftRuleToProto(DraftRule r);
absl::StatusOr<DraftRule> DraftRuleFromProto(v1::VerifyRule r);

// A live session's commit.
void SessionCommittedToProto(const SessionCommitted& c, v1::SessionCommitted* out);
SessionCommitted SessionCommittedFromProto(const v1::SessionCommitted& p);

}  // namespace specwire
