// UTF-8 helpers and NFC as `tokenizers` computes it (tokenizers/src/normalizers/unicode.rs).
#include "common/tokenizer/utf8.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specwire::tokenizer_internal {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i], or 0 when it is ill-formed; then
// *bad_len is the length of its maximal ill-formed prefix (Unicode 15 §3.9 "maximal subpart"),
// which Rust's String::from_utf8_lossy replaces by one U+FFFD.
int Utf8SequenceAt(absl::string_view s, size_t i, int* bad_len) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
    need = 2;
  } else if (b == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (b == 0xF0) {
    need = 3, lo = 0x90;
  } else if (b >= 0xF1 && b <= 0xF3) {
    need = 3;
  } else if (b == 0xF4) {
    need = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad_len = 1;
    return 0;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *bad_len = k;
      return 0;
    }
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) {
      *bad_len = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

size_t FindInvalidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int bad = 0;
    const int n = Utf8SequenceAt(s, i, &bad);
    if (n == 0) return i;
    i += n;
  }
  return absl::string_view::npos;
}

std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int bad = 0;
    const int n = Utf8SequenceAt(s, i, &bad);
    if (n > 0) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad;
    }
  }
  return out;
}

char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto b = static_cast<unsigned char>(s[*pos]);
  const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  *pos += n;
  return cp;
}

size_t PrevCodePointStart(absl::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {

// Code points that `tokenizers`' NFC (crate unicode-normalization-alignments, Unicode 12-era data)
// treats as plain starters although utf8proc (Unicode 15) knows better: 107 combining marks
// assigned in Unicode 13-15 (there they neither reorder nor block like marks) and U+11930, which
// HF does not compose after U+11935 (into U+11938). Found by comparing both over every code point
// followed by marks (tests/parity). None of them composes with anything in HF, so HF's NFC of
// "a X b" is NFC(a) X NFC(b).
constexpr char32_t kHfNfcStarters[] = {
    0x7FD,   0x898,   0x899,   0x89A,   0x89B,   0x89C,   0x89D,   0x89E,   0x89F,   0x8CA,
    0x8CB,   0x8CC,   0x8CD,   0x8CE,   0x8CF,   0x8D0,   0x8D1,   0x8D2,   0x8D3,   0x9FE,
    0xC3C,   0xD3B,   0xD3C,   0xEBA,   0x1715,  0x1ABF,  0x1AC0,  0x1AC1,  0x1AC2,  0x1AC3,
    0x1AC4,  0x1AC5,  0x1AC6,  0x1AC7,  0x1AC8,  0x1AC9,  0x1ACA,  0x1ACB,  0x1ACC,  0x1ACD,
    0x1ACE,  0x1DF6,  0x1DF7,  0x1DF8,  0x1DF9,  0x1DFA,  0xA82C,  0x10D24, 0x10D25, 0x10D26,
    0x10D27, 0x10EAB, 0x10EAC, 0x10EFD, 0x10EFE, 0x10EFF, 0x10F46, 0x10F47, 0x10F48, 0x10F49,
    0x10F4A, 0x10F4B, 0x10F4C, 0x10F4D, 0x10F4E, 0x10F4F, 0x10F50, 0x10F82, 0x10F83, 0x10F84,
    0x10F85, 0x11070, 0x1133B, 0x1145E, 0x11839, 0x1183A, 0x11930, 0x1193D, 0x1193E, 0x11943,
    0x119E0, 0x11A34, 0x11A47, 0x11A99, 0x11D42, 0x11D44, 0x11D45, 0x11D97, 0x11F41, 0x11F42,
    0x16FF0, 0x16FF1, 0x1E08F, 0x1E130, 0x1E131, 0x1E132, 0x1E133, 0x1E134, 0x1E135, 0x1E136,
    0x1E2AE, 0x1E2EC, 0x1E2ED, 0x1E2EE, 0x1E2EF, 0x1E4EC, 0x1E4ED, 0x1E4EE, 0x1E4EF};

bool IsHfNfcStarter(char32_t c) {
  return c >= kHfNfcStarters[0] &&
         std::binary_search(std::begin(kHfNfcStarters), std::end(kHfNfcStarters), c);
}

absl::Status AppendUtf8procNfc(absl::string_view s, std::string* out) {
  if (s.empty()) return absl::OkStatus();
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), s.size(), &mapped,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return absl::InternalError(absl::StrCat("NFC failed: ", utf8proc_errmsg(n)));
  out->append(reinterpret_cast<const char*>(mapped), n);
  std::free(mapped);
  return absl::OkStatus();
}

}  // namespace

// Text below U+0300 is already NFC (nothing there decomposes or combines with a predecessor), and
// in UTF-8 that is "no byte >= 0xCC": the common case costs one scan and a copy.
absl::StatusOr<std::string> Nfc(absl::string_view s) {
  if (std::none_of(s.begin(), s.end(),
                   [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return std::string(s);
  }
  std::string out;
  out.reserve(s.size());
  size_t segment = 0;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    if (IsHfNfcStarter(NextCodePoint(s, &pos))) {
      SW_RETURN_IF_ERROR(AppendUtf8procNfc(s.substr(segment, start - segment), &out));
      out.append(s.data() + start, pos - start);
      segment = pos;
    }
  }
  SW_RETURN_IF_ERROR(AppendUtf8procNfc(s.substr(segment), &out));
  return out;
}

}  // namespace specwire::tokenizer_internal
