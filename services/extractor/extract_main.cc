// specwire-extract: the extraction engine from the command line (offline use, tests, the demo).
//
//   specwire-extract info     --model DIR [--dtype D] [--device-map M]
//   specwire-extract extract  --model DIR --tokens 1,2,3[;4,5] --layers 0,3 [--embedding]
//                             [--final-norm] --out FILE.safetensors [--out-dtype D]
//   specwire-extract generate --model DIR --tokens 1,2,3 --max-new-tokens N [--stop 7,8]
//                             [--no-config-eos]
//
// `extract` writes tensors named seq.{i}.layer.{k}, seq.{i}.embedding and seq.{i}.final_norm, each
// [T_i, hidden]; the metadata holds the extraction contract (key "contract") and the token ids.
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <ATen/Parallel.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/models/torch_util.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/extractor/engine.h"

namespace specwire {
namespace {

constexpr char kUsage[] = R"(usage: specwire-extract COMMAND [flags]

Commands:
  info       load the model and print its extraction contract (JSON)
  extract    write hidden states of token sequences to a safetensors file
  generate   greedy completion of a prompt; prints JSON {"tokens": [...], "finish_reason": ...}

Flags:
  --model DIR          checkpoint directory (config.json + *.safetensors)       [required]
  --dtype D            compute dtype: float32 | bfloat16 | float16              [float32]
  --device-map M       cpu | cuda | cuda:0,cuda:1 | cuda:0=0-31,cuda:1=32-63   [cpu]
  --tokens IDS         token ids, comma-separated; sequences separated by ';'
  --tokens-file F      JSON file with a list of token-id lists (instead of --tokens)
  --layers IDS         decoder layer ids k to capture: output of layer k = HF hidden_states[k+1]
  --embedding          also capture the embedding output (HF hidden_states[0])
  --final-norm         also capture the final-norm output (HF hidden_states[num_layers])
  --out FILE           output safetensors file (extract)
  --out-dtype D        dtype of the written states: float32 | bfloat16 | float16 [float32]
  --max-new-tokens N   generate: tokens to generate at most                      [32]
  --stop IDS           generate: extra stop token ids
  --no-config-eos      generate: do not stop at the model's eos_token_id (from
                       generation_config.json when present, else config.json)
  --threads N          intra-op CPU threads                                      [torch default]
)";

using Flags = std::map<std::string, std::string>;

absl::StatusOr<Flags> ParseFlags(int argc, char** argv, int first) {
  static const char* kBoolFlags[] = {"embedding", "final-norm", "no-config-eos", "help"};
  Flags flags;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (!arg.starts_with("--")) return absl::InvalidArgumentError("unexpected argument " + arg);
    arg = arg.substr(2);
    if (auto eq = arg.find('='); eq != std::string::npos) {
      flags[arg.substr(0, eq)] = arg.substr(eq + 1);
      continue;
    }
    bool is_bool = false;
    for (const char* b : kBoolFlags) is_bool |= arg == b;
    if (is_bool) {
      flags[arg] = "1";
    } else if (i + 1 < argc) {
      flags[arg] = argv[++i];
    } else {
      return absl::InvalidArgumentError("flag --" + arg + " needs a value");
    }
  }
  return flags;
}

absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, absl::string_view flag) {
  std::vector<int64_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", part, "\" is not an integer"));
    }
    ids.push_back(v);
  }
  return ids;
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ReadSequences(const Flags& f) {
  std::vector<std::vector<int64_t>> seqs;
  if (f.count("tokens-file")) {
    SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(f.at("tokens-file")));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError("--tokens-file: expected a JSON list of token-id lists");
    }
    for (const auto& s : j) {
      std::vector<int64_t> ids;
      if (!s.is_array()) return absl::InvalidArgumentError("--tokens-file: each entry must be a list");
      for (const auto& v : s) {
        if (!v.is_number_integer()) {
          return absl::InvalidArgumentError("--tokens-file: token ids must be integers");
        }
        ids.push_back(v.get<int64_t>());
      }
      seqs.push_back(std::move(ids));
    }
  } else if (f.count("tokens")) {
    for (absl::string_view s : absl::StrSplit(f.at("tokens"), ';')) {
      if (absl::StripAsciiWhitespace(s).empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--tokens: sequence ", seqs.size(), " is empty"));
      }
      SW_ASSIGN_OR_RETURN(auto ids, ParseIds(s, "tokens"));
      seqs.push_back(std::move(ids));
    }
  } else {
    return absl::InvalidArgumentError("give --tokens or --tokens-file");
  }
  return seqs;
}

