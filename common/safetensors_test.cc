#include "common/safetensors.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/status_testing.h"
#include "gtest/gtest.h"

namespace specwire {
namespace {

std::string MakeTempDir() {
  std::string templ = ::testing::TempDir() + "/safetensors_test.XXXXXX";
  char* made = ::mkdtemp(templ.data());
  EXPECT_NE(made, nullptr) << templ;
  return templ;
}

void WriteBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file as a writer would lay it out: u64 LE header length, header, data.
std::string RawFile(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out.append(header);
  out.append(data);
  return out;
}

std::vector<std::byte> Pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 7 + seed) & 0xff);
  return v;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(std::string_view name) const { return dir_ + "/" + std::string(name); }

  // Writes `header` + `data` by hand and opens the result.
  absl::Status OpenRaw(std::string_view header, std::string_view data) {
    WriteBytes(Path("bad.safetensors"), RawFile(header, data));
    return SafetensorsFile::Open(Path("bad.safetensors")).status();
  }

  std::string dir_;
};

TEST(DTypeTest, NamesSizesAndParsing) {
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    auto parsed = ParseDTypeName(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  ExpectError(ParseDTypeName("bf16").status(), absl::StatusCode::kInvalidArgument, {"\"bf16\""});
  ExpectError(ParseDTypeName("I32").status(), absl::StatusCode::kInvalidArgument, {"\"I32\""});
  EXPECT_EQ(*ParseDTypeName("I64"), DType::kI64);
  EXPECT_EQ(*ParseDTypeName("BOOL"), DType::kBool);
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_FALSE(IsFloat(DType::kI64));
  EXPECT_FALSE(IsFloat(DType::kBool));
  EXPECT_TRUE(IsFloat(DType::kBF16));
}

TEST(TensorViewTest, Numel) {
  TensorView v;
  EXPECT_EQ(v.numel(), 1);  // a scalar
  v.shape = {4, 8};
  EXPECT_EQ(v.numel(), 32);
  v.shape = {3, 0};
  EXPECT_EQ(v.numel(), 0);
}

TEST_F(SafetensorsTest, RoundTrip) {
  const auto w = Pattern(2 * 3 * 4, 1);
  const auto b = Pattern(5 * 2, 2);
  const auto h = Pattern(2, 3);
  std::vector<TensorToWrite> tensors = {
      {"model.layers.0.mlp.up_proj.weight", DType::kF32, {2, 3}, w},
      {"b.bias", DType::kBF16, {5}, b},
      {"scalar", DType::kF16, {}, h},
      {"empty", DType::kF32, {0, 7}, {}},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "tiny"}};
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"), tensors, metadata).ok());

  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), Path("m.safetensors"));
  EXPECT_EQ((*file)->metadata(), metadata);
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    SCOPED_TRACE(t.name);
    const TensorView* v = (*file)->Find(t.name);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->name, t.name);
    EXPECT_EQ(v->dtype, t.dtype);
    EXPECT_EQ(v->shape, t.shape);
    ASSERT_EQ(v->nbytes, t.bytes.size());
    EXPECT_EQ(static_cast<size_t>(v->numel()) * DTypeSize(v->dtype), v->nbytes);
    if (v->nbytes > 0) {
      EXPECT_EQ(std::memcmp(v->data, t.bytes.data(), v->nbytes), 0);
    }
  }
  EXPECT_EQ((*file)->Find("missing"), nullptr);
  // No temp file left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 1);
}

TEST_F(SafetensorsTest, WriterLayout) {
  const auto a = Pattern(4, 1);
  const auto z = Pattern(8, 2);
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"),
                               {{"z", DType::kF32, {2}, z}, {"a", DType::kF32, {1}, a}})
                  .ok());
  const std::string raw = ReadBytes(Path("m.safetensors"));
  ASSERT_GE(raw.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(raw.size(), 8 + n + 12);
  const std::string header = raw.substr(8, n);
  EXPECT_FALSE(absl::StrContains(header, "__metadata__")) << header;
  // Offsets follow name order: "a" first, then "z".
  EXPECT_TRUE(absl::StrContains(header, R"("a":{"data_offsets":[0,4])")) << header;
  EXPECT_TRUE(absl::StrContains(header, R"("z":{"data_offsets":[4,12])")) << header;
  EXPECT_EQ(std::memcmp(raw.data() + 8 + n, a.data(), 4), 0);
  EXPECT_EQ(std::memcmp(raw.data() + 8 + n + 4, z.data(), 8), 0);
}

