#include "common/rpc/payload_frame.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "proto/specwire/v1/extractor.pb.h"

namespace specwire {
namespace {

using v1::ExtractResponse;
using v1::HiddenStateChunk;

// A chunk with random header fields (some left at their defaults) and `n` random data bytes.
HiddenStateChunk RandomChunk(std::mt19937_64& rng, size_t n) {
  HiddenStateChunk c;
  auto maybe = [&] { return rng() % 4 != 0; };
  if (maybe()) c.set_sequence_index(static_cast<uint32_t>(rng() % 300));
  if (maybe()) c.mutable_state()->set_layer_id(static_cast<int32_t>(rng() % 80) - 2);
  if (maybe()) c.mutable_state()->set_tap(static_cast<v1::Tap>(rng() % 3));
  if (maybe()) c.set_hf_hidden_states_index(static_cast<int32_t>(rng() % 90));
  if (maybe()) c.set_token_start(static_cast<uint32_t>(rng()));
  if (maybe()) c.set_token_count(static_cast<uint32_t>(rng() % 5000));
  if (maybe()) c.set_sequence_length(static_cast<uint32_t>(rng()));
  if (maybe()) c.set_hidden_size(static_cast<uint32_t>(rng() % 20000));
  if (maybe()) c.set_dtype(static_cast<v1::WireDType>(rng() % 3));
  if (maybe()) c.set_crc32c(static_cast<uint32_t>(rng()));
  std::string data(n, '\0');
  for (char& b : data) b = static_cast<char>(rng());
  c.set_data(data);
  return c;
}

std::string Flatten(const grpc::ByteBuffer& bb) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bb.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// `bytes` cut into random slices (some empty), as gRPC's receive buffers might hold them.
std::vector<grpc::Slice> RandomSlices(std::mt19937_64& rng, const std::string& bytes) {
  std::vector<grpc::Slice> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t k = std::min<size_t>(bytes.size() - at, rng() % 3 == 0 ? rng() % 4 : rng() % 9000);
    out.emplace_back(bytes.data() + at, k);
    at += k;
  }
  if (rng() % 2) out.emplace_back(bytes.data(), 0);
  return out;
}

std::string Joined(const std::vector<std::span<const std::byte>>& pieces) {
  std::string out;
  for (auto p : pieces) out.append(reinterpret_cast<const char*>(p.data()), p.size());
  return out;
}

bool Same(const google::protobuf::Message& a, const google::protobuf::Message& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

TEST(PayloadFrame, ProtobufReadsTheFrameAsTheMessageItDescribes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    const size_t n = i % 10 == 0 ? 0 : rng() % (i % 7 == 0 ? 300000 : 3000);
    const HiddenStateChunk full = RandomChunk(rng, n);
    HiddenStateChunk head = full;
    head.clear_data();
    auto owner = std::make_shared<std::string>(full.data());
    const grpc::ByteBuffer bb = FrameWithPayload(
        ExtractResponse::kChunkFieldNumber, head, HiddenStateChunk::kDataFieldNumber,
        {std::span(reinterpret_cast<const std::byte*>(owner->data()), owner->size()), owner});
    ExtractResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(bb))) << i;
    ExtractResponse want;
    *want.mutable_chunk() = full;
    EXPECT_TRUE(Same(parsed, want)) << i;
    EXPECT_EQ(bb.Length(), want.ByteSizeLong()) << i;
  }
}

TEST(PayloadFrame, TheBytesOutliveTheirOwnerOnlyThroughTheFrame) {
  auto owner = std::make_shared<std::string>(1000, 'x');
  std::weak_ptr<std::string> watch = owner;
  {
    HiddenStateChunk head;
    head.set_token_count(3);
    grpc::ByteBuffer bb = FrameWithPayload(
        3, head, 9, {std::span(reinterpret_cast<const std::byte*>(owner->data()), 1000), owner});
    owner.reset();
    EXPECT_FALSE(watch.expired());  // the frame's slice still holds it
    EXPECT_EQ(Flatten(bb).substr(Flatten(bb).size() - 1000), std::string(1000, 'x'));
  }
  EXPECT_TRUE(watch.expired());
}

