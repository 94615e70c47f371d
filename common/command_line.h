// How every specwire binary reads its command line: absl flags (one spelling everywhere,
// snake_case: --max_new_tokens, --tls_ca), verbs and other plain words positional.
//
// Flags are defined next to the code whose options they fill: a binary's own in its main, the
// shared ones once each in an options-from-flags module (common/rpc/server_flags.h,
// clients/cpp/extractor_connection_flags.h, common/request_flags.h, ...) that every main
// needing that concern links. absl refuses unknown flags and bad values with a message naming the
// flag (exit status 1), and --help lists every flag the binary links, its own and the shared ones.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "absl/strings/string_view.h"

namespace specwire {

// Parses argv (absl::ParseCommandLine) with `usage` as the program's usage message (shown by
// --help above the flags), --help listing the flags defined in specwire's sources (not absl's
// own), and --version printing "<program> <SPECWIRE_VERSION>". Exits on --help, --version and on
// flag errors. Returns the positional arguments, argv[0] excluded ("--" ends the flags).
std::vector<std::string> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage);

// Whether --<name> was on the command line ParseCommandLineFlags parsed (a value equal to the
// default counts as given).
bool FlagGivenOnCommandLine(absl::string_view name);

// A flag's comma-separated integers ("1, 2,3"; empty parts skipped). INVALID_ARGUMENT
// "--<flag>: "x" is not an integer".
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text, absl::string_view flag);
// Sequences of ids separated by ';' ("1,2,3;4,5"; empty sequences kept, so a caller can refuse
// them by index).
absl::StatusOr<std::vector<std::vector<int64_t>>> ParseIdSequences(absl::string_view text,
                                                                   absl::string_view flag);

}  // namespace specwire