TEST_F(SafetensorsTest, WriterReplacesExistingFile) {
  const auto a = Pattern(4, 1);
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"), {{"a", DType::kF32, {1}, a}}).ok());
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"), {{"b", DType::kF32, {1}, a}}).ok());
  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->Find("a"), nullptr);
  EXPECT_NE((*file)->Find("b"), nullptr);
}

TEST_F(SafetensorsTest, WriterNoTensors) {
  ASSERT_TRUE(WriteSafetensors(Path("m.safetensors"), {}).ok());
  auto file = SafetensorsFile::Open(Path("m.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  const auto four = Pattern(4, 0);
  ExpectError(WriteSafetensors(Path("m.safetensors"), {{"w", DType::kF32, {2}, four}}),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "4 bytes", "[2]", "needs 8"});
  ExpectError(WriteSafetensors(Path("m.safetensors"),
                               {{"w", DType::kF32, {1}, four}, {"w", DType::kF32, {1}, four}}),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "more than once"});
  ExpectError(WriteSafetensors(Path("m.safetensors"), {{"__metadata__", DType::kF32, {1}, four}}),
              absl::StatusCode::kInvalidArgument, {"__metadata__", "reserved"});
  ExpectError(WriteSafetensors(Path("m.safetensors"), {{"w", DType::kF32, {-1}, four}}),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "negative"});
  ExpectError(WriteSafetensors(Path("m.safetensors"), {{"w", DType::kF32, {1}, four}},
                               {{"bad", "\xff\xfe"}}),
              absl::StatusCode::kInvalidArgument, {"m.safetensors"});
  // Nothing was written, not even a temp file.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_), {}), 0);
}

TEST_F(SafetensorsTest, MissingFile) {
  ExpectError(SafetensorsFile::Open(Path("nope.safetensors")).status(), absl::StatusCode::kNotFound,
              {"nope.safetensors"});
}

TEST_F(SafetensorsTest, FileShorterThanHeaderLength) {
  WriteBytes(Path("short.safetensors"), "abc");
  ExpectError(SafetensorsFile::Open(Path("short.safetensors")).status(),
              absl::StatusCode::kDataLoss, {"short.safetensors", "3 bytes"});
  WriteBytes(Path("empty.safetensors"), "");
  ExpectError(SafetensorsFile::Open(Path("empty.safetensors")).status(),
              absl::StatusCode::kDataLoss, {"empty.safetensors", "0 bytes"});
}

TEST_F(SafetensorsTest, DataCutShort) {
  const std::string full =
      RawFile(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(16, 'x'));
  WriteBytes(Path("cut.safetensors"), full.substr(0, full.size() - 3));
  ExpectError(SafetensorsFile::Open(Path("cut.safetensors")).status(), absl::StatusCode::kDataLoss,
              {"cut.safetensors", "\"w\"", "[0, 16)", "past the end", "13 bytes"});
}

TEST_F(SafetensorsTest, HeaderLengthPastEnd) {
  std::string raw = RawFile(R"({})", "");
  raw[0] = 100;  // claims a 100-byte header in a 10-byte file
  WriteBytes(Path("bad.safetensors"), raw);
  ExpectError(SafetensorsFile::Open(Path("bad.safetensors")).status(), absl::StatusCode::kDataLoss,
              {"bad.safetensors", "header length 100", "past the end"});
}

TEST_F(SafetensorsTest, HeaderLengthOverBound) {
  std::string raw = RawFile(R"({})", "");
  const uint64_t n = SafetensorsFile::kMaxHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) raw[i] = static_cast<char>(n >> (8 * i));
  WriteBytes(Path("bad.safetensors"), raw);
  ExpectError(SafetensorsFile::Open(Path("bad.safetensors")).status(),
              absl::StatusCode::kInvalidArgument, {"bad.safetensors", "exceeds the limit"});
}

TEST_F(SafetensorsTest, BadJson) {
  ExpectError(OpenRaw(R"({"w": {"dtype": )", ""), absl::StatusCode::kInvalidArgument,
              {"bad.safetensors", "not valid JSON"});
  ExpectError(OpenRaw("{\"\xff\": 1}", ""), absl::StatusCode::kInvalidArgument, {"not valid JSON"});
}

TEST_F(SafetensorsTest, JsonNotAnObject) {
  ExpectError(OpenRaw(R"([1, 2])", ""), absl::StatusCode::kInvalidArgument,
              {"bad.safetensors", "array", "not an object"});
  ExpectError(OpenRaw(R"({"w": [1]})", ""), absl::StatusCode::kInvalidArgument,
              {"\"w\"", "not an object"});
}

