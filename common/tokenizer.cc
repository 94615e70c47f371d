// Byte-level BPE from tokenizer.json. Sections follow the order of the Encode pipeline:
//   UTF-8 helpers · byte-level alphabet · Split regexes (PCRE2 with Oniguruma semantics) ·
//   added-token matching · pre-tokenizer steps · BPE model · post-processor · JSON loading ·
//   Encode / Decode.
// Each HF behaviour that is easy to get wrong cites the `tokenizers` source file it mirrors.
#include "common/tokenizer.h"

#include <algorithm>
#include <array>
#include <bitset>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

namespace specwire {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------

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

// Byte offset of the first ill-formed sequence, or npos.
size_t FindInvalidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    int bad = 0;
    const int n = Utf8SequenceAt(s, i, &bad);
    if (n == 0) return i;
    i += n;
  }
  return absl::string_view::npos;
}

// Rust's String::from_utf8_lossy: every maximal ill-formed subpart becomes U+FFFD.
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

// Decodes the code point at s[*pos] of well-formed UTF-8 and advances *pos.
char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto b = static_cast<unsigned char>(s[*pos]);
  const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  *pos += n;
  return cp;
}

// Decodes the code point that ends at s[end] (exclusive) and returns its start.
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

// Unicode White_Space: Rust's `char::is_whitespace` and regex `\s`, Oniguruma's Unicode `\s`.
bool IsWhiteSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

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

// NFC as `tokenizers` computes it. Text below U+0300 is already NFC (nothing there decomposes or
// combines with a predecessor), and in UTF-8 that is "no byte >= 0xCC": the common case costs one
// scan and a copy.
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

// ---------------------------------------------------------------------------------------------
// Byte-level alphabet (GPT-2's bytes_to_unicode; tokenizers/src/pre_tokenizers/byte_level.rs)
// ---------------------------------------------------------------------------------------------

// Every byte is shown as one printable character: printable Latin-1 bytes as themselves, the
// other 68 as U+0100 + n in byte order. Vocabulary strings are written in these characters.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;  // char_of_byte as UTF-8
  std::array<int16_t, 0x144> byte_of_char{};  // -1 where the character is not in the alphabet

  ByteLevelAlphabet() {
    byte_of_char.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      char_of_byte[b] = printable ? b : 0x100 + n++;
      AppendUtf8(char_of_byte[b], &utf8_of_byte[b]);
      byte_of_char[char_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
  std::string Encode(absl::string_view bytes) const {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) out += utf8_of_byte[static_cast<unsigned char>(c)];
    return out;
  }
};

const ByteLevelAlphabet& Alphabet() {
  static const ByteLevelAlphabet* alphabet = new ByteLevelAlphabet();
  return *alphabet;
}

// ---------------------------------------------------------------------------------------------
// Split regexes: PCRE2 with the semantics of Oniguruma (Ruby syntax), the engine `tokenizers`
// compiles tokenizer.json patterns with (tokenizers/src/utils/onig.rs).
// ---------------------------------------------------------------------------------------------

// Oniguruma's Unicode \w, measured against `tokenizers` over every code point of Unicode 14:
// Alphabetic, marks, decimal digits, connector punctuation, and six Latin-1 No characters.
constexpr char kOnigWordMembers[] =
    R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";

// Rewrites the escapes whose meaning differs between Oniguruma and PCRE2 (UCP mode):
//   \s \S   PCRE2 counts U+180E as space (Unicode < 6.3); onig uses White_Space
//   \w \W   PCRE2 uses \p{L}\p{N}_; onig Alphabetic + marks + Nd + Pc
//   \h \H   hexadecimal digit in onig, horizontal space in PCRE2
//   \uHHHH  onig only; PCRE2 spells it \x{HHHH}
// and refuses the Ruby features PCRE2 would read differently (nested classes). `path` names the
// JSON field in errors.
absl::StatusOr<std::string> TranslateOnigPattern(absl::string_view p, const std::string& path) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E quotes verbatim
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == absl::string_view::npos ? p.size() : end + 2;
        out.append(p.data() + i, stop - i);
        i = stop - 1;
        continue;
      }
      if (e == 'u' && i + 6 <= p.size() &&
          std::all_of(p.begin() + i + 2, p.begin() + i + 6,
                      [](char h) { return std::isxdigit(static_cast<unsigned char>(h)); })) {
        out += absl::StrCat("\\x{", p.substr(i + 2, 4), "}");
        i += 5;
        continue;
      }
      std::string rep;
      switch (e) {
        case 's':
          rep = "\\p{White_Space}";
          break;
        case 'S':
          rep = "\\P{White_Space}";
          break;
        case 'w':
          rep = in_class ? kOnigWordMembers : absl::StrCat("[", kOnigWordMembers, "]");
          break;
        case 'h':
          rep = in_class ? "0-9A-Fa-f" : "[0-9A-Fa-f]";
          break;
        case 'W':
        case 'H':
          if (in_class) {
            return absl::InvalidArgumentError(
                absl::StrCat("unsupported regex at ", path, ": \\", std::string(1, e),
                             " inside a character class has no PCRE2 equivalent"));
          }
          rep = e == 'W' ? absl::StrCat("[^", kOnigWordMembers, "]") : "[^0-9A-Fa-f]";
          break;
        default:
          break;
      }
      if (!rep.empty()) {
        out += rep;
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
      continue;
    }
    if (in_class && c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
        const size_t end = p.find(":]", i + 2);
        if (end != absl::string_view::npos) {
          out.append(p.data() + i, end + 2 - i);
          i = end + 1;
          continue;
        }
      }
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported regex at ", path,
                       ": nested character class (Oniguruma set syntax) at ", "offset ", i));
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread PCRE2 match state: match data for one pair of offsets and a JIT stack larger than
// the default 32 KiB (long whitespace runs backtrack deeply in `\s+(?!\S)`).
struct Pcre2Scratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
  Pcre2Scratch() {
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~Pcre2Scratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

Pcre2Scratch& ThreadScratch() {
  thread_local Pcre2Scratch scratch;
  return scratch;
}

class SplitRegex {
 public:
  // `pattern` is a tokenizer.json Split pattern: a regex ({"Regex": ...}) or, when `literal`, a
  // plain string ({"String": ...}).
  static absl::StatusOr<std::unique_ptr<SplitRegex>> Compile(absl::string_view pattern,
                                                             bool literal,
                                                             const std::string& path) {
    std::string translated(pattern);
    uint32_t options = PCRE2_UTF;
    if (literal) {
      options |= PCRE2_LITERAL;  // which admits no UCP / MULTILINE (and needs neither)
    } else {
      SW_ASSIGN_OR_RETURN(translated, TranslateOnigPattern(pattern, path));
      options |= PCRE2_UCP | PCRE2_MULTILINE;  // Ruby syntax: ^ and $ are line anchors
    }
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                     translated.size(), options, &error, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(
          absl::StrCat("bad regex at ", path, " (offset ", error_offset, " of the PCRE2 form \"",
                       translated, "\"): ", reinterpret_cast<const char*>(message)));
    }
    // JIT is an optimisation only: the interpreter gives the same matches where it is missing.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::unique_ptr<SplitRegex>(new SplitRegex(code));
  }

  ~SplitRegex() { pcre2_code_free(code_); }

  // Match ranges [start, end) in `text` (valid UTF-8), in the order and with the empty-match
  // rule of the Rust onig crate's find_iter: after an empty match that ends where the previous
  // match ended, the search restarts one character later.
  absl::Status FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
    Pcre2Scratch& scratch = ThreadScratch();
    size_t last_end = 0;
    std::optional<size_t> last_match_end;
    while (last_end <= text.size()) {
      int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), last_end,
                           PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {  // retry with the interpreter (heap frames)
        rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), last_end,
                         PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.data, scratch.context);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        return absl::ResourceExhaustedError(
            absl::StrCat("regex match failed on a ", text.size(),
                         "-byte piece: ", reinterpret_cast<const char*>(message)));
      }
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
      const size_t start = ovector[0], end = ovector[1];
      if (start == end && last_match_end == end) {
        if (last_end < text.size()) {
          size_t next = last_end;
          NextCodePoint(text, &next);
          last_end = next;
        } else {
          last_end = text.size() + 1;
        }
        continue;
      }
      last_end = end;
      last_match_end = end;
      out->emplace_back(start, end);
    }
    return absl::OkStatus();
  }

 private:
  explicit SplitRegex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;  // owned
};

