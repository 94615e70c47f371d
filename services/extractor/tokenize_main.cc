// specwire-tokenize: common/tokenizer from the command line, one JSON document per line.
//
//   specwire-tokenize --tokenizer tokenizer.json [--add-special-tokens] < texts.jsonl
//       {"text": "Hello"}            ->  {"ids": [9707]}
//   specwire-tokenize --tokenizer tokenizer.json --decode [--skip-special-tokens] < ids.jsonl
//       {"ids": [9707]}              ->  {"text": "Hello"}
//   specwire-tokenize --tokenizer tokenizer.json --pre-tokenize < texts.jsonl
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

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] = R"(usage: specwire-tokenize --tokenizer FILE [flags] < lines.jsonl

Reads one JSON object per line on stdin, writes one per line on stdout.
  encode (default): {"text": STRING}  ->  {"ids": [INT, ...]}
  --decode:         {"ids": [INT, ...]}  ->  {"text": STRING}
  --pre-tokenize:   {"text": STRING}  ->  {"pieces": [STRING, ...]} (pre-tokenizer only)

Flags:
  --tokenizer FILE        tokenizer.json (byte-level BPE)                     [required]
  --add-special-tokens    encode: apply the post-processor template (e.g. BOS)
  --decode                decode ids instead of encoding text
  --skip-special-tokens   decode: drop special added tokens
  --pre-tokenize          print the pre-tokenizer's pieces (byte-level alphabet) instead of ids
  --stats                 print time spent in Encode/Decode and token counts to stderr
)";

struct Options {
  std::string tokenizer_path;
  bool add_special_tokens = false;
  bool decode = false;
  bool skip_special_tokens = false;
  bool pre_tokenize = false;
  bool stats = false;
};

absl::StatusOr<Options> ParseFlags(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokenizer" && i + 1 < argc) {
      options.tokenizer_path = argv[++i];
    } else if (arg.starts_with("--tokenizer=")) {
      options.tokenizer_path = arg.substr(std::string("--tokenizer=").size());
    } else if (arg == "--add-special-tokens") {
      options.add_special_tokens = true;
    } else if (arg == "--decode") {
      options.decode = true;
    } else if (arg == "--skip-special-tokens") {
      options.skip_special_tokens = true;
    } else if (arg == "--pre-tokenize") {
      options.pre_tokenize = true;
    } else if (arg == "--stats") {
      options.stats = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", arg));
    }
  }
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
  auto options = ParseFlags(argc, argv);
  if (!options.ok()) {
    std::cerr << options.status().message() << "\n" << kUsage;
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
