// Chunk reassembly: a state cut by PlanChunks goes back together byte for byte, and for a random
// sequence of chunks (valid, corrupted, out of order, with any geometry) StateAssembler::Add
// accepts exactly the chunks a reference model accepts and never writes outside its buffer.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/wire.h"
#include "fuzz/fuzz_check.h"

namespace specwire {
namespace {

constexpr DType kDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// The rules of StateAssembler::Add (common/wire.h), written out independently.
bool ShouldAccept(int64_t rows, int64_t hidden, DType dtype, int64_t next_row, int64_t row_start,
                  int64_t row_count, int64_t c_hidden, DType c_dtype, size_t data_size,
                  bool crc_ok) {
  if (!crc_ok || c_hidden != hidden || c_dtype != dtype || row_start != next_row) return false;
  if (row_count <= 0 || row_count > rows - row_start) return false;
  const uint64_t row_bytes = static_cast<uint64_t>(hidden) * DTypeSize(dtype);
  return data_size == row_bytes * static_cast<uint64_t>(row_count);
}

}  // namespace
}  // namespace specwire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  FuzzedDataProvider in(data, size);

  // Geometry from anywhere in int64: the assembler must refuse what it cannot hold (negative or
  // overflowing sizes) instead of allocating it. Sizes that are valid but large are not built.
  {
    const int64_t rows = in.ConsumeIntegral<int64_t>();
    const int64_t hidden = in.ConsumeIntegral<int64_t>();
    const DType dtype = in.PickValueInArray(kDTypes);
    uint64_t bytes = 0;
    const bool representable = rows >= 0 && hidden >= 0 &&
                               !__builtin_mul_overflow(static_cast<uint64_t>(rows),
                                                       static_cast<uint64_t>(hidden), &bytes) &&
                               !__builtin_mul_overflow(bytes, DTypeSize(dtype), &bytes) &&
                               bytes <= static_cast<uint64_t>(PTRDIFF_MAX);
    if (!representable || bytes <= (1u << 16)) {
      StateAssembler a(rows, hidden, dtype);
      const int64_t count = in.ConsumeIntegral<int64_t>();
      std::vector<std::byte> chunk(in.ConsumeIntegralInRange<size_t>(0, 64));
      absl::Status s = a.Add(0, count, hidden, dtype, chunk, Crc32c(chunk));
      if (!representable) {
        FUZZ_CHECK(!s.ok() && !a.complete(), "accepted a chunk of an impossible state");
      } else {
        FUZZ_CHECK(s.ok() == ShouldAccept(rows, hidden, dtype, 0, 0, count, hidden, dtype,
                                          chunk.size(), true),
                   "first chunk: %s", std::string(s.message()).c_str());
      }
    }
  }

  const int64_t rows = in.ConsumeIntegralInRange<int64_t>(0, 64);
  const int64_t hidden = in.ConsumeIntegralInRange<int64_t>(0, 48);
  const DType dtype = in.PickValueInArray(kDTypes);
  const int64_t row_bytes = hidden * static_cast<int64_t>(DTypeSize(dtype));
  std::vector<std::byte> matrix(static_cast<size_t>(rows * row_bytes));
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<std::byte>(i * 131 + rows);

  // 1. The planned chunks: whole rows, in order, within the byte limit, reassembled exactly.
  const int64_t max_chunk = in.ConsumeIntegralInRange<int64_t>(0, 4096);
  const std::vector<ChunkSpan> plan = PlanChunks(matrix, rows, row_bytes, max_chunk);
  {
    StateAssembler a(rows, hidden, dtype);
    int64_t next = 0;
    for (const ChunkSpan& c : plan) {
      FUZZ_CHECK(c.row_start == next && c.row_count > 0, "plan out of order");
      FUZZ_CHECK(c.row_count == 1 || static_cast<int64_t>(c.bytes.size()) <= max_chunk,
                 "chunk of %zu bytes over the limit %lld", c.bytes.size(),
                 static_cast<long long>(max_chunk));
      FUZZ_CHECK(static_cast<int64_t>(c.bytes.size()) == c.row_count * row_bytes, "chunk size");
      absl::Status s = a.Add(c.row_start, c.row_count, hidden, dtype, c.bytes, Crc32c(c.bytes));
      FUZZ_CHECK(s.ok(), "planned chunk refused: %s", std::string(s.message()).c_str());
      next += c.row_count;
    }
    FUZZ_CHECK(next == rows && a.complete(), "plan covers %lld of %lld rows",
               static_cast<long long>(next), static_cast<long long>(rows));
    FUZZ_CHECK(a.bytes() == matrix, "reassembled bytes differ");
  }

  // 2. Random chunks against the reference model.
  StateAssembler a(rows, hidden, dtype);
  std::vector<std::byte> expected(matrix.size());
  int64_t next_row = 0;
  while (in.remaining_bytes() > 0) {
    int64_t start = next_row, count = 1, c_hidden = hidden;
    DType c_dtype = dtype;
    bool corrupt = false;
    const uint8_t op = in.ConsumeIntegral<uint8_t>();
    switch (op % 8) {
      case 0:
        start = in.ConsumeIntegral<int64_t>();
        break;
      case 1:
        count = in.ConsumeIntegral<int64_t>();
        break;
      case 2:
        c_hidden = in.ConsumeIntegralInRange<int64_t>(-2, 64);
        break;
      case 3:
        c_dtype = in.PickValueInArray(kDTypes);
        break;
      case 4:
        corrupt = true;
        break;
      default:
        count = in.ConsumeIntegralInRange<int64_t>(-1, rows + 1);
        break;
    }
    size_t n = 0;
    if (op & 0x80) {
      n = in.ConsumeIntegralInRange<size_t>(0, 4 * 4096);
    } else if (count > 0 && count <= 4096 && c_hidden >= 0) {
      n = static_cast<size_t>(count * c_hidden) * DTypeSize(c_dtype);
    }
    std::vector<std::byte> chunk(n);
    for (size_t i = 0; i < n; ++i) chunk[i] = static_cast<std::byte>(in.ConsumeIntegral<uint8_t>());
    uint32_t crc = Crc32c(chunk);
    if (corrupt) crc ^= 1u << (op % 32);
    const bool want = ShouldAccept(rows, hidden, dtype, next_row, start, count, c_hidden, c_dtype,
                                   chunk.size(), !corrupt);
    absl::Status s = a.Add(start, count, c_hidden, c_dtype, chunk, crc);
    FUZZ_CHECK(s.ok() == want, "Add(start %lld, count %lld, hidden %lld, %zu bytes) %s: %s",
               static_cast<long long>(start), static_cast<long long>(count),
               static_cast<long long>(c_hidden), chunk.size(), s.ok() ? "accepted" : "refused",
               std::string(s.message()).c_str());
    if (!s.ok()) {
      FUZZ_CHECK(
          s.code() == (corrupt ? absl::StatusCode::kDataLoss : absl::StatusCode::kInvalidArgument),
          "code %d", static_cast<int>(s.code()));
      continue;
    }
    if (n > 0) std::memcpy(expected.data() + start * row_bytes, chunk.data(), n);
    next_row += count;
    FUZZ_CHECK(a.complete() == (next_row == rows), "complete() wrong");
  }
  if (a.complete()) FUZZ_CHECK(a.bytes() == expected, "assembled bytes differ");
  return 0;
}