// The GPT-2 regex that ByteLevel(use_regex=true) splits with (byte_level.rs).
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rust regex `\w` (Unicode): what added_vocabulary.rs checks around single_word tokens.
bool IsRustWordChar(char32_t cp) {
  static pcre2_code* const code = [] {
    static const char kPattern[] = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])";
    int error = 0;
    PCRE2_SIZE offset = 0;
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &error, &offset, nullptr);
  }();
  std::string utf8;
  AppendUtf8(cp, &utf8);
  Pcre2Scratch& scratch = ThreadScratch();
  return pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(utf8.data()), utf8.size(), 0,
                     PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, scratch.data, scratch.context) > 0;
}

// ---------------------------------------------------------------------------------------------
// Added tokens (tokenizers/src/tokenizer/added_vocabulary.rs)
// ---------------------------------------------------------------------------------------------

// Leftmost-longest matching of a set of strings, like daachorse's MatchKind::LeftmostLongest:
// the match that starts first, and of those the longest; the scan resumes after it.
class AddedTokenTrie {
 public:
  AddedTokenTrie() : nodes_(1) {}
  bool empty() const { return nodes_.size() == 1; }

  void Add(absl::string_view s, int32_t id) {
    int32_t node = 0;
    for (char c : s) {
      const auto b = static_cast<unsigned char>(c);
      auto it = nodes_[node].next.find(b);
      if (it == nodes_[node].next.end()) {
        nodes_.emplace_back();
        it = nodes_[node].next.emplace(b, static_cast<int32_t>(nodes_.size() - 1)).first;
      }
      node = it->second;
    }
    nodes_[node].id = id;
    first_bytes_.set(static_cast<unsigned char>(s[0]));
  }

