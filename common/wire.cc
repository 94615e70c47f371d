#include "common/wire.h"

#include <array>
#include <cstring>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace specwire {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

uint32_t Crc32cTable(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool HasSse42() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2);
}
#endif

}  // namespace

absl::StatusOr<DType> ParseWireDType(absl::string_view name, absl::string_view compute_dtype,
                                     absl::string_view flag) {
  if (name == "fp32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "auto") {
    const bool f32 =
        compute_dtype == "float32" || compute_dtype == "fp32" || compute_dtype == "f32";
    return f32 ? DType::kF32 : DType::kBF16;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " \"", name, "\" is not one of fp32, bf16, auto"));
}

uint32_t Crc32c(std::span<const std::byte> data, uint32_t crc) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  crc = ~crc;
#if defined(__x86_64__)
  static const bool hw = HasSse42();
  crc = hw ? Crc32cHw(p, data.size(), crc) : Crc32cTable(p, data.size(), crc);
#else
  crc = Crc32cTable(p, data.size(), crc);
#endif
  return ~crc;
}

std::vector<ChunkSpan> PlanChunks(std::span<const std::byte> matrix, int64_t rows,
                                  int64_t row_bytes, int64_t max_chunk_bytes) {
  std::vector<ChunkSpan> chunks;
  const int64_t rows_per_chunk = std::max<int64_t>(1, max_chunk_bytes / std::max<int64_t>(1, row_bytes));
  for (int64_t r = 0; r < rows; r += rows_per_chunk) {
    const int64_t n = std::min(rows_per_chunk, rows - r);
    chunks.push_back({r, n, matrix.subspan(r * row_bytes, n * row_bytes)});
  }
  return chunks;
}

StateAssembler::StateAssembler(int64_t rows, int64_t hidden, DType dtype)
    : rows_(rows), hidden_(hidden), dtype_(dtype) {
  size_t n = 0;
  if (rows < 0 || hidden < 0 ||
      __builtin_mul_overflow(static_cast<size_t>(rows), static_cast<size_t>(hidden), &n) ||
      __builtin_mul_overflow(n, DTypeSize(dtype), &n) || n > bytes_.max_size()) {
    geometry_ = absl::InvalidArgumentError(
        absl::StrCat("sequence_length ", rows, " × hidden_size ", hidden, " of ", DTypeName(dtype),
                     " is not a state this process can hold"));
    return;
  }
  bytes_.resize(n);
}

absl::Status StateAssembler::Add(int64_t row_start, int64_t row_count, int64_t hidden,
                                 DType dtype, std::span<const std::byte> data, uint32_t crc32c) {
  if (!geometry_.ok()) return geometry_;
  if (Crc32c(data) != crc32c) {
    // No row_start + row_count here: both are unchecked yet, and the sum may overflow.
    return absl::DataLossError(absl::StrCat("chunk of ", row_count, " rows at ", row_start,
                                            ": crc32c mismatch"));
  }
  if (hidden != hidden_) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden_size ", hidden, " differs from the state's ", hidden_));
  }
  if (dtype != dtype_) {
    return absl::InvalidArgumentError(absl::StrCat("dtype ", DTypeName(dtype),
                                                   " differs from the state's ", DTypeName(dtype_)));
  }
  if (row_start != next_row_) {
    return absl::InvalidArgumentError(absl::StrCat("token_start ", row_start, " but rows up to ",
                                                   next_row_, " were received"));
  }
  // row_start == next_row_ <= rows_ here, so the subtraction cannot overflow (a sum could).
  if (row_count <= 0 || row_count > rows_ - row_start) {
    return absl::InvalidArgumentError(absl::StrCat("token_count ", row_count, " at ", row_start,
                                                   " runs past sequence_length ", rows_));
  }
  const size_t row_bytes = static_cast<size_t>(hidden_) * DTypeSize(dtype_);
  if (data.size() != row_bytes * row_count) {
    return absl::InvalidArgumentError(absl::StrCat("data holds ", data.size(), " bytes, expected ",
                                                   row_bytes * row_count));
  }
  // A state of hidden size 0 has no buffer (data() may be null, which memcpy must not get).
  if (!data.empty()) std::memcpy(bytes_.data() + row_start * row_bytes, data.data(), data.size());
  next_row_ += row_count;
  return absl::OkStatus();
}

}  // namespace specwire
