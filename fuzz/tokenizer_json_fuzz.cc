// tokenizer.json loading on arbitrary documents: FromJson refuses with INVALID_ARGUMENT or gives
// a tokenizer that encodes and decodes without crashing, whose ids all decode.
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  const std::string doc(reinterpret_cast<const char*>(data), size);
  auto t = Tokenizer::FromJson(doc);
  if (!t.ok()) {
    fuzz::CheckError(t.status());
    FUZZ_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument, "FromJson code %d: %s",
               static_cast<int>(t.status().code()), std::string(t.status().message()).c_str());
    return 0;
  }
  const Tokenizer& tok = **t;
  for (const AddedToken& a : tok.added_tokens()) {
    FUZZ_CHECK(a.id >= 0 && a.id < tok.vocab_size(), "added token id %lld",
               static_cast<long long>(a.id));
    FUZZ_CHECK(tok.id_to_token(a.id).has_value(), "added token without a token");
  }
  static const char* const kTexts[] = {
      "Hello world's 12345 test\n\n  x",
      "<|im_start|>user\nHi<|im_end|>",
      "\xC3\xA9t\xC3\xA9 e\xCC\x81 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80",
      "",
      "    \t\r\n",
  };
  for (const char* text : kTexts) {
    for (bool special : {false, true}) {
      auto ids = tok.Encode(text, special);
      if (!ids.ok()) {
        FUZZ_CHECK(ids.status().code() == absl::StatusCode::kResourceExhausted,
                   "Encode of valid UTF-8 failed: %s", std::string(ids.status().message()).c_str());
        continue;
      }
      // Ids of the text name tokens. A post-processor template's ids are taken as written (as
      // `tokenizers` does), so with add_special_tokens they may name nothing; Decode must then
      // refuse them, and accept them otherwise.
      bool all_known = true;
      for (int64_t id : *ids) {
        const bool known = tok.id_to_token(id).has_value();
        FUZZ_CHECK(known || special, "Encode gave id %lld without a token",
                   static_cast<long long>(id));
        all_known = all_known && known;
      }
      auto text_back = tok.Decode(*ids, special);
      FUZZ_CHECK(text_back.ok() == all_known, "Decode of Encode's ids: %s",
                 std::string(text_back.status().message()).c_str());
    }
  }
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < std::min<int64_t>(tok.vocab_size(), 2048); ++id) {
    if (tok.id_to_token(id)) ids.push_back(id);
  }
  auto all = tok.Decode(ids, false);
  FUZZ_CHECK(all.ok(), "Decode of known ids failed: %s",
             std::string(all.status().message()).c_str());
  return 0;
}
