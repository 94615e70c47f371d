// specwire-cli: the extractor service from the command line.
//
//   specwire-cli info     [--target H:P]
//   specwire-cli extract  --tokens 1,2,3[;4,5] | --tokens-file F | --text S [--text S ...]
//                         --layers 0,3 [--embedding] [--final-norm] --out FILE.safetensors
//   specwire-cli generate --tokens 1,2,3 | --text S  [--max-new-tokens N] [--out FILE ...]
//   specwire-cli health   [--target H:P] [--service NAME]   (exit 0 only when SERVING)
//
// `extract` writes the same file as the offline `specwire-extract extract`: tensors
// seq.{i}.layer.{k}, seq.{i}.embedding, seq.{i}.final_norm, each [T_i, hidden] in the wire dtype,
// with metadata "contract" (JSON) and "token_ids" (JSON list of lists).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/cli/extractor_client.h"
#include "clients/cli/health_check.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

constexpr char kUsage[] = R"(usage: specwire-cli COMMAND [flags]

Commands:
  info       print the extraction contract of the served target (JSON)
  extract    fetch hidden states of sequences and write them to a safetensors file
  generate   greedy completions of prompts, printed as a JSON list; with --out, also the hidden
             states of prompt + completion
  health     grpc.health.v1 check of any specwire server (extractor or scorer): prints the
             status; exit 0 only when SERVING (container and Kubernetes probes)

Flags:
  --target H:P           extractor address                                   [127.0.0.1:50051]
  --timeout S            deadline of the call in seconds; 0: none            [300]
  --service NAME         health: the service to check, e.g. specwire.v1.Scorer; "" is the
                         server as a whole                                   [""]
  --tokens IDS           token ids, comma-separated; sequences separated by ';'
  --tokens-file F        JSON file with a list of token-id lists (instead of --tokens)
  --text S               a text the server tokenizes (repeat for several sequences)
  --add-special-tokens   tokenize --text with the tokenizer's special tokens
  --layers IDS           decoder layer ids k: output of layer k = HF hidden_states[k+1]
  --embedding            also the embedding output (HF hidden_states[0])
  --final-norm           also the final-norm output (HF hidden_states[num_layers])
  --dtype D              wire dtype of the states: bf16 | fp32                [bf16]
  --max-chunk-bytes N    chunk size asked of the server; 0: its default       [0]
  --out FILE             output safetensors file (extract; optional for generate)
  --request-id ID        echoed by the server in its trailer and logs
  --max-new-tokens N     generate: tokens to generate at most                 [32]
  --stop IDS             generate: extra stop token ids
  --ignore-model-eos     generate: do not stop at the model's eos_token_id
  --decode               generate: add the completion's text (server-side detokenizer)
  --tls                  connect with TLS (implied by the three flags below)
  --tls-ca F             PEM CA that signed the server's certificate (default: system roots)
  --tls-client-cert F    PEM client certificate (mTLS), with --tls-client-key F
  --tls-server-name N    name to check the server's certificate against (default: the host)
  --auth-token-file F    bearer token sent with every call; else $SPECWIRE_AUTH_TOKEN, else
                         the file named by $SPECWIRE_AUTH_TOKEN_FILE

Errors print the gRPC status code and message; the exit status is 1 (2 for bad flags).
)";

// Flag name → values in order (only --text may repeat).
using Flags = std::map<std::string, std::vector<std::string>>;

absl::StatusOr<Flags> ParseFlags(int argc, char** argv, int first) {
  static const char* kBool[] = {"embedding",        "final-norm", "add-special-tokens",
                                "ignore-model-eos", "decode",     "help", "tls"};
  static const char* kValued[] = {"target", "timeout",    "tokens",         "tokens-file",
                                  "text",   "layers",     "dtype",          "max-chunk-bytes",
                                  "out",    "request-id", "max-new-tokens", "stop",
                                  "service", "tls-ca", "tls-client-cert", "tls-client-key",
                                  "tls-server-name", "auth-token-file"};
  Flags flags;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (!arg.starts_with("--")) return absl::InvalidArgumentError("unexpected argument " + arg);
    arg = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    bool is_bool = false, is_valued = false;
    for (const char* b : kBool) is_bool |= arg == b;
    for (const char* v : kValued) is_valued |= arg == v;
    if (!is_bool && !is_valued) return absl::InvalidArgumentError("unknown flag --" + arg);
    if (is_bool) {
      if (has_value) return absl::InvalidArgumentError("flag --" + arg + " takes no value");
      value.assign(1, '1');  // (not `= "1"`: GCC 12 warns falsely, -Wrestrict)
    } else if (!has_value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError("flag --" + arg + " needs a value");
      value = argv[++i];
    }
    if (!flags[arg].empty() && arg != "text") {
      return absl::InvalidArgumentError("flag --" + arg + " given twice");
    }
    flags[arg].push_back(value);
  }
  return flags;
}

