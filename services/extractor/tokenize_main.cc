// specwire-tokenize: common/tokenizer from the command line, one JSON document per line.
//
//   specwire-tokenize --tokenizer tokenizer.json [--add_special_tokens] < texts.jsonl
//       {"text": "Hello"}            ->  {"ids": [9707]}
//   specwire-tokenize --tokenizer tokenizer.json --decode [--skip_special_tokens] < ids.jsonl
//       {"ids": [9707]}              ->  {"text": "Hello"}
//   specwire-tokenize --tokenizer tokenizer.json --pre_tokenize < texts.jsonl
//       {"text": "Hello world"}      ->  {"pieces": ["Hello", "Ġworld"]}
//
// A line that fails (bad JSON, invalid UTF-8, unknown id) answers {"error": "..."} so that
// output line i always belongs to input line i; the exit status is then 1. --stats prints the
// time spent inside Encode / Decode (not JSON) to stderr, for benchmarks.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/status.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, tokenizer, "", "tokenizer.json (byte-level BPE). Required.");
ABSL_FLAG(bool, add_special_tokens, false, "Encode: apply the post-processor template (e.g. BOS).");
ABSL_FLAG(bool, decode, false, "Decode ids instead of encoding text.");
ABSL_FLAG(bool, skip_special_tokens, false, "Decode: drop special added tokens.");
ABSL_FLAG(bool, pre_tokenize, false,
          "Print the pre-tokenizer's pieces (byte-level alphabet) instead of ids.");
ABSL_FLAG(bool, stats, false, "Print the time spent in Encode/Decode and token counts to stderr.");

namespace specwire {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] = R"(specwire-tokenize --tokenizer FILE [flags] < lines.jsonl

Reads one JSON object per line on stdin, writes one per line on stdout.
  encode (default): {"text": STRING}  ->  {"ids": [INT, ...]}
  --decode:         {"ids": [INT, ...]}  ->  {"text": STRING}
  --pre_tokenize:   {"text": STRING}  ->  {"pieces": [STRING, ...]} (pre-tokenizer only))";

struct Options {
  std::string tokenizer_path;
  bool add_special_tokens = false;
  bool decode = false;
  bool skip_special_tokens = false;
  bool pre_tokenize = false;
  bool stats = false;
};

absl::StatusOr<Options> OptionsFromFlags(const std::vector<std::string>& args) {
  if (!args.empty()) return absl::InvalidArgumentError("unexpected argument " + args[0]);
  Options options;
  options.tokenizer_path = absl::GetFlag(FLAGS_tokenizer);
  options.add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
  options.decode = absl::GetFlag(FLAGS_decode);
  options.skip_special_tokens = absl::GetFlag(FLAGS_skip_special_tokens);
  options.pre_tokenize = absl::GetFlag(FLAGS_pre_tokenize);
  options.stats = absl::GetFlag(FLAGS_stats);
  if (options.tokenizer_path.empty()) return absl::InvalidArgumentError("--tokenizer is required");
  return options;
}

// One input line -> one output document.
absl::StatusOr<json> HandleLine(const Tokenizer& tokenizer, const Options& options,
                                const std::string& line, double* seconds, int64_t* tokens) {
  const json in = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (in.is_discarded() || !in.is_object()) {
    return absl::InvalidArgumentError("input line is not a JSON object");
  }
  const auto start = std::chrono::steady_clock::now();
  json out;
  if (options.decode) {
    const auto it = in.find("ids");
    if (it == in.end() || !it->is_array()) return absl::InvalidArgumentError("missing \"ids\"");
    std::vector<int64_t> ids;
    for (const json& id : *it) {
      if (!id.is_number_integer()) return absl::InvalidArgumentError("\"ids\" must be integers");
      ids.push_back(id.get<int64_t>());
    }
    SW_ASSIGN_OR_RETURN(std::string text, tokenizer.Decode(ids, options.skip_special_tokens));
    *tokens += static_cast<int64_t>(ids.size());
    out["text"] = std::move(text);
  } else {
    const auto it = in.find("text");
    if (it == in.end() || !it->is_string()) return absl::InvalidArgumentError("missing \"text\"");
    const std::string& text = it->get_ref<const std::string&>();
    if (options.pre_tokenize) {
      SW_ASSIGN_OR_RETURN(std::vector<std::string> pieces, tokenizer.PreTokenize(text));
      *tokens += static_cast<int64_t>(pieces.size());
      out["pieces"] = std::move(pieces);
    } else {
      SW_ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                          tokenizer.Encode(text, options.add_special_tokens));
      *tokens += static_cast<int64_t>(ids.size());
      out["ids"] = std::move(ids);
    }
  }
  *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

int Main(int argc, char** argv) {
  auto options = OptionsFromFlags(ParseCommandLineFlags(argc, argv, kUsage));
  if (!options.ok()) {
    std::cerr << "specwire-tokenize: " << options.status().message() << " (see --help)\n";
    return 2;
  }
  auto tokenizer = Tokenizer::FromFile(options->tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << "specwire-tokenize: " << tokenizer.status().ToString() << "\n";
    return 1;
  }
  std::ios::sync_with_stdio(false);
  bool failed = false;
  double seconds = 0;
  int64_t tokens = 0, lines = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    ++lines;
    auto out = HandleLine(**tokenizer, *options, line, &seconds, &tokens);
    if (!out.ok()) {
      failed = true;
      out = json{{"error", out.status().ToString()}};
    }
    // Decode output is valid UTF-8 (lossy); "replace" only guards against surprises.
    std::cout << out->dump(-1, ' ', false, json::error_handler_t::replace) << '\n' << std::flush;
  }
  if (options->stats) {
    std::cerr << "specwire-tokenize: " << lines << " lines, " << tokens << " tokens, " << seconds
              << " s inside " << (options->decode ? "Decode" : "Encode") << "\n";
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) { return specwire::Main(argc, argv); }