TEST(PayloadFrame, SplitGivesTheHeaderAndViewsOfTheBytesHoweverSliced) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 400; ++i) {
    const HiddenStateChunk full = RandomChunk(rng, i % 9 == 0 ? 0 : rng() % 40000);
    ExtractResponse m;
    *m.mutable_chunk() = full;
    // Both encodings: protobuf's own (data before crc32c) and the zero-copy frame (data last).
    std::string bytes;
    if (i % 2) {
      bytes = m.SerializeAsString();
    } else {
      HiddenStateChunk head = full;
      head.clear_data();
      auto owner = std::make_shared<std::string>(full.data());
      bytes = Flatten(FrameWithPayload(
          3, head, 9,
          {std::span(reinterpret_cast<const std::byte*>(owner->data()), owner->size()), owner}));
    }
    const std::vector<grpc::Slice> slices = RandomSlices(rng, bytes);
    HiddenStateChunk got;
    std::vector<std::span<const std::byte>> pieces;
    absl::StatusOr<bool> split = SplitPayloadFrame(slices, 3, 9, &got, &pieces);
    ASSERT_TRUE(split.ok()) << split.status();
    ASSERT_TRUE(*split) << i;
    EXPECT_EQ(Joined(pieces), full.data()) << i;
    HiddenStateChunk head = full;
    head.clear_data();
    EXPECT_TRUE(Same(got, head)) << i;
  }
}

TEST(PayloadFrame, OtherMessagesAreLeftToTheCaller) {
  std::mt19937_64 rng(3);
  ExtractResponse contract;
  contract.mutable_contract()->set_architecture("Qwen3ForCausalLM");
  ExtractResponse trailer;
  trailer.mutable_trailer()->set_request_id("r");
  ExtractResponse empty;
  // A chunk followed by another field: not the single-field shape.
  ExtractResponse chunk;
  *chunk.mutable_chunk() = RandomChunk(rng, 100);
  const std::string two = chunk.SerializeAsString() + trailer.SerializeAsString();
  for (const std::string& bytes : {contract.SerializeAsString(), trailer.SerializeAsString(),
                                   empty.SerializeAsString(), two}) {
    HiddenStateChunk got;
    std::vector<std::span<const std::byte>> pieces;
    const std::vector<grpc::Slice> slices = RandomSlices(rng, bytes);
    absl::StatusOr<bool> split = SplitPayloadFrame(slices, 3, 9, &got, &pieces);
    ASSERT_TRUE(split.ok());
    EXPECT_FALSE(*split);
  }
}

TEST(PayloadFrame, RepeatedBytesFieldKeepsTheLastAsProtobufDoes) {
  HiddenStateChunk a, b;
  a.set_data("first");
  a.set_token_count(2);
  b.set_data("second");
  const std::string inner = a.SerializeAsString() + b.SerializeAsString();
  std::string bytes = "\x1a";
  bytes.push_back(static_cast<char>(inner.size()));
  bytes += inner;
  ExtractResponse want;
  ASSERT_TRUE(want.ParseFromString(bytes));
  std::vector<grpc::Slice> slices{grpc::Slice(bytes)};
  HiddenStateChunk got;
  std::vector<std::span<const std::byte>> pieces;
  ASSERT_TRUE(*SplitPayloadFrame(slices, 3, 9, &got, &pieces));
  EXPECT_EQ(Joined(pieces), want.chunk().data());
  EXPECT_EQ(got.token_count(), 2u);
}

TEST(PayloadFrame, TruncatedOrCorruptFramesAreDataLossNeverACrash) {
  std::mt19937_64 rng(5);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    ExtractResponse m;
    *m.mutable_chunk() = RandomChunk(rng, rng() % 600);
    std::string bytes = m.SerializeAsString();
    if (i % 2) {
      bytes.resize(rng() % (bytes.size() + 1));
    } else {
      for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    HiddenStateChunk got;
    std::vector<std::span<const std::byte>> pieces;
    const std::vector<grpc::Slice> slices = RandomSlices(rng, bytes);  // the views' backing
    absl::StatusOr<bool> split = SplitPayloadFrame(slices, 3, 9, &got, &pieces);
    if (!split.ok()) {
      EXPECT_EQ(split.status().code(), absl::StatusCode::kDataLoss);
      ++refused;
    } else if (*split) {
      // Accepted: then protobuf reads the same bytes as the same message.
      ExtractResponse whole;
      ASSERT_TRUE(whole.ParseFromString(bytes)) << i;
      HiddenStateChunk head = whole.chunk();
      head.clear_data();
      EXPECT_TRUE(Same(got, head)) << i;
      EXPECT_EQ(Joined(pieces), whole.chunk().data()) << i;
    }
  }
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace specwire