bool Has(const Flags& f, const std::string& name) { return f.count(name) > 0; }
std::string Get(const Flags& f, const std::string& name, const std::string& fallback = "") {
  return Has(f, name) ? f.at(name).front() : fallback;
}

absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, absl::string_view flag) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", part, "\" is not an integer"));
    }
    ids.push_back(v);
  }
  return ids;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string out;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// The sequences of a request: from exactly one of --tokens, --tokens-file, --text.
absl::StatusOr<std::vector<InputSequence>> ReadInputs(const Flags& f) {
  const int sources = Has(f, "tokens") + Has(f, "tokens-file") + Has(f, "text");
  if (sources != 1) {
    return absl::InvalidArgumentError("give exactly one of --tokens, --tokens-file, --text");
  }
  std::vector<InputSequence> out;
  if (Has(f, "text")) {
    for (const auto& t : f.at("text")) out.push_back(InputSequence::Text(t));
  } else if (Has(f, "tokens-file")) {
    SW_ASSIGN_OR_RETURN(std::string text, ReadFile(Get(f, "tokens-file")));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError("--tokens-file: expected a JSON list of token-id lists");
    }
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_array()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokens-file: entry ", i, " is not a list"));
      }
      std::vector<int64_t> ids;
      for (const auto& v : j[i]) {
        if (!v.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--tokens-file: entry ", i, " holds a non-integer token id"));
        }
        ids.push_back(v.get<int64_t>());
      }
      out.push_back(InputSequence::Tokens(std::move(ids)));
    }
  } else {
    for (absl::string_view s : absl::StrSplit(Get(f, "tokens"), ';', absl::SkipWhitespace())) {
      SW_ASSIGN_OR_RETURN(auto ids, ParseIds(s, "tokens"));
      out.push_back(InputSequence::Tokens(std::move(ids)));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("no sequence given");
  return out;
}

absl::StatusOr<RequestedStates> ReadStates(const Flags& f) {
  RequestedStates s;
  if (Has(f, "layers")) {
    SW_ASSIGN_OR_RETURN(auto ids, ParseIds(Get(f, "layers"), "layers"));
    for (int64_t id : ids) s.layer_ids.push_back(static_cast<int32_t>(id));
  }
  s.embedding = Has(f, "embedding");
  s.final_norm = Has(f, "final-norm");
  return s;
}

absl::StatusOr<DType> ReadDType(const Flags& f) {
  const std::string d = Get(f, "dtype", "bf16");
  if (d == "bf16" || d == "bfloat16") return DType::kBF16;
  if (d == "fp32" || d == "float32") return DType::kF32;
  return absl::InvalidArgumentError(absl::StrCat("--dtype: \"", d, "\" is not bf16 or fp32"));
}

absl::StatusOr<uint32_t> ReadUint(const Flags& f, const std::string& name, uint32_t fallback) {
  if (!Has(f, name)) return fallback;
  uint32_t v;
  if (!absl::SimpleAtoi(Get(f, name), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": \"", Get(f, name), "\" is not a non-negative integer"));
  }
  return v;
}

