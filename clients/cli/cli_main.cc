// specwire-cli: the extractor service from the command line.
//
//   specwire-cli info     [--extractor H:P]
//   specwire-cli extract  --tokens 1,2,3[;4,5] | --tokens_file F | --text S | --prompts_file F
//                         --layers 0,3 [--embedding] [--final_norm] --out FILE.safetensors
//   specwire-cli generate --tokens 1,2,3 | --text S  [--max_new_tokens N] [--out FILE ...]
//   specwire-cli health   [--extractor H:P | --scorer H:P] [--service NAME]
//                         (exit 0 only when SERVING)
//   specwire-cli fingerprint [--compare A.json[,B.json]]
//                         (the served target's canary fingerprint; --compare: exit 1 on drift)
//   specwire-cli export   --dataset F.jsonl --format specforge|speculators --layout dflash|eagle3
//                         [--layers 1,3 | --drafter DIR] [--wire_dtype bf16|fp32] --out DIR
//
// The connection flags are the shared sets (clients/cpp/extractor_connection_flags.h,
// scorer_connection_flags.h), spelled as in specwire-scorer and specwire-score: --extractor,
// --extractor_tls_ca, --extractor_timeout, ...; health probes a scorer through --scorer*.
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

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/cli/feature_export.h"
#include "clients/cpp/extractor_client.h"
#include "clients/cpp/extractor_connection_flags.h"
#include "clients/cpp/health_check.h"
#include "clients/cpp/scorer_connection_flags.h"
#include "common/checkpoint.h"
#include "common/command_line.h"
#include "common/contract.h"
#include "common/memory_policy.h"
#include "common/request_flags.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/wire.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(bool, add_special_tokens, false,
          "Tokenize text prompts with the tokenizer's special tokens.");
ABSL_FLAG(std::string, wire_dtype, "bf16",
          "Dtype of the states on the wire: bf16 | fp32 | auto (the served target's compute "
          "dtype: fp32 for a float32 target, bf16 otherwise).");
ABSL_FLAG(uint32_t, chunk_bytes, 0, "Chunk size asked of the server; 0: its default.");
ABSL_FLAG(std::string, out, "",
          "Output safetensors file (extract; optional for generate); export: the directory.");
ABSL_FLAG(std::string, request_id, "", "Echoed by the server in its trailer and logs.");
ABSL_FLAG(uint32_t, max_new_tokens, 32, "generate: tokens to generate at most.");
ABSL_FLAG(bool, decode, false, "generate: add the completion's text (the server's detokenizer).");
ABSL_FLAG(std::string, dataset, "",
          "export: JSONL of prepared lines {\"input_ids\": [...], \"loss_mask\": [...], "
          "\"chat_template\": {...}}; loss_mask optional (every token supervised).");
ABSL_FLAG(std::string, format, "", "export: specforge | speculators (the trainer's offline layout).");
ABSL_FLAG(std::string, layout, "", "export: dflash | eagle3 (which states, concatenated how).");
ABSL_FLAG(std::string, drafter, "",
          "export: drafter directory whose config.json names the layers (dflash_config."
          "target_layer_ids, or eagle_aux_hidden_state_layer_ids); --layers overrides it.");
ABSL_FLAG(uint32_t, sequences_per_request, 8, "export: sequences sent in one Extract call.");
ABSL_FLAG(std::string, compare, "",
          "fingerprint: A.json (against the served target) or A.json,B.json (two saved ones).");
ABSL_FLAG(std::string, service, "",
          "health: the service to check, e.g. specwire.v1.Scorer; \"\" is the server as a whole.");

namespace specwire {
namespace {

constexpr char kUsage[] = R"(specwire-cli COMMAND [flags]

Commands:
  info       print the extraction contract of the served target (JSON)
  extract    fetch hidden states of sequences and write them to a safetensors file
  generate   greedy completions of prompts, printed as a JSON list; with --out, also the hidden
             states of prompt + completion
  fingerprint
             the served target's canary fingerprint (statistics of every tap on a fixed input,
             from its contract) as JSON; --compare A.json compares a saved one (a fingerprint,
             contract or scorer report) with the served target, --compare A.json,B.json two
             saved ones: a table per tap, exit 1 on drift or mismatch
  export     extract a dataset's features and write them as SpecForge's or speculators' offline
             dataset (--format, --layout dflash|eagle3, --layers or --drafter, --out DIR), with
             the extraction contract in DIR/specwire_export.json
  health     grpc.health.v1 check of any specwire server: the extractor (--extractor*, the
             default) or a scorer (--scorer*); prints the status; exit 0 only when SERVING
             (container and Kubernetes probes)

The extractor is --extractor (default 127.0.0.1:50051; deadline --extractor_timeout, default
300 s). Errors print the gRPC status code and message; the exit status is 1 (2 for bad flags).)";