  // The next match at or after `from`; false when there is none.
  bool FindNext(absl::string_view text, size_t from, size_t* start, size_t* end,
                int32_t* id) const {
    for (size_t i = from; i < text.size(); ++i) {
      if (!first_bytes_.test(static_cast<unsigned char>(text[i]))) continue;
      int32_t node = 0;
      int32_t best_id = -1;
      size_t best_end = 0;
      for (size_t j = i; j < text.size(); ++j) {
        const auto it = nodes_[node].next.find(static_cast<unsigned char>(text[j]));
        if (it == nodes_[node].next.end()) break;
        node = it->second;
        if (nodes_[node].id >= 0) best_id = nodes_[node].id, best_end = j + 1;
      }
      if (best_id >= 0) {
        *start = i, *end = best_end, *id = best_id;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int32_t> next;
    int32_t id = -1;
  };
  std::vector<Node> nodes_;
  std::bitset<256> first_bytes_;
};

// A piece of the text on its way through the pipeline: either matched to an added token (id >= 0)
// or text still to be normalized / pre-tokenized / encoded.
struct Segment {
  std::string text;
  int32_t token_id = -1;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer steps (split.rs, byte_level.rs, tokenizer/normalizer.rs NormalizedString::split)
// ---------------------------------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::unique_ptr<SplitRegex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

// Splits `piece` like NormalizedString::split(pattern, behavior); empty results are dropped, as
// PreTokenizedString::split does.
absl::Status ApplySplit(const SplitStep& step, const std::string& piece,
                        std::vector<std::string>* out) {
  // (offsets, is_match), covering the piece: Pattern::find_matches for &SysRegex (pattern.rs).
  struct Range {
    size_t begin, end;
    bool flag;  // is_match, then (after the behavior) "remove"
  };
  std::vector<std::pair<size_t, size_t>> found;
  SW_RETURN_IF_ERROR(step.regex->FindAll(piece, &found));
  std::vector<Range> matches;
  size_t prev = 0;
  for (const auto& [start, end] : found) {
    if (prev != start) matches.push_back({prev, start, false});
    matches.push_back({start, end, true});
    prev = end;
  }
  if (prev != piece.size()) matches.push_back({prev, piece.size(), false});
  if (step.invert) {
    for (Range& r : matches) r.flag = !r.flag;
  }

  std::vector<Range> splits;
  bool previous_match = false;
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (Range r : matches) splits.push_back({r.begin, r.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (Range r : matches) splits.push_back(r);
      break;
    case SplitBehavior::kContiguous:
      for (Range r : matches) {
        if (r.flag == previous_match && !splits.empty()) {
          splits.back().end = r.end;
        } else {
          splits.push_back({r.begin, r.end, false});
        }
        previous_match = r.flag;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (Range r : matches) {
        if (r.flag && !previous_match && !splits.empty()) {
          splits.back().end = r.end;
        } else {
          splits.push_back({r.begin, r.end, false});
        }
        previous_match = r.flag;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->flag && !previous_match && !splits.empty()) {
          splits.back().begin = it->begin;
        } else {
          splits.push_back({it->begin, it->end, false});
        }
        previous_match = it->flag;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  for (const Range& r : splits) {
    if (!r.flag && r.end > r.begin) out->push_back(piece.substr(r.begin, r.end - r.begin));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// BPE model (tokenizers/src/models/bpe/model.rs and word.rs)
// ---------------------------------------------------------------------------------------------

class BytePairModel {
 public:
  // Words cached per pre-token; when full the cache is cleared and refilled by what is hot now.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedWordBytes = 256;  // longer pre-tokens are rarely repeated

  absl::flat_hash_map<std::string, int32_t> vocab;
  std::vector<std::string> vocab_r;  // id -> token; empty where no token
  std::vector<bool> has_id;
  bool ignore_merges = false;
  bool fuse_unk = false;
  bool byte_fallback = false;
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;

  struct MergeInfo {
    int32_t rank;
    int32_t new_id;
  };
  absl::flat_hash_map<uint64_t, MergeInfo> merges;  // (left id << 32 | right id) -> merge

  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Fills the per-byte initial ids, one table per position in the word: [is_last][is_first].
  // HF looks up prefix + char (not first) + suffix (last) for each character; with the byte-level
  // alphabet a character is one byte, so the four combinations cover every lookup.
  void BuildByteTables() {
    const ByteLevelAlphabet& alphabet = Alphabet();
    for (int last = 0; last < 2; ++last) {
      for (int first = 0; first < 2; ++first) {
        for (int b = 0; b < 256; ++b) {
          const auto it = vocab.find(SymbolString(static_cast<uint8_t>(b), first, last, alphabet));
          byte_ids_[last][first][b] = it == vocab.end() ? -1 : it->second;
        }
      }
    }
  }

  // Appends the ids of one pre-token, given as raw bytes (before the byte-level mapping).
  absl::Status Tokenize(absl::string_view word, std::vector<int64_t>* ids) const {
    if (word.empty()) return absl::OkStatus();
    if (ignore_merges) {
      const auto it = vocab.find(Alphabet().Encode(word));
      if (it != vocab.end()) {
        ids->push_back(it->second);
        return absl::OkStatus();
      }
    }
    const bool cacheable = word.size() < kMaxCachedWordBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      const auto it = cache_.find(word);
      if (it != cache_.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return absl::OkStatus();
      }
    }
    std::vector<int32_t> merged;
    SW_RETURN_IF_ERROR(MergeWord(word, &merged));
    ids->insert(ids->end(), merged.begin(), merged.end());
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mu_);
      if (cache_.size() >= kCacheCapacity) cache_.clear();
      cache_.emplace(std::string(word), std::move(merged));
    }
    return absl::OkStatus();
  }

 private:
  std::string SymbolString(uint8_t b, bool first, bool last, const ByteLevelAlphabet& a) const {
    std::string s = first ? "" : continuing_subword_prefix;
    s += a.utf8_of_byte[b];
    if (last) s += end_of_word_suffix;
    return s;
  }

  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;  // 0 once merged into its left neighbour
  };

  // BPE::merge_word + Word::merge_all without dropout.
  absl::Status MergeWord(absl::string_view word, std::vector<int32_t>* out) const {
    const ByteLevelAlphabet& alphabet = Alphabet();
    std::vector<Symbol> symbols;
    symbols.reserve(word.size());
    auto add = [&symbols](int32_t id, int32_t len) {
      const auto n = static_cast<int32_t>(symbols.size());
      if (n > 0) symbols.back().next = n;
      symbols.push_back({id, n - 1, -1, len});
    };
    int32_t unk_id = -1, unk_len = 0;  // a pending unk symbol, when unk_id >= 0
    for (size_t i = 0; i < word.size(); ++i) {
      const bool first = i == 0, last = i + 1 == word.size();
      const auto b = static_cast<uint8_t>(word[i]);
      const int32_t id = byte_ids_[last][first][b];
      if (id >= 0) {
        if (unk_id >= 0) add(unk_id, unk_len), unk_id = -1;
        add(id, 1);
        continue;
      }
      if (byte_fallback) {  // <0xXX> for each UTF-8 byte of the (prefixed) symbol string
        const std::string s = SymbolString(b, first, last, alphabet);
        std::vector<int32_t> fallback;
        for (char c : s) {
          const auto it = vocab.find(absl::StrFormat("<0x%02X>", static_cast<unsigned char>(c)));
          if (it == vocab.end()) break;
          fallback.push_back(it->second);
        }
        if (fallback.size() == s.size()) {
          for (int32_t f : fallback) add(f, 1);
          continue;  // like HF, a pending unk stays pending
        }
      }
      if (unk_token) {
        const auto it = vocab.find(*unk_token);
        if (it == vocab.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("unk_token \"", *unk_token, "\" is not in the vocabulary"));
        }
        if (unk_id >= 0 && fuse_unk) {
          unk_len += 1;
        } else {
          if (unk_id >= 0) add(unk_id, unk_len);
          unk_id = it->second, unk_len = 1;
        }
      }
      // Neither in the vocabulary nor unk_token: HF drops the character.
    }
    if (unk_id >= 0) add(unk_id, unk_len);

    // Lowest rank first, then leftmost (word.rs `Ord for Merge`).
    struct Merge {
      int32_t pos, rank, new_id;
      bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Merge> queue;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merges.find(PairKey(symbols[i].id, symbols[i + 1].id));
      if (it != merges.end()) {
        queue.push({static_cast<int32_t>(i), it->second.rank, it->second.new_id});
      }
    }
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& current = symbols[top.pos];
      if (current.len == 0 || current.next == -1) continue;
      const Symbol right = symbols[current.next];
      // An entry whose pair changed since it was queued is stale; HF compares only the new id.
      const auto target = merges.find(PairKey(current.id, right.id));
      if (target == merges.end() || target->second.new_id != top.new_id) continue;
      symbols[current.next].len = 0;
      current.id = top.new_id;
      current.len += right.len;
      current.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = top.pos;
      if (current.prev >= 0) {
        const auto it = merges.find(PairKey(symbols[current.prev].id, current.id));
        if (it != merges.end()) queue.push({current.prev, it->second.rank, it->second.new_id});
      }
      if (current.next >= 0) {
        const auto it = merges.find(PairKey(current.id, symbols[current.next].id));
        if (it != merges.end()) queue.push({top.pos, it->second.rank, it->second.new_id});
      }
    }
    for (const Symbol& s : symbols) {
      if (s.len != 0) out->push_back(s.id);
    }
    return absl::OkStatus();
  }

  int32_t byte_ids_[2][2][256];
  mutable std::mutex cache_mu_;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache_;  // guarded by cache_mu_
};

// ---------------------------------------------------------------------------------------------
// JSON access: every error names the JSON path of the offending value.
// ---------------------------------------------------------------------------------------------

std::string Sub(const std::string& path, absl::string_view key) {
  return absl::StrCat(path, "/", key);
}
std::string Sub(const std::string& path, size_t index) { return absl::StrCat(path, "/", index); }

absl::Status TypeError(const std::string& path, absl::string_view want, const json& got) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json ", path, ": expected ", want, ", got ", got.type_name()));
}

// The member `key` of `obj`, or nullptr when missing or null.
const json* Member(const json& obj, absl::string_view key) {
  const auto it = obj.find(std::string(key));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<const json*> RequiredMember(const json& obj, const std::string& path,
                                           absl::string_view key) {
  const json* v = Member(obj, key);
  if (v == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", Sub(path, key), ": missing"));
  }
  return v;
}

absl::StatusOr<bool> BoolMember(const json& obj, const std::string& path, absl::string_view key,
                                bool default_value) {
  const json* v = Member(obj, key);
  if (v == nullptr) return default_value;
  if (!v->is_boolean()) return TypeError(Sub(path, key), "a boolean", *v);
  return v->get<bool>();
}

absl::StatusOr<std::string> StringMember(const json& obj, const std::string& path,
                                         absl::string_view key) {
  SW_ASSIGN_OR_RETURN(const json* v, RequiredMember(obj, path, key));
  if (!v->is_string()) return TypeError(Sub(path, key), "a string", *v);
  return v->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> OptionalStringMember(const json& obj,
                                                                const std::string& path,
                                                                absl::string_view key) {
  const json* v = Member(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return TypeError(Sub(path, key), "a string", *v);
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::string> TypeOf(const json& obj, const std::string& path) {
  if (!obj.is_object()) return TypeError(path, "an object", obj);
  return StringMember(obj, path, "type");
}

absl::Status Unsupported(const std::string& path, absl::string_view what, absl::string_view type,
                         absl::string_view supported) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", path, ": unsupported ", what,
                                                 " type \"", type, "\" (supported: ", supported,
                                                 ")"));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tokenizer
// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
  BytePairModel model;
  bool nfc = false;
  std::vector<SplitStep> splits;  // pre-tokenizer steps before the final ByteLevel
  bool byte_level_prefix_space = false;
  std::unique_ptr<SplitRegex> byte_level_regex;  // GPT-2 regex when ByteLevel use_regex
  // Post-processor: TemplateProcessing "single" templates, applied in order (Sequence) when
  // add_special_tokens. Each element is -1 for "$A" or an index into template_ids.
  std::vector<std::vector<int32_t>> templates;
  std::vector<std::vector<int32_t>> template_ids;
  bool byte_level_decoder = false;

  std::vector<AddedToken> added;  // id order
  absl::flat_hash_map<std::string, int32_t> added_by_content;
  absl::flat_hash_map<int32_t, size_t> added_by_id;              // -> index into `added`
  absl::flat_hash_map<int32_t, std::string> normalized_content;  // where NFC changes it
  absl::flat_hash_set<std::string> special_contents;
  AddedTokenTrie raw_trie;         // normalized == false: matched in the raw text
  AddedTokenTrie normalized_trie;  // normalized == true: matched in the normalized text
  int64_t vocab_size = 0;

  absl::Status ParseModel(const json& j, const std::string& path);
  absl::Status ParseNormalizer(const json& j, const std::string& path);
  absl::Status ParsePreTokenizer(const json& j, const std::string& path, bool* seen_byte_level);
  absl::Status ParsePostProcessor(const json& j, const std::string& path);
  absl::Status ParseDecoder(const json& j, const std::string& path);
  absl::Status ParseAddedTokens(const json& j, const std::string& path);

  // AddedVocabulary::find_matches + split_with_indices over one text segment.
  void SplitOnAddedTokens(const std::string& text, const AddedTokenTrie& trie,
                          std::vector<Segment>* out) const;
  absl::Status PreTokenize(std::string text, std::vector<std::string>* pieces) const;
};

absl::Status Tokenizer::Impl::ParseModel(const json& j, const std::string& path) {
  if (!j.is_object()) return TypeError(path, "an object", j);
  const json* type = Member(j, "type");
  if (type != nullptr && (!type->is_string() || type->get<std::string>() != "BPE")) {
    return Unsupported(Sub(path, "type"), "model",
                       type->is_string() ? type->get<std::string>() : type->dump(), "BPE");
  }
  if (const json* dropout = Member(j, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json ", Sub(path, "dropout"), ": BPE dropout ", dropout->dump(),
                     " makes encoding random; only null or 0 is supported"));
  }
  SW_ASSIGN_OR_RETURN(model.ignore_merges, BoolMember(j, path, "ignore_merges", false));
  SW_ASSIGN_OR_RETURN(model.fuse_unk, BoolMember(j, path, "fuse_unk", false));
  SW_ASSIGN_OR_RETURN(model.byte_fallback, BoolMember(j, path, "byte_fallback", false));
  SW_ASSIGN_OR_RETURN(model.unk_token, OptionalStringMember(j, path, "unk_token"));
  SW_ASSIGN_OR_RETURN(auto prefix, OptionalStringMember(j, path, "continuing_subword_prefix"));
  SW_ASSIGN_OR_RETURN(auto suffix, OptionalStringMember(j, path, "end_of_word_suffix"));
  model.continuing_subword_prefix = prefix.value_or("");
  model.end_of_word_suffix = suffix.value_or("");

  SW_ASSIGN_OR_RETURN(const json* vocab, RequiredMember(j, path, "vocab"));
  if (!vocab->is_object()) return TypeError(Sub(path, "vocab"), "an object", *vocab);
  int32_t max_id = -1;
  model.vocab.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) {
      return TypeError(Sub(Sub(path, "vocab"), token), "an id in [0, 2^31)", id);
    }
    const auto value = static_cast<int32_t>(id.get<uint64_t>());
    // The id -> token table is dense; one stray huge id would make it gigabytes. Every HF file
    // numbers its vocabulary densely, so an id far beyond the vocabulary's size is refused.
    if (static_cast<uint64_t>(value) >= 4 * vocab->size() + 65536) {
      return TypeError(Sub(Sub(path, "vocab"), token),
                       absl::StrCat("an id below ", 4 * vocab->size() + 65536,
                                    " (ids must be about as dense as the vocabulary)"),
                       id);
    }
    model.vocab[token] = value;
    max_id = std::max(max_id, value);
  }
  model.vocab_r.assign(max_id + 1, std::string());
  model.has_id.assign(max_id + 1, false);
  for (const auto& [token, id] : model.vocab) {
    model.vocab_r[id] = token;
    model.has_id[id] = true;
  }

  // Merges: [["a", "b"], ...] or the legacy ["a b", ...] (serialization.rs, MergeType); the rank
  // is the position. A pair listed twice keeps its last rank, as HF's map collect does.
  SW_ASSIGN_OR_RETURN(const json* merges, RequiredMember(j, path, "merges"));
  const std::string merges_path = Sub(path, "merges");
  if (!merges->is_array()) return TypeError(merges_path, "an array", *merges);
  model.merges.reserve(merges->size());
  int32_t rank = 0;
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      if (line.starts_with("#version")) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json ", Sub(merges_path, i), ": merge \"", line,
                         "\" is not two tokens separated by one space"));
      }
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return TypeError(Sub(merges_path, i), "\"a b\" or [\"a\", \"b\"]", m);
    }
    const size_t prefix_len = model.continuing_subword_prefix.size();
    const auto a_it = model.vocab.find(a);
    const auto b_it = model.vocab.find(b);
    if (a_it == model.vocab.end() || b_it == model.vocab.end() || b.size() < prefix_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer.json ", Sub(merges_path, i), ": merge token \"",
                       a_it == model.vocab.end() ? a : b, "\" is not in the vocabulary"));
    }
    const std::string merged = a + b.substr(prefix_len);
    const auto new_it = model.vocab.find(merged);
    if (new_it == model.vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", Sub(merges_path, i),
                                                     ": merged token \"", merged,
                                                     "\" is not in the vocabulary"));
    }
    model.merges[BytePairModel::PairKey(a_it->second, b_it->second)] = {rank++, new_it->second};
  }
  model.BuildByteTables();
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseNormalizer(const json& j, const std::string& path) {
  SW_ASSIGN_OR_RETURN(const std::string type, TypeOf(j, path));
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    SW_ASSIGN_OR_RETURN(const json* list, RequiredMember(j, path, "normalizers"));
    if (!list->is_array()) return TypeError(Sub(path, "normalizers"), "an array", *list);
    for (size_t i = 0; i < list->size(); ++i) {
      SW_RETURN_IF_ERROR(ParseNormalizer((*list)[i], Sub(Sub(path, "normalizers"), i)));
    }
    return absl::OkStatus();
  }
  return Unsupported(Sub(path, "type"), "normalizer", type, "NFC, Sequence");
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const json& j, const std::string& path,
                                                bool* seen_byte_level) {
  SW_ASSIGN_OR_RETURN(const std::string type, TypeOf(j, path));
  if (*seen_byte_level) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json ", path, ": pre-tokenizer \"", type,
                     "\" after ByteLevel is not supported (ByteLevel must be the last step)"));
  }
  if (type == "Sequence") {
    SW_ASSIGN_OR_RETURN(const json* list, RequiredMember(j, path, "pretokenizers"));
    if (!list->is_array()) return TypeError(Sub(path, "pretokenizers"), "an array", *list);
    for (size_t i = 0; i < list->size(); ++i) {
      SW_RETURN_IF_ERROR(
          ParsePreTokenizer((*list)[i], Sub(Sub(path, "pretokenizers"), i), seen_byte_level));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *seen_byte_level = true;
    SW_ASSIGN_OR_RETURN(byte_level_prefix_space, BoolMember(j, path, "add_prefix_space", true));
    SW_ASSIGN_OR_RETURN(const bool use_regex, BoolMember(j, path, "use_regex", true));
    if (use_regex) {
      SW_ASSIGN_OR_RETURN(byte_level_regex, SplitRegex::Compile(kGpt2Pattern, false, path));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    SplitStep step;
    SW_ASSIGN_OR_RETURN(const json* pattern, RequiredMember(j, path, "pattern"));
    const std::string pattern_path = Sub(path, "pattern");
    const json* regex = pattern->is_object() ? Member(*pattern, "Regex") : nullptr;
    const json* literal = pattern->is_object() ? Member(*pattern, "String") : nullptr;
    if ((regex == nullptr) == (literal == nullptr)) {
      return TypeError(pattern_path, "{\"Regex\": ...} or {\"String\": ...}", *pattern);
    }
    const json& text = regex != nullptr ? *regex : *literal;
    if (!text.is_string()) return TypeError(pattern_path, "a string pattern", text);
    SW_ASSIGN_OR_RETURN(
        step.regex, SplitRegex::Compile(text.get<std::string>(), literal != nullptr,
                                        Sub(pattern_path, regex != nullptr ? "Regex" : "String")));
    SW_ASSIGN_OR_RETURN(const std::string behavior, StringMember(j, path, "behavior"));
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool known = false;
    for (const auto& [name, value] : kBehaviors) {
      if (behavior == name) step.behavior = value, known = true;
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer.json ", Sub(path, "behavior"), ": unknown split behavior \"", behavior, "\""));
    }
    SW_ASSIGN_OR_RETURN(step.invert, BoolMember(j, path, "invert", false));
    splits.push_back(std::move(step));
    return absl::OkStatus();
  }
  return Unsupported(Sub(path, "type"), "pre_tokenizer", type, "ByteLevel, Split, Sequence");
}

