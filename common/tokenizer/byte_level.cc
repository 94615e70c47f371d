// The byte-level alphabet and decoder (tokenizers/src/pre_tokenizers/byte_level.rs).
#include "common/tokenizer/byte_level.h"

#include "common/tokenizer/utf8.h"

namespace specwire::tokenizer_internal {

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_char.fill(-1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    char_of_byte[b] = printable ? b : 0x100 + n++;
    AppendUtf8(char_of_byte[b], &utf8_of_byte[b]);
    byte_of_char[char_of_byte[b]] = static_cast<int16_t>(b);
  }
}

std::string ByteLevelAlphabet::Encode(absl::string_view bytes) const {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += utf8_of_byte[static_cast<unsigned char>(c)];
  return out;
}

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

std::string DecodeByteLevel(const std::vector<std::string>& tokens) {
  const ByteLevelAlphabet& alphabet = Alphabet();
  std::string bytes;
  for (const std::string& token : tokens) {
    const size_t begin = bytes.size();
    bool all_mapped = true;
    for (size_t p = 0; p < token.size();) {
      const char32_t c = NextCodePoint(token, &p);
      if (c >= alphabet.byte_of_char.size() || alphabet.byte_of_char[c] < 0) {
        all_mapped = false;
        break;
      }
      bytes += static_cast<char>(alphabet.byte_of_char[c]);
    }
    if (!all_mapped) {
      bytes.resize(begin);
      bytes += token;
    }
  }
  return Utf8Lossy(bytes);
}

}  // namespace specwire::tokenizer_internal