TEST_F(SafetensorsTest, UnknownDtype) {
  ExpectError(OpenRaw(R"({"ids":{"dtype":"U32","shape":[1],"data_offsets":[0,4]}})", "1234"),
              absl::StatusCode::kInvalidArgument, {"bad.safetensors", "\"ids\"", "\"U32\""});
  ExpectError(OpenRaw(R"({"q":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", "1"),
              absl::StatusCode::kInvalidArgument, {"\"q\"", "\"F8_E4M3\""});
  ExpectError(OpenRaw(R"({"q":{"shape":[1],"data_offsets":[0,1]}})", "1"),
              absl::StatusCode::kInvalidArgument, {"\"q\"", "dtype"});
}

TEST_F(SafetensorsTest, ShapeByteMismatch) {
  ExpectError(
      OpenRaw(
          R"({"model.layers.0.mlp.up_proj.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[0,100]}})",
          std::string(100, 'x')),
      absl::StatusCode::kInvalidArgument,
      {"bad.safetensors: tensor \"model.layers.0.mlp.up_proj.weight\": data_offsets [0, 100) hold "
       "100 bytes but shape [4, 8] of F32 needs 128"});
}

TEST_F(SafetensorsTest, NumelOverflow) {
  ExpectError(
      OpenRaw(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
      absl::StatusCode::kInvalidArgument, {"\"w\"", "overflows"});
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", "12345678"),
              absl::StatusCode::kDataLoss, {"\"w\"", "[8, 12)", "past the end", "8 bytes"});
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "1234"),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "data_offsets [-4,0]"});
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  ExpectError(OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      std::string(12, 'x')),
              absl::StatusCode::kInvalidArgument, {"bad.safetensors", "\"a\"", "\"b\"", "overlap"});
  // Two tensors sharing the same bytes.
  ExpectError(OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                      std::string(4, 'x')),
              absl::StatusCode::kInvalidArgument, {"\"a\"", "\"b\"", "overlap"});
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  ExpectError(OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                      std::string(12, 'x')),
              absl::StatusCode::kInvalidArgument,
              {"bad.safetensors", "gap of 4 bytes", "\"a\"", "\"b\""});
  ExpectError(
      OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 'x')),
      absl::StatusCode::kInvalidArgument, {"\"a\"", "starts at 4", "gap"});
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
  ExpectError(
      OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(8, 'x')),
      absl::StatusCode::kInvalidArgument, {"\"w\"", "[8, 4)", "begin after end"});
}

TEST_F(SafetensorsTest, MalformedDataOffsets) {
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1]}})", "1234"),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "missing \"data_offsets\""});
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "1234"),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "data_offsets [0]"});
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", "1234"),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "data_offsets"});
}

TEST_F(SafetensorsTest, MalformedShape) {
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[-1,4],"data_offsets":[0,0]}})", ""),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "negative dimension -1"});
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,0]}})", ""),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "non-integer dimension 1.5"});
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})", ""),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "shape"});
}

TEST_F(SafetensorsTest, MalformedMetadata) {
  ExpectError(OpenRaw(R"({"__metadata__":{"format":1}})", ""), absl::StatusCode::kInvalidArgument,
              {"__metadata__", "\"format\"", "not a string"});
  ExpectError(OpenRaw(R"({"__metadata__":"pt"})", ""), absl::StatusCode::kInvalidArgument,
              {"__metadata__", "not an object"});
}

TEST_F(SafetensorsTest, RepeatedTensorName) {
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      std::string(8, 'x')),
              absl::StatusCode::kInvalidArgument, {"\"w\"", "more than once"});
}

// What other writers produce and we must accept: an unpadded header, trailing bytes after the
// last tensor, zero-element tensors between others, unknown extra keys, null metadata.
TEST_F(SafetensorsTest, AcceptsLenientLayouts) {
  auto s = OpenRaw(R"({"__metadata__":null,"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                   R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4],"extra":true},)"
                   R"("f":{"dtype":"F16","shape":[1,1],"data_offsets":[4,6]}})",
                   "abcdefTRAILING");
  ASSERT_TRUE(s.ok()) << s;
  auto file = SafetensorsFile::Open(Path("bad.safetensors"));
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->metadata().empty());
  ASSERT_EQ((*file)->tensors().size(), 3u);
  const TensorView* f = (*file)->Find("f");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data), f->nbytes), "ef");
  EXPECT_EQ((*file)->Find("e")->nbytes, 0u);
}

}  // namespace
}  // namespace specwire