absl::Status Tokenizer::Impl::ParsePostProcessor(const json& j, const std::string& path) {
  SW_ASSIGN_OR_RETURN(const std::string type, TypeOf(j, path));
  if (type == "ByteLevel") return absl::OkStatus();  // offsets only
  if (type == "Sequence") {
    SW_ASSIGN_OR_RETURN(const json* list, RequiredMember(j, path, "processors"));
    if (!list->is_array()) return TypeError(Sub(path, "processors"), "an array", *list);
    for (size_t i = 0; i < list->size(); ++i) {
      SW_RETURN_IF_ERROR(ParsePostProcessor((*list)[i], Sub(Sub(path, "processors"), i)));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return Unsupported(Sub(path, "type"), "post_processor", type,
                       "ByteLevel, TemplateProcessing, Sequence");
  }
  // special_tokens: {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
  absl::flat_hash_map<std::string, int32_t> special_index;
  if (const json* specials = Member(j, "special_tokens"); specials != nullptr) {
    if (!specials->is_object()) {
      return TypeError(Sub(path, "special_tokens"), "an object", *specials);
    }
    for (const auto& [name, value] : specials->items()) {
      const std::string p = Sub(Sub(path, "special_tokens"), name);
      if (!value.is_object()) return TypeError(p, "an object", value);
      SW_ASSIGN_OR_RETURN(const json* ids, RequiredMember(value, p, "ids"));
      if (!ids->is_array()) return TypeError(Sub(p, "ids"), "an array", *ids);
      std::vector<int32_t> list;
      for (const json& id : *ids) {
        if (!id.is_number_unsigned() || id.get<uint64_t>() > INT32_MAX) {
          return TypeError(Sub(p, "ids"), "ids in [0, 2^31)", id);
        }
        list.push_back(static_cast<int32_t>(id.get<uint64_t>()));
      }
      special_index[name] = static_cast<int32_t>(template_ids.size());
      template_ids.push_back(std::move(list));
    }
  }
  // single: [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", ...}}]
  SW_ASSIGN_OR_RETURN(const json* single, RequiredMember(j, path, "single"));
  const std::string single_path = Sub(path, "single");
  if (!single->is_array()) return TypeError(single_path, "an array", *single);
  std::vector<int32_t> pieces;
  for (size_t i = 0; i < single->size(); ++i) {
    const json& piece = (*single)[i];
    const std::string p = Sub(single_path, i);
    if (!piece.is_object() || piece.size() != 1) {
      return TypeError(p, "{\"Sequence\": ...} or {\"SpecialToken\": ...}", piece);
    }
    if (const json* seq = Member(piece, "Sequence"); seq != nullptr) {
      SW_ASSIGN_OR_RETURN(const std::string id, StringMember(*seq, Sub(p, "Sequence"), "id"));
      if (id != "A") {
        return absl::InvalidArgumentError(absl::StrCat(
            "tokenizer.json ", p, ": the single-sequence template refers to sequence ", id));
      }
      pieces.push_back(-1);
    } else if (const json* special = Member(piece, "SpecialToken"); special != nullptr) {
      SW_ASSIGN_OR_RETURN(const std::string id,
                          StringMember(*special, Sub(p, "SpecialToken"), "id"));
      const auto it = special_index.find(id);
      if (it == special_index.end()) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", p, ": special token \"",
                                                       id, "\" is not in special_tokens"));
      }
      pieces.push_back(it->second);
    } else {
      return TypeError(p, "{\"Sequence\": ...} or {\"SpecialToken\": ...}", piece);
    }
  }
  templates.push_back(std::move(pieces));
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseDecoder(const json& j, const std::string& path) {
  SW_ASSIGN_OR_RETURN(const std::string type, TypeOf(j, path));
  if (type != "ByteLevel") return Unsupported(Sub(path, "type"), "decoder", type, "ByteLevel");
  byte_level_decoder = true;
  return absl::OkStatus();
}