float ElementAsFloat(const std::byte* p, DType d) {
  if (d == DType::kF32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  // bf16 is the upper half of a float32.
  uint16_t h;
  std::memcpy(&h, p, 2);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

std::string Summary(const ReceivedState& s) {
  double sum = 0, sq = 0;
  const size_t n = static_cast<size_t>(s.rows * s.hidden), size = DTypeSize(s.dtype);
  for (size_t i = 0; i < n; ++i) {
    const double v = ElementAsFloat(s.bytes.data() + i * size, s.dtype);
    sum += v;
    sq += v * v;
  }
  const double mean = n ? sum / n : 0, var = n > 1 ? (sq - n * mean * mean) / (n - 1) : 0;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "  %-28s [%lld, %lld] %-4s  mean %+.5f  std %.5f  |x| %.3f\n",
                s.TensorName().c_str(), static_cast<long long>(s.rows),
                static_cast<long long>(s.hidden), DTypeName(s.dtype), mean,
                std::sqrt(std::max(0.0, var)), std::sqrt(sq));
  return buf;
}

// Writes states as specwire-extract does (`token_ids[i]` are the ids of sequence i) and reports
// the tensors written on `report`.
absl::Status WriteStates(const std::string& path, const std::vector<ReceivedState>& states,
                         const ExtractionContract& contract,
                         const std::vector<std::vector<int64_t>>& token_ids,
                         std::map<std::string, std::string> metadata, std::ostream& report) {
  std::vector<TensorToWrite> out;
  for (const auto& s : states) {
    out.push_back({s.TensorName(), s.dtype, {s.rows, s.hidden}, s.bytes});
  }
  metadata["contract"] = ContractToJson(contract, -1);
  metadata["token_ids"] = nlohmann::json(token_ids).dump();
  SW_RETURN_IF_ERROR(WriteSafetensors(path, out, metadata));
  report << "wrote " << states.size() << " tensor(s) to " << path << ":\n";
  for (const auto& s : states) report << Summary(s);
  return absl::OkStatus();
}

std::string TotalsLine(const StreamTotals& t) {
  char buf[256];
  std::snprintf(
      buf, sizeof(buf),
      "%u sequence(s), %llu tokens, %llu chunks, %.1f MiB; queue %.3f s, compute %.3f s\n",
      t.sequences, static_cast<unsigned long long>(t.tokens),
      static_cast<unsigned long long>(t.chunks), t.bytes / 1048576.0, t.queue_seconds,
      t.compute_seconds);
  return buf;
}

absl::StatusOr<ExtractParams> ExtractParamsFromFlags(const Flags& f) {
  if (!Has(f, "out")) return absl::InvalidArgumentError("--out is required for extract");
  ExtractParams p;
  SW_ASSIGN_OR_RETURN(p.sequences, ReadInputs(f));
  SW_ASSIGN_OR_RETURN(p.states, ReadStates(f));
  SW_ASSIGN_OR_RETURN(p.dtype, ReadDType(f));
  SW_ASSIGN_OR_RETURN(p.max_chunk_bytes, ReadUint(f, "max-chunk-bytes", 0));
  p.request_id = Get(f, "request-id");
  p.add_special_tokens = Has(f, "add-special-tokens");
  return p;
}

absl::StatusOr<GenerateParams> GenerateParamsFromFlags(const Flags& f) {
  GenerateParams p;
  SW_ASSIGN_OR_RETURN(p.prompts, ReadInputs(f));
  SW_ASSIGN_OR_RETURN(p.max_new_tokens, ReadUint(f, "max-new-tokens", 32));
  if (Has(f, "stop")) {
    SW_ASSIGN_OR_RETURN(p.stop_token_ids, ParseIds(Get(f, "stop"), "stop"));
  }
  p.ignore_model_eos = Has(f, "ignore-model-eos");
  SW_ASSIGN_OR_RETURN(p.states, ReadStates(f));
  SW_ASSIGN_OR_RETURN(p.dtype, ReadDType(f));
  SW_ASSIGN_OR_RETURN(p.max_chunk_bytes, ReadUint(f, "max-chunk-bytes", 0));
  p.request_id = Get(f, "request-id");
  p.add_special_tokens = Has(f, "add-special-tokens");
  if (Has(f, "out") && p.states.empty()) {
    return absl::InvalidArgumentError("--out: give --layers, --embedding or --final-norm");
  }
  if (!Has(f, "out") && !p.states.empty()) {
    return absl::InvalidArgumentError("states requested but no --out to write them to");
  }
  return p;
}

absl::Status RunExtract(ExtractorClient& client, const ExtractParams& p, const std::string& out) {
  SW_ASSIGN_OR_RETURN(ExtractReply reply, client.Extract(p));
  std::cout << reply.contract.architecture << " (" << reply.contract.num_layers << " layers, "
            << reply.contract.compute_dtype << "): " << TotalsLine(reply.totals);
  return WriteStates(out, reply.states, reply.contract, reply.token_ids, {}, std::cout);
}

// stdout gets the completions as JSON, and nothing else (so it pipes into jq); the report of the
// file written goes to stderr.
absl::Status RunGenerate(ExtractorClient& client, const GenerateParams& p, const std::string& out,
                         bool decode) {
  SW_ASSIGN_OR_RETURN(GenerateReply reply, client.Generate(p));
  std::vector<std::string> texts;
  if (decode) {
    std::vector<std::vector<int64_t>> ids;
    for (const auto& c : reply.completions) ids.push_back(c.completion_token_ids);
    SW_ASSIGN_OR_RETURN(texts, client.Detokenize(ids, /*skip_special_tokens=*/false));
  }
  nlohmann::json completions = nlohmann::json::array();
  for (size_t i = 0; i < reply.completions.size(); ++i) {
    const ReceivedCompletion& c = reply.completions[i];
    nlohmann::json j = {{"sequence_index", c.sequence_index},
                        {"prompt_token_ids", c.prompt_token_ids},
                        {"completion_token_ids", c.completion_token_ids},
                        {"finish_reason", c.finish_reason}};
    if (i < texts.size()) j["completion_text"] = texts[i];
    completions.push_back(std::move(j));
  }
  if (!out.empty()) {
    // The states cover prompt + completion, so the file's token ids do too.
    std::vector<std::vector<int64_t>> token_ids(reply.completions.size());
    for (const ReceivedCompletion& c : reply.completions) {
      auto& ids = token_ids[c.sequence_index];
      ids = c.prompt_token_ids;
      ids.insert(ids.end(), c.completion_token_ids.begin(), c.completion_token_ids.end());
    }
    std::cerr << reply.contract.architecture << ": " << TotalsLine(reply.totals);
    SW_RETURN_IF_ERROR(WriteStates(out, reply.states, reply.contract, token_ids,
                                   {{"completions", completions.dump()}}, std::cerr));
  }
  std::cout << completions.dump() << "\n";
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  auto fail = [](const absl::Status& s, int code) {
    std::cerr << "specwire-cli: " << absl::StatusCodeToString(s.code()) << ": " << s.message()
              << "\n";
    return code;
  };
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  auto flags = ParseFlags(argc, argv, 2);
  if (!flags.ok()) return fail(flags.status(), 2);
  const Flags& f = *flags;
  if (Has(f, "help")) {
    std::cout << kUsage;
    return 0;
  }
  if (command != "info" && command != "extract" && command != "generate" &&
      command != "health") {
    return fail(absl::InvalidArgumentError("unknown command " + command + " (see --help)"), 2);
  }
  // Every flag is checked before the first call.
  absl::StatusOr<ExtractParams> extract;
  absl::StatusOr<GenerateParams> generate;
  if (command == "extract") {
    extract = ExtractParamsFromFlags(f);
    if (!extract.ok()) return fail(extract.status(), 2);
  } else if (command == "generate") {
    generate = GenerateParamsFromFlags(f);
    if (!generate.ok()) return fail(generate.status(), 2);
  }
  ExtractorClientOptions options;
  options.target = Get(f, "target", options.target);
  if (!absl::SimpleAtod(Get(f, "timeout", "300"), &options.timeout_seconds) ||
      options.timeout_seconds < 0) {
    return fail(absl::InvalidArgumentError("--timeout: \"" + Get(f, "timeout") +
                                           "\" is not a non-negative number of seconds"),
                2);
  }
  ClientSecurityFiles security_files;
  security_files.tls = Has(f, "tls");
  security_files.ca_file = Get(f, "tls-ca");
  security_files.cert_file = Get(f, "tls-client-cert");
  security_files.key_file = Get(f, "tls-client-key");
  security_files.server_name = Get(f, "tls-server-name");
  security_files.token_file = Get(f, "auth-token-file");
  security_files.dashed = true;
  auto security = LoadClientSecurity(security_files);
  if (!security.ok()) return fail(security.status(), 2);
  options.security = *std::move(security);
  if (command == "health") {
    auto status =
        CheckHealth(options.target, Get(f, "service"), options.timeout_seconds, options.security);
    if (!status.ok()) return fail(status.status(), 1);
    std::cout << ServingStatusName(*status) << "\n";
    return *status == ServingStatus::kServing ? 0 : 1;
  }
  ExtractorClient client(options);
  absl::Status s;
  if (command == "info") {
    auto c = client.Info();
    if (c.ok()) std::cout << ContractToJson(*c) << "\n";
    s = c.status();
  } else if (command == "extract") {
    s = RunExtract(client, *extract, Get(f, "out"));
  } else {
    s = RunGenerate(client, *generate, Get(f, "out"), Has(f, "decode"));
  }
  return s.ok() ? 0 : fail(s, 1);
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) { return specwire::Main(argc, argv); }
