// Split regexes: PCRE2 with the semantics of Oniguruma (tokenizers/src/utils/onig.rs).
#include "common/tokenizer/split_regex.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer/utf8.h"

namespace specwire::tokenizer_internal {
namespace {

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

}  // namespace

absl::StatusOr<std::unique_ptr<SplitRegex>> SplitRegex::Compile(absl::string_view pattern,
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

SplitRegex::~SplitRegex() { pcre2_code_free(code_); }

absl::Status SplitRegex::FindAll(absl::string_view text,
                                 std::vector<std::pair<size_t, size_t>>* out) const {
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

}  // namespace specwire::tokenizer_internal