// AddedVocabulary::add_tokens as called by the tokenizer.json deserializer (serialization.rs).
absl::Status Tokenizer::Impl::ParseAddedTokens(const json& j, const std::string& path) {
  if (!j.is_array()) return TypeError(path, "an array", j);
  // HF's next id: the model vocabulary's size (its entry count), then one per new token.
  auto next_id = static_cast<int32_t>(model.vocab.size());
  absl::flat_hash_map<int32_t, AddedToken> by_id;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    const std::string p = Sub(path, i);
    if (!t.is_object()) return TypeError(p, "an object", t);
    AddedToken token;
    SW_ASSIGN_OR_RETURN(token.content, StringMember(t, p, "content"));
    SW_ASSIGN_OR_RETURN(token.special, BoolMember(t, p, "special", false));
    SW_ASSIGN_OR_RETURN(token.single_word, BoolMember(t, p, "single_word", false));
    SW_ASSIGN_OR_RETURN(token.lstrip, BoolMember(t, p, "lstrip", false));
    SW_ASSIGN_OR_RETURN(token.rstrip, BoolMember(t, p, "rstrip", false));
    SW_ASSIGN_OR_RETURN(token.normalized, BoolMember(t, p, "normalized", !token.special));
    if (token.content.empty()) continue;
    // The id: an existing one for a known content, else the next free one after the model
    // vocabulary and the added tokens so far. The file's "id" is ignored, as by HF.
    int32_t id;
    if (const auto it = added_by_content.find(token.content); it != added_by_content.end()) {
      id = it->second;
    } else if (const auto vit = model.vocab.find(token.content); vit != model.vocab.end()) {
      id = vit->second;
    } else {
      id = next_id++;
    }
    token.id = id;
    added_by_content[token.content] = id;
    if (token.special) special_contents.insert(token.content);
    by_id[id] = std::move(token);
  }
  for (auto& [id, token] : by_id) added.push_back(token);
  std::sort(added.begin(), added.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& token = added[i];
    added_by_id[static_cast<int32_t>(token.id)] = i;
    std::string pattern = token.content;
    if (token.normalized && nfc) {
      SW_ASSIGN_OR_RETURN(pattern, Nfc(token.content));
      if (pattern != token.content) normalized_content[static_cast<int32_t>(token.id)] = pattern;
    }
    (token.normalized ? normalized_trie : raw_trie).Add(pattern, static_cast<int32_t>(token.id));
  }
  return absl::OkStatus();
}

