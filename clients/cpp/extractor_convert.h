// The C++ client's own types <-> the extractor's messages: its requests out, the completions,
// states and tensors of the replies in (headers only: the StateAssembler puts the bytes
// together). The shared types' conversions are proto/convert.h's. rpc-only (includes a .pb.h).
#pragma once

#include "absl/status/statusor.h"
#include "clients/cpp/extractor_client.h"
#include "proto/convert.h"
#include "proto/specwire/v1/extractor.pb.h"

namespace specwire {

void ExtractRequestToProto(const ExtractParams& p, v1::ExtractRequest* out);

void GenerateRequestToProto(const GenerateParams& p, v1::GenerateRequest* out);

ReceivedCompletion CompletionFromProto(const v1::Completion& p);

// The state a chunk belongs to, from its header (every field of ReceivedState but `bytes`):
// INVALID_ARGUMENT "chunk with unknown tap N" / "unknown dtype N". Geometry and crc are the
// StateAssembler's to check.
absl::StatusOr<ReceivedState> ReceivedStateFromChunk(const v1::HiddenStateChunk& c);

// The tensor a chunk belongs to, from its header (name, shape, dtype, digest; no bytes):
// INVALID_ARGUMENT "unknown dtype N".
absl::StatusOr<ReceivedTensor> ReceivedTensorFromChunk(const v1::TensorChunk& c);

}  // namespace specwire
