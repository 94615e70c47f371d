// Hidden states on the wire without copies. A streamed message that carries a state's bytes is
// `oneof { ...; Chunk chunk = F; }` with the bytes in one field of the chunk (HiddenStateChunk's
// `data`). The server sends such a message as two slices: a small copied one with the framing and
// every other field of the chunk, then the bytes themselves, referenced where the engine left
// them; the client reads the other fields and gets the bytes as views of gRPC's receive buffers,
// which it copies once, into the state. The bytes stay the proto's field: this is the encoding
// protobuf itself produces, with the bytes field last (parsers take fields in any order), and any
// protobuf reader (the Python client's) reads it unchanged.
#pragma once

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

namespace specwire {

// Appends `v` as a protobuf base-128 varint (tags, lengths, integer fields).
void AppendVarint(uint64_t v, std::string* out);

// Bytes sent without a copy, and what keeps them alive until gRPC has sent them.
struct Payload {
  std::span<const std::byte> bytes;
  std::shared_ptr<const void> owner;
};

// The message whose only field is submessage `field` = `sub` with `payload` as its bytes field
// `bytes_field` (which `sub` must not set itself). Field numbers 1..15 (one-byte tags).
grpc::ByteBuffer FrameWithPayload(int field, const google::protobuf::MessageLite& sub,
                                  int bytes_field, Payload payload);

// The received side. When `frame` is one length-delimited field `field` (the whole message),
// fills `sub` with that submessage parsed without its bytes field `bytes_field` and `pieces` with
// views of that field's bytes (the last occurrence, as protobuf keeps), valid while `slices` live;
// returns true. Returns false when the frame is anything else (the caller parses it whole), and
// DATA_LOSS when it is malformed.
absl::StatusOr<bool> SplitPayloadFrame(const std::vector<grpc::Slice>& slices, int field,
                                       int bytes_field, google::protobuf::MessageLite* sub,
                                       std::vector<std::span<const std::byte>>* pieces);

}  // namespace specwire