void Tokenizer::Impl::SplitOnAddedTokens(const std::string& text, const AddedTokenTrie& trie,
                                         std::vector<Segment>* out) const {
  if (trie.empty()) {
    out->push_back({text, -1});
    return;
  }
  size_t start_offset = 0;  // end of the previous emitted piece
  size_t search = 0;        // the trie scan resumes after the previous match, not after strips
  size_t match_start = 0, match_end = 0;
  int32_t id = -1;
  while (trie.FindNext(text, search, &match_start, &match_end, &id)) {
    search = match_end;
    const AddedToken& token = added[added_by_id.at(id)];
    size_t start = match_start, stop = match_end;
    if (token.single_word) {  // `\w$` before and `^\w` after must both fail
      size_t before = start > 0 ? PrevCodePointStart(text, start) : 0;
      size_t after = stop;
      const bool start_space = start == 0 || !IsRustWordChar(NextCodePoint(text, &before));
      const bool stop_space = stop == text.size() || !IsRustWordChar(NextCodePoint(text, &after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t p = PrevCodePointStart(text, new_start);
        const size_t char_start = p;
        if (!IsWhiteSpace(NextCodePoint(text, &p))) break;
        new_start = char_start;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      size_t p = stop;
      while (p < text.size()) {
        size_t next = p;
        if (!IsWhiteSpace(NextCodePoint(text, &next))) break;
        p = next;
      }
      stop = p;
    }
    if (start_offset < start) out->push_back({text.substr(start_offset, start - start_offset), -1});
    out->push_back({std::string(), id});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({text.substr(start_offset), -1});
}

absl::Status Tokenizer::Impl::PreTokenize(std::string text,
                                          std::vector<std::string>* pieces) const {
  std::vector<std::string> current, next;
  current.push_back(std::move(text));
  for (const SplitStep& step : splits) {
    next.clear();
    for (const std::string& piece : current) SW_RETURN_IF_ERROR(ApplySplit(step, piece, &next));
    std::swap(current, next);
  }
  // ByteLevel: the prefix space goes on every piece that does not start with one.
  if (byte_level_prefix_space) {
    for (std::string& piece : current) {
      if (!piece.starts_with(' ')) piece.insert(piece.begin(), ' ');
    }
  }
  if (byte_level_regex != nullptr) {
    next.clear();
    for (const std::string& piece : current) {
      std::vector<std::pair<size_t, size_t>> found;
      SW_RETURN_IF_ERROR(byte_level_regex->FindAll(piece, &found));
      size_t prev = 0;
      for (const auto& [start, end] : found) {  // Isolated: matches and gaps, empties dropped
        if (prev < start) next.push_back(piece.substr(prev, start - prev));
        if (start < end) next.push_back(piece.substr(start, end - start));
        prev = end;
      }
      if (prev < piece.size()) next.push_back(piece.substr(prev));
    }
    std::swap(current, next);
  }
  for (std::string& piece : current) pieces->push_back(std::move(piece));
  return absl::OkStatus();
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& json_text) {
  const json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("tokenizer.json: not valid JSON");
  if (!j.is_object()) return TypeError("/", "an object", j);
  auto impl = std::make_unique<Impl>();

  if (const json* version = Member(j, "version");
      version != nullptr && !(version->is_string() && version->get<std::string>() == "1.0")) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.json /version: unknown version ", version->dump()));
  }
  for (const char* key : {"truncation", "padding"}) {
    if (Member(j, key) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.json /", key, ": must be null (",
                                                     key, " would change the ids of Encode)"));
    }
  }
  SW_ASSIGN_OR_RETURN(const json* model, RequiredMember(j, "", "model"));
  SW_RETURN_IF_ERROR(impl->ParseModel(*model, "/model"));
  if (const json* n = Member(j, "normalizer"); n != nullptr) {
    SW_RETURN_IF_ERROR(impl->ParseNormalizer(*n, "/normalizer"));
  }
  bool seen_byte_level = false;
  if (const json* p = Member(j, "pre_tokenizer"); p != nullptr) {
    SW_RETURN_IF_ERROR(impl->ParsePreTokenizer(*p, "/pre_tokenizer", &seen_byte_level));
  }
  if (!seen_byte_level) {
    return absl::InvalidArgumentError(
        "tokenizer.json /pre_tokenizer: no ByteLevel step; only byte-level BPE is supported");
  }
  if (const json* p = Member(j, "post_processor"); p != nullptr) {
    SW_RETURN_IF_ERROR(impl->ParsePostProcessor(*p, "/post_processor"));
  }
  if (const json* d = Member(j, "decoder"); d != nullptr) {
    SW_RETURN_IF_ERROR(impl->ParseDecoder(*d, "/decoder"));
  }
  if (const json* a = Member(j, "added_tokens"); a != nullptr) {
    SW_RETURN_IF_ERROR(impl->ParseAddedTokens(*a, "/added_tokens"));
  }
  impl->vocab_size = static_cast<int64_t>(impl->model.vocab_r.size());
  for (const AddedToken& t : impl->added) impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
  for (const auto& ids : impl->template_ids) {
    for (int32_t id : ids) {
      if (id >= impl->vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json /post_processor: special token id ", id,
                         " is not below the vocab size ", impl->vocab_size));
      }
    }
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto tokenizer = FromJson(buffer.str());
  if (!tokenizer.ok()) return Annotate(tokenizer.status(), path);
  return tokenizer;
}

