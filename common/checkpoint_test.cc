#include "common/checkpoint.h"

#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
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

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/checkpoint_test.XXXXXX";
    ASSERT_NE(::mkdtemp(dir_.data()), nullptr) << dir_;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(std::string_view name) const { return dir_ + "/" + std::string(name); }

  void WriteText(std::string_view name, std::string_view text) {
    std::ofstream out(Path(name), std::ios::binary | std::ios::trunc);
    out << text;
    ASSERT_TRUE(out.good());
  }

  // A shard holding one F32 tensor of `n` elements per name, each filled with a distinct byte.
  void WriteShard(std::string_view file, std::initializer_list<std::string_view> names,
                  int64_t n = 2) {
    std::vector<std::vector<std::byte>> storage;
    std::vector<TensorToWrite> tensors;
    for (std::string_view name : names) {
      storage.emplace_back(n * 4, static_cast<std::byte>(storage.size() + 1));
      tensors.push_back({std::string(name), DType::kF32, {n}, storage.back()});
    }
    // `storage` may reallocate while filling; point the spans at the final buffers.
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].bytes = storage[i];
    ASSERT_TRUE(WriteSafetensors(Path(file), tensors).ok());
  }

  std::string dir_;
};

TEST_F(CheckpointTest, SingleFile) {
  WriteShard("model.safetensors", {"a", "b"}, 3);
  WriteShard("other.safetensors", {"c"});  // ignored: model.safetensors takes precedence
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->dir(), dir_);
  EXPECT_EQ((*ckpt)->shards().size(), 1u);
  ASSERT_EQ((*ckpt)->tensors().size(), 2u);
  EXPECT_EQ((*ckpt)->total_bytes(), 2u * 3 * 4);
  ASSERT_NE((*ckpt)->Find("b"), nullptr);
  EXPECT_EQ((*ckpt)->Find("b")->shape, std::vector<int64_t>({3}));
  EXPECT_EQ((*ckpt)->Find("c"), nullptr);
}

TEST_F(CheckpointTest, SingleFileWithOtherName) {
  WriteShard("weights.safetensors", {"a"});
  WriteText("config.json", "{}");
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_NE((*ckpt)->Find("a"), nullptr);
}

TEST_F(CheckpointTest, Sharded) {
  WriteShard("model-00001-of-00002.safetensors", {"embed", "layer.0"});
  WriteShard("model-00002-of-00002.safetensors", {"layer.1", "norm"}, 5);
  WriteText("model.safetensors.index.json", R"({
    "metadata": {"total_size": 56},
    "weight_map": {
      "embed": "model-00001-of-00002.safetensors",
      "layer.0": "model-00001-of-00002.safetensors",
      "layer.1": "model-00002-of-00002.safetensors",
      "norm": "model-00002-of-00002.safetensors"
    }})");
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->shards().size(), 2u);
  ASSERT_EQ((*ckpt)->tensors().size(), 4u);
  EXPECT_EQ((*ckpt)->total_bytes(), 2u * 2 * 4 + 2u * 5 * 4);
  const TensorView* norm = (*ckpt)->Find("norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->nbytes, 20u);
  // The view points into the second shard's mapping.
  EXPECT_EQ(norm, (*ckpt)->shards()[1]->Find("norm"));
  EXPECT_EQ(norm->data[0], std::byte{2});
}

TEST_F(CheckpointTest, IndexNamesMissingShard) {
  WriteShard("model-00001-of-00002.safetensors", {"a"});
  WriteText("model.safetensors.index.json", R"({"weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kNotFound,
              {"model.safetensors.index.json", "model-00002-of-00002.safetensors"});
}

TEST_F(CheckpointTest, IndexNamesTensorShardLacks) {
  WriteShard("s1.safetensors", {"a"});
  WriteText("model.safetensors.index.json",
            R"({"weight_map": {"a": "s1.safetensors", "ghost": "s1.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"ghost\"", "\"s1.safetensors\"", "does not hold"});
}

TEST_F(CheckpointTest, IndexPutsTensorInWrongShard) {
  WriteShard("s1.safetensors", {"a"});
  WriteShard("s2.safetensors", {"b"});
  WriteText("model.safetensors.index.json",
            R"({"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"a\"", "listed in shard \"s2.safetensors\"", "is in shard \"s1.safetensors\""});
}

TEST_F(CheckpointTest, ShardHoldsUnlistedTensor) {
  WriteShard("s1.safetensors", {"a", "stray"});
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"s1.safetensors\"", "\"stray\"", "does not list"});
}

TEST_F(CheckpointTest, TensorDuplicatedAcrossShards) {
  WriteShard("s1.safetensors", {"a", "dup"});
  WriteShard("s2.safetensors", {"b", "dup"});
  WriteText("model.safetensors.index.json", R"({"weight_map": {
      "a": "s1.safetensors", "b": "s2.safetensors", "dup": "s1.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"dup\"", "\"s1.safetensors\"", "\"s2.safetensors\""});
}

TEST_F(CheckpointTest, CorruptShardErrorNamesShard) {
  WriteText("s1.safetensors", "xyz");
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": "s1.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kDataLoss,
              {"shard \"s1.safetensors\"", "3 bytes"});
}

TEST_F(CheckpointTest, MalformedIndex) {
  WriteShard("s1.safetensors", {"a"});
  WriteText("model.safetensors.index.json", R"({"weight_map": )");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"model.safetensors.index.json", "not valid JSON"});
  WriteText("model.safetensors.index.json", R"({"metadata": {}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument, {"weight_map"});
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"a\"", "not a file"});
  WriteText("model.safetensors.index.json", R"({"weight_map": {"a": "../s1.safetensors"}})");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kInvalidArgument,
              {"\"a\"", "../s1.safetensors"});
}

TEST_F(CheckpointTest, NoSafetensors) {
  WriteText("config.json", "{}");
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kNotFound,
              {dir_, "*.safetensors"});
}

TEST_F(CheckpointTest, SeveralSafetensorsWithoutIndex) {
  WriteShard("x.safetensors", {"a"});
  WriteShard("y.safetensors", {"b"});
  ExpectError(Checkpoint::Open(dir_).status(), absl::StatusCode::kNotFound,
              {dir_, "x.safetensors, y.safetensors"});
}

TEST_F(CheckpointTest, MissingDirectory) {
  ExpectError(Checkpoint::Open(Path("absent")).status(), absl::StatusCode::kNotFound,
              {Path("absent")});
}

TEST_F(CheckpointTest, ReadFileToString) {
  const std::string text("{\"a\": 1}\n\0tail", 14);
  WriteText("config.json", text);
  auto read = ReadFileToString(Path("config.json"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, text);
  ExpectError(ReadFileToString(Path("nope.json")).status(), absl::StatusCode::kNotFound,
              {Path("nope.json")});
}

}  // namespace
}  // namespace specwire