std::string Summary(const std::string& name, const at::Tensor& t) {
  at::Tensor f = t.to(at::kFloat);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "  %-28s [%lld, %lld]  mean %+.5f  std %.5f  |x| %.3f\n",
                name.c_str(), static_cast<long long>(t.size(0)), static_cast<long long>(t.size(1)),
                f.mean().item<double>(), f.std().item<double>(), f.norm().item<double>());
  return buf;
}

absl::Status Run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return absl::OkStatus();
  }
  const std::string command = argv[1];
  SW_ASSIGN_OR_RETURN(Flags f, ParseFlags(argc, argv, 2));
  if (f.count("help")) {
    std::cout << kUsage;
    return absl::OkStatus();
  }
  if (!f.count("model")) return absl::InvalidArgumentError("--model is required");
  if (f.count("threads")) {
    int n;
    if (!absl::SimpleAtoi(f.at("threads"), &n) || n <= 0) {
      return absl::InvalidArgumentError("--threads must be a positive integer");
    }
    at::set_num_threads(n);
  }
  KeepFreedMemoryForReuse();
  LoadOptions load;
  SW_ASSIGN_OR_RETURN(load.dtype, ParseComputeDtype(f.count("dtype") ? f.at("dtype") : "float32"));
  if (f.count("device-map")) load.device_map = f.at("device-map");
  SW_ASSIGN_OR_RETURN(auto engine, ExtractionEngine::Load(f.at("model"), load));

  if (command == "info") {
    std::cout << ContractToJson(engine->contract()) << "\n";
    return absl::OkStatus();
  }
  if (command == "generate") {
    SW_ASSIGN_OR_RETURN(auto seqs, ReadSequences(f));
    GenerateOptions opts;
    if (f.count("max-new-tokens") && !absl::SimpleAtoi(f.at("max-new-tokens"), &opts.max_new_tokens)) {
      return absl::InvalidArgumentError("--max-new-tokens must be an integer");
    } else if (!f.count("max-new-tokens")) {
      opts.max_new_tokens = 32;
    }
    if (f.count("stop")) {
      SW_ASSIGN_OR_RETURN(opts.stop_token_ids, ParseIds(f.at("stop"), "stop"));
    }
    opts.use_config_eos = !f.count("no-config-eos");
    nlohmann::json results = nlohmann::json::array();
    for (const auto& prompt : seqs) {
      SW_ASSIGN_OR_RETURN(GenerateResult r, engine->Generate(prompt, opts));
      results.push_back({{"tokens", r.tokens}, {"finish_reason", r.finish_reason}});
    }
    std::cout << (results.size() == 1 ? results[0] : results).dump() << "\n";
    return absl::OkStatus();
  }
  if (command != "extract") return absl::InvalidArgumentError("unknown command " + command);

  SW_ASSIGN_OR_RETURN(auto seqs, ReadSequences(f));
  CaptureSpec capture;
  if (f.count("layers")) {
    SW_ASSIGN_OR_RETURN(capture.layers, ParseIds(f.at("layers"), "layers"));
  }
  capture.embedding = f.count("embedding") > 0;
  capture.final_norm = f.count("final-norm") > 0;
  if (!f.count("out")) return absl::InvalidArgumentError("--out is required for extract");
  SW_ASSIGN_OR_RETURN(at::ScalarType out_dtype,
                      ParseComputeDtype(f.count("out-dtype") ? f.at("out-dtype") : "float32"));
  SW_ASSIGN_OR_RETURN(auto states, engine->Extract(seqs, capture, out_dtype));

  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string p = absl::StrCat("seq.", i, ".");
    if (states[i].embedding.defined()) named.emplace_back(p + "embedding", states[i].embedding);
    for (const auto& [id, t] : states[i].layers) named.emplace_back(absl::StrCat(p, "layer.", id), t);
    if (states[i].final_norm.defined()) named.emplace_back(p + "final_norm", states[i].final_norm);
  }
  std::vector<TensorToWrite> out;
  SW_ASSIGN_OR_RETURN(DType wire, FromScalarType(out_dtype));
  for (const auto& [name, t] : named) {
    out.push_back({name, wire, t.sizes().vec(),
                   std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  nlohmann::json token_meta = seqs;
  SW_RETURN_IF_ERROR(WriteSafetensors(f.at("out"), out,
                                      {{"contract", ContractToJson(engine->contract(), -1)},
                                       {"token_ids", token_meta.dump()}}));
  std::cout << "contract:\n" << ContractToJson(engine->contract()) << "\n";
  std::cout << "wrote " << named.size() << " tensor(s) to " << f.at("out") << ":\n";
  for (const auto& [name, t] : named) std::cout << Summary(name, t);
  return absl::OkStatus();
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  absl::Status s = specwire::Run(argc, argv);
  if (!s.ok()) {
    std::cerr << "specwire-extract: " << s.ToString() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
