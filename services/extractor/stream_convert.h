// The extractor service's own types <-> its messages: a completion, a captured host state's chunk
// header, a stored tensor's chunk (services/extractor/work.h). The shared types' conversions are
// proto/convert.h's. rpc-only (includes a .pb.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/wire.h"
#include "proto/convert.h"
#include "proto/specwire/v1/extractor.pb.h"
#include "services/extractor/work.h"

namespace specwire {

void CompletionToProto(uint32_t sequence_index, std::span<const int64_t> prompt,
                       const CompletionOutput& c, v1::Completion* out);

// One chunk of a host state without its bytes: the header from `s`, rows from `c` (a span of
// s.bytes) and the crc32c of those bytes; `data` is left empty, as the server sends the bytes
// themselves without a copy (common/rpc/payload_frame.h).
void HiddenStateChunkHeaderToProto(const HostState& s, const ChunkSpan& c,
                                   v1::HiddenStateChunk* out);

// GetTensors: the chunk of `t` holding `piece` (which starts `offset` bytes into t.bytes).
void TensorChunkToProto(const TensorBytes& t, uint64_t offset, std::span<const std::byte> piece,
                        v1::TensorChunk* out);

}  // namespace specwire
