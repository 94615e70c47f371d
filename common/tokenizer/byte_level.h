// The byte-level alphabet of GPT-2 (bytes_to_unicode), the regex ByteLevel splits with and the
// ByteLevel decoder: tokenizers/src/pre_tokenizers/byte_level.rs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace specwire::tokenizer_internal {

// Every byte is shown as one printable character: printable Latin-1 bytes as themselves, the
// other 68 as U+0100 + n in byte order. Vocabulary strings are written in these characters.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;  // char_of_byte as UTF-8
  std::array<int16_t, 0x144> byte_of_char{};  // -1 where the character is not in the alphabet

  ByteLevelAlphabet();
  std::string Encode(absl::string_view bytes) const;
};

// The one alphabet, built on first use and never freed.
const ByteLevelAlphabet& Alphabet();

// The GPT-2 regex that ByteLevel(use_regex=true) splits with.
inline constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The ByteLevel decoder: a token made only of alphabet characters becomes its bytes, any other
// token (e.g. an added token with a space) its own UTF-8; then lossy UTF-8 of the whole.
std::string DecodeByteLevel(const std::vector<std::string>& tokens);

}  // namespace specwire::tokenizer_internal
