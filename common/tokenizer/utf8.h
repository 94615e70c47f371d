// UTF-8 helpers of the tokenizer: validation, Rust's lossy decoding, code point stepping, Unicode
// White_Space, and NFC as `tokenizers` computes it (tokenizers/src/normalizers/unicode.rs, through
// the crate unicode-normalization-alignments), which is utf8proc's adjusted to older Unicode data.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire::tokenizer_internal {

// Byte offset of the first ill-formed sequence, or npos.
size_t FindInvalidUtf8(absl::string_view s);

// Rust's String::from_utf8_lossy: every maximal ill-formed subpart becomes U+FFFD.
std::string Utf8Lossy(absl::string_view s);

// Decodes the code point at s[*pos] of well-formed UTF-8 and advances *pos.
char32_t NextCodePoint(absl::string_view s, size_t* pos);

// Decodes the code point that ends at s[end] (exclusive) and returns its start.
size_t PrevCodePointStart(absl::string_view s, size_t end);

void AppendUtf8(char32_t cp, std::string* out);

// Unicode White_Space: Rust's `char::is_whitespace` and regex `\s`, Oniguruma's Unicode `\s`.
bool IsWhiteSpace(char32_t c);

// NFC as `tokenizers` computes it. Error: INTERNAL if utf8proc fails.
absl::StatusOr<std::string> Nfc(absl::string_view s);

}  // namespace specwire::tokenizer_internal
