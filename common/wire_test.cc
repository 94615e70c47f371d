#include "common/wire.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace specwire {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

TEST(Crc32c, KnownVectors) {
  // RFC 3720 B.4 and the common "123456789" check value.
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(Bytes(std::string(32, '\0'))), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(Bytes(std::string(32, '\xff'))), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(Bytes("")), 0u);
}

// The three-stream hardware path (blocks of 8 KiB and 256 bytes, joined by shift tables) equals
// the table, for every length around the block edges, any alignment and any starting crc.
TEST(Crc32c, FastPathEqualsTheTable) {
  std::mt19937 rng(29);
  std::vector<std::byte> buf(3 * 8192 * 3 + 64);
  for (auto& b : buf) b = static_cast<std::byte>(rng());
  std::vector<size_t> lengths;
  for (size_t edge : {size_t{0}, size_t{3 * 256}, size_t{3 * 8192}, size_t{6 * 8192}}) {
    for (int d = -17; d <= 17; ++d) {
      if (static_cast<int64_t>(edge) + d >= 0) lengths.push_back(edge + d);
    }
  }
  for (int i = 0; i < 300; ++i) lengths.push_back(rng() % (buf.size() - 64));
  for (size_t n : lengths) {
    const size_t offset = rng() % 64;
    const uint32_t start = rng() % 2 ? 0 : static_cast<uint32_t>(rng());
    const auto piece = std::span(buf).subspan(offset, n);
    ASSERT_EQ(Crc32c(piece, start), Crc32cPortable(piece, start)) << n << " at " << offset;
  }
}

TEST(Crc32c, ChainsAcrossCalls) {
  std::string s(1000, '\0');
  std::iota(s.begin(), s.end(), 0);
  for (size_t split : {0u, 1u, 7u, 8u, 9u, 500u, 999u, 1000u}) {
    const uint32_t a = Crc32c(Bytes(s.substr(0, split)));
    EXPECT_EQ(Crc32c(Bytes(s.substr(split)), a), Crc32c(Bytes(s))) << split;
  }
}

TEST(PlanChunks, WholeRowsWithinLimit) {
  std::vector<std::byte> m(10 * 12);
  auto chunks = PlanChunks(m, /*rows=*/10, /*row_bytes=*/12, /*max_chunk_bytes=*/40);
  ASSERT_EQ(chunks.size(), 4u);  // 3 + 3 + 3 + 1 rows
  int64_t next = 0;
  for (const auto& c : chunks) {
    EXPECT_EQ(c.row_start, next);
    EXPECT_LE(c.bytes.size(), 40u);
    EXPECT_EQ(c.bytes.size(), static_cast<size_t>(c.row_count * 12));
    next += c.row_count;
  }
  EXPECT_EQ(next, 10);
}

TEST(PlanChunks, RowLargerThanLimitTravelsAlone) {
  std::vector<std::byte> m(3 * 100);
  auto chunks = PlanChunks(m, 3, 100, 10);
  ASSERT_EQ(chunks.size(), 3u);
  for (const auto& c : chunks) EXPECT_EQ(c.row_count, 1);
}

class AssemblerTest : public ::testing::Test {
 protected:
  // 5 rows x 4 floats.
  std::vector<std::byte> Matrix() {
    std::vector<float> v(20);
    std::iota(v.begin(), v.end(), 1.0f);
    auto b = std::as_bytes(std::span<const float>(v));
    return {b.begin(), b.end()};
  }
};

TEST_F(AssemblerTest, RebuildsExactBytes) {
  auto m = Matrix();
  StateAssembler a(5, 4, DType::kF32);
  for (const auto& c : PlanChunks(m, 5, 16, 32)) {
    ASSERT_TRUE(a.Add(c.row_start, c.row_count, 4, DType::kF32, c.bytes, Crc32c(c.bytes)).ok());
  }
  EXPECT_TRUE(a.complete());
  EXPECT_EQ(a.bytes(), m);
}

TEST_F(AssemblerTest, RejectsCorruptionAndInconsistency) {
  auto m = Matrix();
  auto chunks = PlanChunks(m, 5, 16, 32);
  {
    StateAssembler a(5, 4, DType::kF32);
    auto s = a.Add(0, 2, 4, DType::kF32, chunks[0].bytes, Crc32c(chunks[0].bytes) ^ 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  }
  {
    StateAssembler a(5, 4, DType::kF32);
    auto s = a.Add(2, 2, 4, DType::kF32, chunks[1].bytes, Crc32c(chunks[1].bytes));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.message()).find("token_start"), std::string::npos);
  }
  {
    StateAssembler a(5, 4, DType::kF32);
    auto s = a.Add(0, 2, 4, DType::kBF16, chunks[0].bytes, Crc32c(chunks[0].bytes));
    EXPECT_NE(std::string(s.message()).find("dtype"), std::string::npos);
  }
  {
    StateAssembler a(5, 4, DType::kF32);
    auto s = a.Add(0, 2, 8, DType::kF32, chunks[0].bytes, Crc32c(chunks[0].bytes));
    EXPECT_NE(std::string(s.message()).find("hidden_size"), std::string::npos);
  }
  {
    StateAssembler a(1, 4, DType::kF32);
    auto s = a.Add(0, 2, 4, DType::kF32, chunks[0].bytes, Crc32c(chunks[0].bytes));
    EXPECT_NE(std::string(s.message()).find("sequence_length"), std::string::npos);
  }
  {
    StateAssembler a(5, 4, DType::kF32);
    auto short_data = chunks[0].bytes.subspan(0, 20);
    auto s = a.Add(0, 2, 4, DType::kF32, short_data, Crc32c(short_data));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  }
}

