#include "common/rpc/payload_frame.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace specwire {
namespace {

constexpr int kLengthDelimited = 2;

// Reads through a frame's slices, optionally appending what it reads to `record`.
class Cursor {
 public:
  explicit Cursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) left_ += s.size();
  }
  size_t left() const { return left_; }
  std::string* record = nullptr;

  bool Byte(uint8_t* b) {
    if (left_ == 0) return false;
    Settle();
    *b = slices_[slice_].begin()[offset_++];
    --left_;
    if (record != nullptr) record->push_back(static_cast<char>(*b));
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Advances `n` bytes; their views go to `views` when given (they may span slices).
  bool Take(uint64_t n, std::vector<std::span<const std::byte>>* views) {
    if (n > left_) return false;
    left_ -= n;
    while (n > 0) {
      Settle();
      const grpc::Slice& s = slices_[slice_];
      const size_t k = std::min<uint64_t>(n, s.size() - offset_);
      const auto* p = reinterpret_cast<const std::byte*>(s.begin()) + offset_;
      if (views != nullptr) views->emplace_back(p, k);
      if (record != nullptr) record->append(reinterpret_cast<const char*>(p), k);
      offset_ += k;
      n -= k;
    }
    return true;
  }

 private:
  // Moves past exhausted slices (there are bytes left).
  void Settle() {
    while (offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
    }
  }
  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
  size_t left_ = 0;
};

absl::Status Malformed(const char* what) {
  return absl::DataLossError(std::string("stream: malformed message (") + what + ")");
}

}  // namespace

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

grpc::ByteBuffer FrameWithPayload(int field, const google::protobuf::MessageLite& sub,
                                  int bytes_field, Payload payload) {
  std::string head;
  const size_t n = payload.bytes.size();
  std::string bytes_head;  // empty bytes are left out, as protobuf leaves them out
  if (n > 0) {
    AppendVarint(static_cast<uint64_t>(bytes_field) << 3 | kLengthDelimited, &bytes_head);
    AppendVarint(n, &bytes_head);
  }
  const size_t sub_size = sub.ByteSizeLong();
  AppendVarint(static_cast<uint64_t>(field) << 3 | kLengthDelimited, &head);
  AppendVarint(sub_size + bytes_head.size() + n, &head);
  sub.AppendToString(&head);
  head += bytes_head;
  if (n == 0) {
    grpc::Slice only(head);
    return grpc::ByteBuffer(&only, 1);
  }
  // The payload slice holds a reference to its owner until gRPC drops the slice.
  auto* keep = new std::shared_ptr<const void>(std::move(payload.owner));
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(const_cast<std::byte*>(payload.bytes.data()), n,
                  [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); }, keep)};
  return grpc::ByteBuffer(slices, 2);
}

absl::StatusOr<bool> SplitPayloadFrame(const std::vector<grpc::Slice>& slices, int field,
                                       int bytes_field, google::protobuf::MessageLite* sub,
                                       std::vector<std::span<const std::byte>>* pieces) {
  Cursor c(slices);
  uint64_t tag, len;
  if (!c.Varint(&tag) || tag != (static_cast<uint64_t>(field) << 3 | kLengthDelimited)) {
    return false;
  }
  if (!c.Varint(&len) || len != c.left()) return false;  // not the whole message: parse it whole
  std::string rest;  // every field of the submessage but the bytes
  pieces->clear();
  while (c.left() > 0) {
    std::string tag_bytes;
    c.record = &tag_bytes;
    if (!c.Varint(&tag) || tag > 0xffffffffu || (tag >> 3) == 0) return Malformed("field tag");
    c.record = nullptr;
    const uint64_t number = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (number == static_cast<uint64_t>(bytes_field) && wire_type == kLengthDelimited) {
      pieces->clear();  // a repeated occurrence replaces the earlier one
      if (!c.Varint(&len) || !c.Take(len, pieces)) return Malformed("payload length");
      continue;
    }
    rest += tag_bytes;
    c.record = &rest;
    bool ok = false;
    switch (wire_type) {
      case 0:
        ok = c.Varint(&len);
        break;
      case 1:
        ok = c.Take(8, nullptr);
        break;
      case 2:
        ok = c.Varint(&len) && c.Take(len, nullptr);
        break;
      case 5:
        ok = c.Take(4, nullptr);
        break;
      default:  // groups: not in these messages
        return Malformed("wire type");
    }
    c.record = nullptr;
    if (!ok) return Malformed("field value");
  }
  if (!sub->ParseFromString(rest)) return Malformed("chunk fields");
  return true;
}

}  // namespace specwire