absl::StatusOr<std::vector<int64_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (ill-formed sequence at byte ", bad, ")"));
  }
  const Impl& m = *impl_;
  // 1. Added tokens with normalized == false, in the raw text.
  std::vector<Segment> raw_segments;
  m.SplitOnAddedTokens(std::string(text), m.raw_trie, &raw_segments);
  // 2. Normalize the rest, then find the normalized added tokens in it.
  std::vector<Segment> segments;
  for (Segment& s : raw_segments) {
    if (s.token_id >= 0) {
      segments.push_back(std::move(s));
      continue;
    }
    if (m.nfc) {
      SW_ASSIGN_OR_RETURN(s.text, Nfc(s.text));
    }
    m.SplitOnAddedTokens(s.text, m.normalized_trie, &segments);
  }
  // 3. Pre-tokenize and encode each piece.
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<std::string> pieces;
  for (Segment& s : segments) {
    if (s.token_id >= 0) {
      ids.push_back(s.token_id);
      continue;
    }
    if (s.text.empty()) continue;
    pieces.clear();
    SW_RETURN_IF_ERROR(m.PreTokenize(std::move(s.text), &pieces));
    for (const std::string& piece : pieces) SW_RETURN_IF_ERROR(m.model.Tokenize(piece, &ids));
  }
  // 4. Post-process.
  if (add_special_tokens) {
    for (const std::vector<int32_t>& pieces_of_template : m.templates) {
      std::vector<int64_t> wrapped;
      wrapped.reserve(ids.size() + 4);
      for (int32_t piece : pieces_of_template) {
        if (piece < 0) {
          wrapped.insert(wrapped.end(), ids.begin(), ids.end());
        } else {
          const auto& special = m.template_ids[piece];
          wrapped.insert(wrapped.end(), special.begin(), special.end());
        }
      }
      ids = std::move(wrapped);
    }
  }
  return ids;
}