// Geometry off the wire that no buffer can hold (found by fuzz/wire_fuzz.cc): refused by Add,
// nothing allocated, and no signed overflow in the row checks.
TEST(StateAssembler, RefusesImpossibleGeometry) {
  const std::string row(8, 'x');
  for (auto [rows, hidden] : {std::pair<int64_t, int64_t>{-1, 4}, {4, -1},
                              {int64_t{1} << 40, int64_t{1} << 40}, {INT64_MAX, 2}}) {
    StateAssembler a(rows, hidden, DType::kF32);
    auto s = a.Add(0, 1, hidden, DType::kF32, Bytes(row), Crc32c(Bytes(row)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << rows << " x " << hidden;
    EXPECT_NE(std::string(s.message()).find("sequence_length"), std::string::npos);
    EXPECT_FALSE(a.complete());
  }
  StateAssembler a(2, 2, DType::kF32);
  auto s = a.Add(0, INT64_MAX, 2, DType::kF32, Bytes(row), Crc32c(Bytes(row)));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = a.Add(INT64_MAX, INT64_MAX, 2, DType::kF32, Bytes(row), Crc32c(Bytes(row)) ^ 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
}

// Hidden size 0: rows without bytes (no buffer, so no memcpy from or to a null pointer).
TEST(StateAssembler, ZeroHiddenSize) {
  StateAssembler a(3, 0, DType::kBF16);
  EXPECT_TRUE(a.Add(0, 2, 0, DType::kBF16, {}, Crc32c({})).ok());
  EXPECT_TRUE(a.Add(2, 1, 0, DType::kBF16, {}, Crc32c({})).ok());
  EXPECT_TRUE(a.complete());
  EXPECT_TRUE(a.bytes().empty());
}

// A chunk's bytes in pieces (as they lie in the receive buffers) assemble exactly as in one
// span, however they are cut; a crc over the pieces catches a flipped byte in any of them.
TEST(StateAssembler, PiecesAssembleAsOneSpan) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t rows = 1 + rng() % 9, hidden = 1 + rng() % 40;
    std::vector<std::byte> data(rows * hidden * 2);
    for (auto& b : data) b = static_cast<std::byte>(rng());
    StateAssembler whole(rows, hidden, DType::kBF16), cut(rows, hidden, DType::kBF16);
    ASSERT_TRUE(whole.Add(0, rows, hidden, DType::kBF16, data, Crc32c(data)).ok());
    std::vector<std::span<const std::byte>> pieces;
    for (size_t at = 0; at < data.size();) {
      const size_t k = std::min<size_t>(data.size() - at, rng() % 3 == 0 ? 0 : 1 + rng() % 50);
      pieces.emplace_back(data.data() + at, k);
      at += k;
    }
    ASSERT_TRUE(cut.AddPieces(0, rows, hidden, DType::kBF16, pieces, Crc32c(data)).ok());
    EXPECT_EQ(cut.bytes(), whole.bytes());
    std::vector<std::byte> flipped = data;
    flipped[rng() % flipped.size()] ^= std::byte{1};
    StateAssembler bad(rows, hidden, DType::kBF16);
    const size_t half = flipped.size() / 2;
    const std::span<const std::byte> halves[2] = {std::span(flipped).first(half),
                                                  std::span(flipped).subspan(half)};
    EXPECT_EQ(bad.AddPieces(0, rows, hidden, DType::kBF16, halves, Crc32c(data)).code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(ParseWireDType, NamesAliasesAndAuto) {
  for (const char* name : {"fp32", "float32"}) {
    EXPECT_EQ(*ParseWireDType(name, "bfloat16"), DType::kF32) << name;
  }
  for (const char* name : {"bf16", "bfloat16"}) {
    EXPECT_EQ(*ParseWireDType(name, "float32"), DType::kBF16) << name;
  }
  // auto follows the consumer's compute dtype, whichever spelling of float32 it uses.
  for (const char* compute : {"float32", "fp32", "f32"}) {
    EXPECT_EQ(*ParseWireDType("auto", compute), DType::kF32) << compute;
  }
  for (const char* compute : {"bfloat16", "bf16", "float16", ""}) {
    EXPECT_EQ(*ParseWireDType("auto", compute), DType::kBF16) << compute;
  }
  auto bad = ParseWireDType("f16", "float32", "--cli_flag");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--cli_flag \"f16\""), std::string::npos);
}

}  // namespace
}  // namespace specwire