// The sequences of a request: from exactly one of --tokens, --tokens_file, --text,
// --prompts_file.
absl::StatusOr<std::vector<InputSequence>> ReadInputs() {
  if (TokenSourcesGiven() + PromptSourcesGiven() != 1) {
    return absl::InvalidArgumentError(
        "give exactly one of --tokens, --tokens_file, --text, --prompts_file");
  }
  std::vector<InputSequence> out;
  if (PromptSourcesGiven() == 1) {
    SW_ASSIGN_OR_RETURN(out, TextPromptsFromFlags());
  } else {
    SW_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> seqs, TokenSequencesFromFlags());
    for (std::vector<int64_t>& ids : seqs) out.push_back(InputSequence::Tokens(std::move(ids)));
  }
  if (out.empty()) return absl::InvalidArgumentError("no sequence given");
  return out;
}

// --wire_dtype; "auto" follows the served target's compute dtype, so it needs the contract
// (one GetModelInfo call, made only then).
absl::StatusOr<DType> ResolveWireDType(ExtractorClient& client) {
  const std::string name = absl::GetFlag(FLAGS_wire_dtype);
  std::string compute_dtype;
  if (name == "auto") {
    SW_ASSIGN_OR_RETURN(ExtractionContract contract, client.Info());
    compute_dtype = contract.compute_dtype;
  }
  return ParseWireDType(name, compute_dtype);
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

// Both build everything but the wire dtype, which "auto" resolves against the server
// (ResolveWireDType); its spelling is checked here, before any call.
absl::StatusOr<ExtractParams> ExtractParamsFromFlags() {
  if (absl::GetFlag(FLAGS_out).empty()) {
    return absl::InvalidArgumentError("--out is required for extract");
  }
  ExtractParams p;
  SW_ASSIGN_OR_RETURN(p.sequences, ReadInputs());
  SW_ASSIGN_OR_RETURN(p.states, StatesFromFlags());
  SW_ASSIGN_OR_RETURN(p.dtype, ParseWireDType(absl::GetFlag(FLAGS_wire_dtype), ""));
  p.max_chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  p.request_id = absl::GetFlag(FLAGS_request_id);
  p.add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
  return p;
}

absl::StatusOr<GenerateParams> GenerateParamsFromFlags() {
  GenerateParams p;
  SW_ASSIGN_OR_RETURN(p.prompts, ReadInputs());
  p.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  SW_ASSIGN_OR_RETURN(StopFlags stop, StopFromFlags());
  p.stop_token_ids = std::move(stop.stop_token_ids);
  p.ignore_model_eos = !stop.use_model_eos;
  SW_ASSIGN_OR_RETURN(p.states, StatesFromFlags());
  SW_ASSIGN_OR_RETURN(p.dtype, ParseWireDType(absl::GetFlag(FLAGS_wire_dtype), ""));
  p.max_chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  p.request_id = absl::GetFlag(FLAGS_request_id);
  p.add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
  const bool out = !absl::GetFlag(FLAGS_out).empty();
  if (out && p.states.empty()) {
    return absl::InvalidArgumentError("--out: give --layers, --embedding or --final_norm");
  }
  if (!out && !p.states.empty()) {
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

struct ExportFlags {
  ExportSpec spec;
  std::vector<ExportRow> rows;
  nlohmann::json drafter;  // null without --drafter
  bool layers_given = false;
  std::string out;
};

absl::StatusOr<ExportFlags> ExportFlagsFromFlags() {
  ExportFlags f;
  f.spec.format = absl::GetFlag(FLAGS_format);
  f.spec.layout = absl::GetFlag(FLAGS_layout);
  SW_RETURN_IF_ERROR(CheckFormatAndLayout(f.spec.format, f.spec.layout));
  f.out = absl::GetFlag(FLAGS_out);
  if (f.out.empty()) return absl::InvalidArgumentError("--out: give the export's directory");
  if (absl::GetFlag(FLAGS_dataset).empty()) return absl::InvalidArgumentError("--dataset is required for export");
  SW_ASSIGN_OR_RETURN(StateSelection states, StatesFromFlags());
  if (states.embedding || states.final_norm) {
    return absl::InvalidArgumentError("--embedding / --final_norm: export takes the layout's states "
                                      "(--layout, --layers)");
  }
  f.spec.layer_ids.assign(states.layer_ids.begin(), states.layer_ids.end());
  f.layers_given = !states.layer_ids.empty();
  if (const std::string d = absl::GetFlag(FLAGS_drafter); !d.empty()) {
    SW_ASSIGN_OR_RETURN(const ConfigFile config, ReadConfigFile(d));
    f.drafter = nlohmann::json::parse(config.text, nullptr, false);
    if (f.drafter.is_discarded() || !f.drafter.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--drafter: ", config.path, " is not a JSON object"));
    }
  }
  SW_ASSIGN_OR_RETURN(f.rows, ReadExportDataset(absl::GetFlag(FLAGS_dataset)));
  return f;
}

absl::Status RunExport(ExtractorClient& client, ExportFlags& f) {
  SW_ASSIGN_OR_RETURN(ExtractionContract contract, client.Info());
  SW_ASSIGN_OR_RETURN(f.spec.dtype, ResolveWireDType(client));
  if (!f.layers_given) {
    SW_ASSIGN_OR_RETURN(f.spec.layer_ids,
                        DefaultExportLayers(f.spec.layout, contract.num_layers,
                                            f.drafter.is_null() ? nullptr : &f.drafter));
  }
  SW_RETURN_IF_ERROR(CheckExportLayers(f.spec.layout, f.spec.layer_ids, contract.num_layers));
  ExportOptions options;
  options.sequences_per_request = absl::GetFlag(FLAGS_sequences_per_request);
  options.max_chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  options.source = absl::GetFlag(FLAGS_dataset);
  return ExportFeatures(client, contract, f.spec, f.rows, f.out, options, std::cout);
}

absl::StatusOr<CanaryFingerprint> ReadCanary(const std::string& path) {
  SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto c = CanaryFromJson(text);
  if (!c.ok()) return absl::InvalidArgumentError(absl::StrCat("--compare: ", path, ": ", c.status().message()));
  return c;
}

// Prints the comparison table; OK when the two are identical or rounding-level apart.
absl::StatusOr<bool> PrintComparison(const CanaryFingerprint& a, const CanaryFingerprint& b) {
  const FingerprintComparison c = CompareFingerprints(a, b);
  if (!c.problem.empty()) {
    std::cout << "mismatch: " << c.problem << "\n";
    return false;
  }
  char line[160];
  std::snprintf(line, sizeof(line), "%-14s %12s %12s  %s\n", "tap", "rms rel", "sketch rel",
                "verdict");
  std::cout << line;
  for (const TapComparison& t : c.taps) {
    std::snprintf(line, sizeof(line), "%-14s %12.3e %12.3e  %s\n", t.tap.c_str(), t.rms_relative,
                  t.sketch_relative, t.level.c_str());
    std::cout << line;
  }
  std::cout << "verdict: " << c.level << " (rounding threshold " << c.threshold << ", compute "
            << a.compute_dtype << " vs " << b.compute_dtype << ")\n";
  return c.level == "identical" || c.level == "rounding";
}

// "specwire-cli: CODE: message" on stderr; returns the exit status `code`.
int Fail(const absl::Status& s, int code) {
  std::cerr << "specwire-cli: " << absl::StatusCodeToString(s.code()) << ": " << s.message()
            << "\n";
  return code;
}

// health: the extractor (the default) or, with --scorer, a scorer.
int RunHealth(const ExtractorConnection& extractor) {
  auto scorer = ScorerConnectionFromFlags();
  if (!scorer.ok()) return Fail(scorer.status(), 2);
  std::string target = extractor.address;
  double timeout = extractor.client.timeout_seconds;
  ClientSecurity security = extractor.client.security;
  if (!scorer->address.empty()) {
    target = scorer->address;
    timeout = scorer->timeout_seconds;
    security = scorer->security;
  }
  auto status = CheckHealth(target, absl::GetFlag(FLAGS_service), timeout, security);
  if (!status.ok()) return Fail(status.status(), 1);
  std::cout << ServingStatusName(*status) << "\n";
  return *status == ServingStatus::kServing ? 0 : 1;
}

int Main(int argc, char** argv) {
  const std::vector<std::string> args = ParseCommandLineFlags(argc, argv, kUsage);
  KeepFreedMemoryForReuse();  // it reads hidden-state streams
  if (args.size() != 1) {
    return Fail(absl::InvalidArgumentError(
                    args.empty() ? "give a command: info, extract, generate, export, fingerprint or health (see --help)"
                                 : "unexpected argument " + args[1]),
                2);
  }
  const std::string& command = args[0];
  if (command != "info" && command != "extract" && command != "generate" && command != "health" &&
      command != "export" && command != "fingerprint") {
    return Fail(absl::InvalidArgumentError("unknown command " + command + " (see --help)"), 2);
  }
  // Every flag is checked before the first call.
  absl::StatusOr<ExtractParams> extract;
  absl::StatusOr<GenerateParams> generate;
  absl::StatusOr<ExportFlags> export_flags;
  if (command == "export") {
    export_flags = ExportFlagsFromFlags();
    if (!export_flags.ok()) return Fail(export_flags.status(), 2);
    if (absl::GetFlag(FLAGS_wire_dtype) != "auto") {
      auto d = ParseWireDType(absl::GetFlag(FLAGS_wire_dtype), "");
      if (!d.ok()) return Fail(d.status(), 2);
    }
  } else if (command == "extract") {
    extract = ExtractParamsFromFlags();
    if (!extract.ok()) return Fail(extract.status(), 2);
  } else if (command == "generate") {
    generate = GenerateParamsFromFlags();
    if (!generate.ok()) return Fail(generate.status(), 2);
  }
  std::vector<std::string> compare;
  if (command == "fingerprint") {
    for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_compare), ',', absl::SkipEmpty())) {
      compare.emplace_back(f);
    }
    if (compare.size() > 2) return Fail(absl::InvalidArgumentError("--compare: one or two files"), 2);
    if (compare.size() == 2) {
      auto a = ReadCanary(compare[0]);
      if (!a.ok()) return Fail(a.status(), 2);
      auto b = ReadCanary(compare[1]);
      if (!b.ok()) return Fail(b.status(), 2);
      auto ok = PrintComparison(*a, *b);
      return ok.ok() && *ok ? 0 : 1;
    }
  }
  auto connection =
      ExtractorConnectionFromFlags({.address = "127.0.0.1:50051", .timeout_seconds = 300});
  if (!connection.ok()) return Fail(connection.status(), 2);
  if (command == "health") return RunHealth(*connection);
  if (absl::StrContains(connection->address, ',')) {
    return Fail(
        absl::InvalidArgumentError("--extractor: specwire-cli talks to one extractor (host:port or "
                                   "dns:///name:port), not a list"),
        2);
  }
  ExtractorClient client(connection->client);
  absl::Status s;
  if (command == "info") {
    auto c = client.Info();
    if (c.ok()) std::cout << ContractToJson(*c) << "\n";
    s = c.status();
  } else if (command == "fingerprint") {
    auto c = client.Info();
    s = c.status();
    if (c.ok() && compare.empty()) {
      nlohmann::json out = {{"architecture", c->architecture},
                            {"weights_digest", c->weights_digest},
                            {"compute_dtype", c->compute_dtype},
                            {"kernel_variant", c->kernel_variant},
                            {"canary", nlohmann::json::parse(CanaryToJson(c->canary))}};
      std::cout << out.dump(2) << "\n";
    } else if (c.ok()) {
      auto a = ReadCanary(compare[0]);
      if (!a.ok()) return Fail(a.status(), 2);
      auto ok = PrintComparison(*a, c->canary);
      return ok.ok() && *ok ? 0 : 1;
    }
  } else if (command == "export") {
    s = RunExport(client, *export_flags);
  } else if (command == "extract") {
    auto dtype = ResolveWireDType(client);
    s = dtype.status();
    if (dtype.ok()) {
      extract->dtype = *dtype;
      s = RunExtract(client, *extract, absl::GetFlag(FLAGS_out));
    }
  } else {
    auto dtype = ResolveWireDType(client);
    s = dtype.status();
    if (dtype.ok()) {
      generate->dtype = *dtype;
      s = RunGenerate(client, *generate, absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_decode));
    }
  }
  return s.ok() ? 0 : Fail(s, 1);
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) { return specwire::Main(argc, argv); }
