// Conversions between specwire's plain types and the wire messages that the extractor service,
// its C++ client and the scorer all exchange: the extraction contract and the wire dtype.
#pragma once

#include "common/contract.h"
#include "common/safetensors.h"
#include "proto/specwire/v1/extractor.pb.h"

namespace specwire {

void ContractToProto(const ExtractionContract& c, v1::ExtractionContract* out);
ExtractionContract ContractFromProto(const v1::ExtractionContract& p);

v1::WireDType WireDTypeToProto(DType d);

}  // namespace specwire
