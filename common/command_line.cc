#include "common/command_line.h"

#include <filesystem>

#include "absl/flags/internal/parse.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specwire {

std::vector<std::string> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  // absl's default lists only the flags of files named like the program; specwire's flags live
  // in the main and in the shared modules, so --help shows every flag that is not absl's own
  // (--flagfile, --fromenv, ...: those stay under --helpfull).
  config.contains_help_flags = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/flags/");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "specwire";
  config.version_string = [program] { return absl::StrCat(program, " ", SPECWIRE_VERSION, "\n"); };
  absl::SetFlagsUsageConfig(config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  return std::vector<std::string>(positional.begin() + (positional.empty() ? 0 : 1),
                                  positional.end());
}

bool FlagGivenOnCommandLine(absl::string_view name) {
  return absl::flags_internal::WasPresentOnCommandLine(name);
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, absl::string_view flag) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    int64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", part, "\" is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ParseIdSequences(absl::string_view text,
                                                                   absl::string_view flag) {
  std::vector<std::vector<int64_t>> out;
  for (absl::string_view seq : absl::StrSplit(text, ';')) {
    absl::StatusOr<std::vector<int64_t>> ids = ParseIntList(seq, flag);
    if (!ids.ok()) return ids.status();
    out.push_back(*std::move(ids));
  }
  return out;
}

}  // namespace specwire
