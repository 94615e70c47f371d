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
// The hardware CRC: three independent streams of the crc32 instruction over three adjacent
// blocks (its latency is three cycles, its throughput one per cycle), joined by shifting a
// block's crc over the length of the next one. Shifting a crc over n zero bytes is linear in its
// 32 bits, so it is four lookups in a table made once per block length (the GF(2) matrix of
// "append n zero bytes", squared up from one zero bit). The layout follows Mark Adler's public
// crc32c.c.
constexpr size_t kLongBlock = 8192;
constexpr size_t kShortBlock = 256;

using ShiftTable = std::array<std::array<uint32_t, 256>, 4>;

uint32_t Gf2Times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void Gf2Square(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2Times(mat, mat[n]);
}

// The table that shifts a crc register over `len` zero bytes (`len` a power of two).
ShiftTable MakeShiftTable(size_t len) {
  uint32_t even[32], odd[32];
  odd[0] = kPoly;  // the operator for one zero bit
  for (int n = 1; n < 32; ++n) odd[n] = 1u << (n - 1);
  Gf2Square(even, odd);  // two zero bits
  Gf2Square(odd, even);  // four
  const uint32_t* op = nullptr;
  for (;;) {
    Gf2Square(even, odd);  // the first pass: one zero byte, then doubling
    len >>= 1;
    if (len == 0) {
      op = even;
      break;
    }
    Gf2Square(odd, even);
    len >>= 1;
    if (len == 0) {
      op = odd;
      break;
    }
  }
  ShiftTable t;
  for (uint32_t n = 0; n < 256; ++n) {
    for (int k = 0; k < 4; ++k) t[k][n] = Gf2Times(op, n << (8 * k));
  }
  return t;
}

uint32_t Shift(const ShiftTable& t, uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

// Three streams over blocks of `block` bytes while at least three are left.
__attribute__((target("sse4.2"))) uint64_t Crc32cTriple(const uint8_t*& p, size_t& n,
                                                        uint64_t crc0, size_t block,
                                                        const ShiftTable& shift) {
  while (n >= 3 * block) {
    uint64_t crc1 = 0, crc2 = 0;
    for (const uint8_t* end = p + block; p < end; p += 8) {
      uint64_t a, b, c;
      std::memcpy(&a, p, 8);
      std::memcpy(&b, p + block, 8);
      std::memcpy(&c, p + 2 * block, 8);
      crc0 = _mm_crc32_u64(crc0, a);
      crc1 = _mm_crc32_u64(crc1, b);
      crc2 = _mm_crc32_u64(crc2, c);
    }
    crc0 = Shift(shift, static_cast<uint32_t>(crc0)) ^ crc1;
    crc0 = Shift(shift, static_cast<uint32_t>(crc0)) ^ crc2;
    p += 2 * block;
    n -= 3 * block;
  }
  return crc0;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHw(const uint8_t* p, size_t n, uint32_t crc) {
  static const ShiftTable long_shift = MakeShiftTable(kLongBlock);
  static const ShiftTable short_shift = MakeShiftTable(kShortBlock);
  uint64_t c = crc;
  c = Crc32cTriple(p, n, c, kLongBlock, long_shift);
  c = Crc32cTriple(p, n, c, kShortBlock, short_shift);
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

uint32_t Crc32cPortable(std::span<const std::byte> data, uint32_t crc) {
  return ~Crc32cTable(reinterpret_cast<const uint8_t*>(data.data()), data.size(), ~crc);
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
  const std::span<const std::byte> one[1] = {data};
  return AddPieces(row_start, row_count, hidden, dtype, std::span(one), crc32c);
}

absl::Status StateAssembler::AddPieces(int64_t row_start, int64_t row_count, int64_t hidden,
                                 DType dtype, std::span<const std::span<const std::byte>> pieces,
                                 uint32_t crc32c) {
  if (!geometry_.ok()) return geometry_;
  uint32_t crc = 0;
  size_t size = 0;
  for (std::span<const std::byte> p : pieces) {
    crc = Crc32c(p, crc);
    size += p.size();
  }
  if (crc != crc32c) {
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
  if (size != row_bytes * row_count) {
    return absl::InvalidArgumentError(absl::StrCat("data holds ", size, " bytes, expected ",
                                                   row_bytes * row_count));
  }
  std::byte* to = bytes_.data() + row_start * row_bytes;
  for (std::span<const std::byte> p : pieces) {
    // A state of hidden size 0 has no buffer (data() may be null, which memcpy must not get).
    if (p.empty()) continue;
    std::memcpy(to, p.data(), p.size());
    to += p.size();
  }
  next_row_ += row_count;
  return absl::OkStatus();
}

}  // namespace specwire