absl::StatusOr<std::vector<std::string>> Tokenizer::PreTokenize(absl::string_view text) const {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (ill-formed sequence at byte ", bad, ")"));
  }
  std::vector<std::string> pieces;
  if (text.empty()) return pieces;
  SW_RETURN_IF_ERROR(impl_->PreTokenize(std::string(text), &pieces));
  for (std::string& piece : pieces) piece = Alphabet().Encode(piece);
  return pieces;
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int64_t>& ids,
                                              bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<std::string> token = id_to_token(ids[i]);
    if (!token.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ids[", i, "] = ", ids[i], " has no token (vocab size ", m.vocab_size, ")"));
    }
    if (skip_special_tokens && m.special_contents.contains(*token)) continue;
    tokens.push_back(std::move(*token));
  }
  if (!m.byte_level_decoder) return absl::StrJoin(tokens, " ");
  // ByteLevel decoder: a token made only of alphabet characters becomes its bytes, any other
  // token (e.g. an added token with a space) its own UTF-8; then lossy UTF-8 of the whole.
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

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int64_t> Tokenizer::token_to_id(absl::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_by_content.find(key); it != impl_->added_by_content.end()) {
    return it->second;
  }
  if (const auto it = impl_->model.vocab.find(key); it != impl_->model.vocab.end()) {
    return it->second;
  }
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (id < 0 || id > INT32_MAX) return std::nullopt;
  const auto id32 = static_cast<int32_t>(id);
  if (const auto it = impl_->added_by_id.find(id32); it != impl_->added_by_id.end()) {
    const auto norm = impl_->normalized_content.find(id32);
    return norm != impl_->normalized_content.end() ? norm->second
                                                   : impl_->added[it->second].content;
  }
  if (id32 < static_cast<int32_t>(impl_->model.vocab_r.size()) && impl_->model.has_id[id32]) {
    return impl_->model.vocab_r[id32];
  }
  return std::nullopt;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

std::vector<std::string> Tokenizer::special_tokens() const {
  std::vector<std::string> out;
  for (const AddedToken& t : impl_->added) {
    if (t.special) out.push_back(t.content);
  }
  return out;
}

}  // namespace specwire
