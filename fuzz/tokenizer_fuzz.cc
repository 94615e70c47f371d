// The tokenizer on arbitrary bytes, with two fixed tokenizer.json files (fuzz/data):
//   llama3_style: no normalizer, so Decode(Encode(text)) == text for every valid UTF-8 text;
//   qwen_style:   NFC, so the round trip is exact for ASCII and a fixed point after one pass.
// Invalid UTF-8 must be refused with INVALID_ARGUMENT; every id must decode; ids anywhere in
// int64 must be refused by Decode (naming the index), never read out of bounds.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "fuzz/fuzz_check.h"

namespace specwire {
namespace {

std::unique_ptr<Tokenizer> Load(const char* name) {
  auto t = Tokenizer::FromJson(fuzz::ReadFileOrDie(fuzz::DataPath(name)));
  FUZZ_CHECK(t.ok(), "%s: %s", name, std::string(t.status().message()).c_str());
  return *std::move(t);
}

bool IsAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

std::string Decoded(const Tokenizer& t, const std::vector<int64_t>& ids, bool skip_special) {
  auto text = t.Decode(ids, skip_special);
  FUZZ_CHECK(text.ok(), "ids from Encode do not decode: %s",
             std::string(text.status().message()).c_str());
  return *text;
}

}  // namespace
}  // namespace specwire

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  static const std::unique_ptr<Tokenizer> llama = Load("llama3_style.json");
  static const std::unique_ptr<Tokenizer> qwen = Load("qwen_style.json");
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& t = (mode & 1) ? *qwen : *llama;
  const bool exact = !(mode & 1);

  if (mode & 2) {
    // The bytes as little-endian ids: Decode accepts exactly the ids below vocab_size() that name
    // a token, and says which index is bad otherwise.
    std::vector<int64_t> ids;
    for (size_t i = 1; i + 8 <= size && ids.size() < 512; i += 8) {
      uint64_t v = 0;
      for (int k = 7; k >= 0; --k) v = (v << 8) | data[i + k];
      // Mostly small ids (real tokens), sometimes anything.
      ids.push_back((mode & 4) ? static_cast<int64_t>(v)
                               : static_cast<int64_t>(v % (t.vocab_size() + 8)));
    }
    bool all_known = true;
    for (int64_t id : ids) all_known = all_known && t.id_to_token(id).has_value();
    auto decoded = t.Decode(ids, mode & 8);
    FUZZ_CHECK(decoded.ok() == all_known, "Decode %s ids %s known",
               decoded.ok() ? "accepted" : "refused", all_known ? "all" : "not all");
    if (!decoded.ok()) {
      FUZZ_CHECK(decoded.status().code() == absl::StatusCode::kInvalidArgument, "Decode code");
    }
    return 0;
  }

  auto ids = t.Encode(text, /*add_special_tokens=*/false);
  if (!ids.ok()) {
    fuzz::CheckError(ids.status());
    // Only invalid UTF-8 (or an exhausted regex engine) may fail.
    FUZZ_CHECK(ids.status().code() == absl::StatusCode::kInvalidArgument ||
                   ids.status().code() == absl::StatusCode::kResourceExhausted,
               "Encode: %s", std::string(ids.status().message()).c_str());
    auto pre = t.PreTokenize(text);
    FUZZ_CHECK(!pre.ok(), "PreTokenize accepts what Encode refuses");
    return 0;
  }
  for (int64_t id : *ids) {
    FUZZ_CHECK(id >= 0 && id < t.vocab_size(), "id %lld outside the vocabulary",
               static_cast<long long>(id));
  }
  FUZZ_CHECK(!ids->empty() || text.empty(), "non-empty text encoded to nothing");
  const std::string back = Decoded(t, *ids, /*skip_special=*/false);
  if (exact || IsAscii(text)) {
    FUZZ_CHECK(back == text, "round trip changed the text (%zu -> %zu bytes)", text.size(),
               back.size());
  } else {
    auto again = t.Encode(back, false);
    FUZZ_CHECK(again.ok(), "decoded text does not encode: %s",
               std::string(again.status().message()).c_str());
    FUZZ_CHECK(Decoded(t, *again, false) == back, "the round trip is not a fixed point");
  }
  // The template adds tokens around the same ids.
  auto with_special = t.Encode(text, /*add_special_tokens=*/true);
  FUZZ_CHECK(with_special.ok(), "add_special_tokens changed the outcome");
  FUZZ_CHECK(with_special->size() >= ids->size(), "the template dropped ids");
  FUZZ_CHECK(std::equal(ids->begin(), ids->end(),
                        with_special->end() - static_cast<std::ptrdiff_t>(ids->size())),
             "the template changed the text's ids");
  return 0;
}
