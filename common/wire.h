// The wire codec for hidden states: how a [rows, hidden] matrix is cut into chunks and put back
// together, and the crc32c that guards each chunk. No protobuf here: rpc code copies a ChunkSpan
// into a HiddenStateChunk message and hands received chunks to a StateAssembler.
//
// Convention (fixed by proto/specwire/v1/extractor.proto): row-major little-endian bytes; a chunk
// holds whole rows [row_start, row_start + row_count) and at most max_chunk_bytes of data, except
// that a single row larger than the limit travels alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/safetensors.h"

namespace specwire {

// CRC-32C (Castagnoli), the checksum of iSCSI, ext4 and gRPC. Uses the SSE4.2 instruction, three
// streams at once, when the CPU has it, a table otherwise. `crc` chains calls:
// Crc32c(b, Crc32c(a)) == Crc32c(a ++ b).
uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc = 0);
// The same by the table alone, whatever the CPU (the reference the fast one is tested against).
uint32_t Crc32cPortable(std::span<const std::byte> data, uint32_t crc = 0);

// The dtype hidden states travel in, from a flag (--wire_dtype of every binary): "fp32" |
// "float32", "bf16" | "bfloat16", or "auto": fp32 when `compute_dtype` (what the states feed: the
// drafter's dtype in the scorer, the served target's in the CLI) is float32 (fp32, f32), bf16
// otherwise — a bf16 or fp16 consumer loses nothing to bf16 and the wire carries half the bytes.
// INVALID_ARGUMENT naming `flag` and the value.
absl::StatusOr<DType> ParseWireDType(absl::string_view name, absl::string_view compute_dtype,
                                     absl::string_view flag = "--wire_dtype");

struct ChunkSpan {
  int64_t row_start = 0;
  int64_t row_count = 0;
  std::span<const std::byte> bytes;
};

// Cuts a matrix of `rows` rows of `row_bytes` each into chunks of at most `max_chunk_bytes`.
std::vector<ChunkSpan> PlanChunks(std::span<const std::byte> matrix, int64_t rows,
                                  int64_t row_bytes, int64_t max_chunk_bytes);

// Rebuilds one state from its chunks, checking every chunk before accepting it: crc, dtype and
// width consistent with the first chunk, rows in order and inside the declared length. DATA_LOSS
// for a crc mismatch, INVALID_ARGUMENT for anything inconsistent (message names the field).
class StateAssembler {
 public:
  // The geometry usually comes off the wire: negative sizes, or rows × hidden × dtype size that
  // overflow or exceed what a vector can hold, allocate nothing and make every Add fail with
  // INVALID_ARGUMENT.
  StateAssembler(int64_t rows, int64_t hidden, DType dtype);
  absl::Status Add(int64_t row_start, int64_t row_count, int64_t hidden, DType dtype,
                   std::span<const std::byte> data, uint32_t crc32c);
  // The same with the chunk's bytes in pieces, in order (views of the receive buffers).
  absl::Status AddPieces(int64_t row_start, int64_t row_count, int64_t hidden, DType dtype,
                   std::span<const std::span<const std::byte>> pieces, uint32_t crc32c);
  bool complete() const { return geometry_.ok() && next_row_ == rows_; }
  int64_t rows() const { return rows_; }
  int64_t hidden() const { return hidden_; }
  DType dtype() const { return dtype_; }
  // The assembled bytes (valid when complete()).
  const std::vector<std::byte>& bytes() const { return bytes_; }
  std::vector<std::byte> Release() { return std::move(bytes_); }

 private:
  int64_t rows_, hidden_;
  DType dtype_;
  int64_t next_row_ = 0;
  absl::Status geometry_;  // why the state cannot be held; OK when it can
  std::vector<std::byte> bytes_;
};

}  // namespace specwire
