// specwire-extract: the extraction engine from the command line (offline use, tests, the demo).
//
//   specwire-extract info     --model DIR [--dtype D] [--device_map M]
//   specwire-extract extract  --model DIR --tokens 1,2,3[;4,5] --layers 0,3 [--embedding]
//                             [--final_norm] --out FILE.safetensors [--out_dtype D]
//   specwire-extract generate --model DIR --tokens 1,2,3 --max_new_tokens N [--stop 7,8]
//                             [--ignore_model_eos]
//
// `extract` writes tensors named seq.{i}.layer.{k}, seq.{i}.embedding and seq.{i}.final_norm, each
// [T_i, hidden]; the metadata holds the extraction contract (key "contract") and the token ids.
#include <ATen/Parallel.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "common/models/engine.h"
#include "common/models/kernel_set.h"
#include "common/models/target_flags.h"
#include "common/models/torch_util.h"
#include "common/request_flags.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "Checkpoint directory (config.json + *.safetensors). Required.");
ABSL_FLAG(std::string, out, "", "extract: output safetensors file.");
ABSL_FLAG(std::string, out_dtype, "float32",
          "extract: dtype of the written states: float32 | bfloat16 | float16.");
ABSL_FLAG(int64_t, max_new_tokens, 32, "generate: tokens to generate at most.");

namespace specwire {
namespace {

constexpr char kUsage[] = R"(specwire-extract COMMAND --model DIR [flags]

Commands:
  info       load the model and print its extraction contract (JSON)
  extract    write hidden states of token sequences to a safetensors file
  generate   greedy completion of a prompt; prints JSON {"tokens": [...], "finish_reason": ...})";

// The sequences of --tokens / --tokens_file (one of them is required).
absl::StatusOr<std::vector<std::vector<int64_t>>> ReadSequences() {
  if (TokenSourcesGiven() == 0) return absl::InvalidArgumentError("give --tokens or --tokens_file");
  return TokenSequencesFromFlags();
}

std::string Summary(const std::string& name, const at::Tensor& t) {
  at::Tensor f = t.to(at::kFloat);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "  %-28s [%lld, %lld]  mean %+.5f  std %.5f  |x| %.3f\n",
                name.c_str(), static_cast<long long>(t.size(0)), static_cast<long long>(t.size(1)),
                f.mean().item<double>(), f.std().item<double>(), f.norm().item<double>());
  return buf;
}

absl::Status Run(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    return absl::InvalidArgumentError(args.empty()
                                          ? "give a command: info, extract or generate (see --help)"
                                          : absl::StrCat("unexpected argument ", args[1]));
  }
  const std::string& command = args[0];
  if (command != "info" && command != "extract" && command != "generate") {
    return absl::InvalidArgumentError("unknown command " + command + " (see --help)");
  }
  if (absl::GetFlag(FLAGS_model).empty()) return absl::InvalidArgumentError("--model is required");
  SW_ASSIGN_OR_RETURN(const TargetFlags target, TargetFlagsFromFlags("float32"));
  if (target.threads > 0) at::set_num_threads(target.threads);
  KeepFreedMemoryForReuse();
  SW_ASSIGN_OR_RETURN(const LoadOptions load, TargetLoadOptions(target));
  SW_ASSIGN_OR_RETURN(auto engine, ExtractionEngine::Load(absl::GetFlag(FLAGS_model), load));

  if (command == "info") {
    std::cout << ContractToJson(engine->contract()) << "\n";
    return absl::OkStatus();
  }
  if (command == "generate") {
    SW_ASSIGN_OR_RETURN(auto seqs, ReadSequences());
    GenerateOptions opts;
    opts.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
    SW_ASSIGN_OR_RETURN(StopFlags stop, StopFromFlags());
    opts.stop_token_ids = std::move(stop.stop_token_ids);
    opts.use_config_eos = stop.use_model_eos;
    nlohmann::json results = nlohmann::json::array();
    for (const auto& prompt : seqs) {
      SW_ASSIGN_OR_RETURN(GenerateResult r, engine->Generate(prompt, opts));
      results.push_back({{"tokens", r.tokens}, {"finish_reason", r.finish_reason}});
    }
    std::cout << (results.size() == 1 ? results[0] : results).dump() << "\n";
    return absl::OkStatus();
  }

  SW_ASSIGN_OR_RETURN(auto seqs, ReadSequences());
  SW_ASSIGN_OR_RETURN(const StateSelection selection, StatesFromFlags());
  const CaptureSpec capture = CaptureOf(selection);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (out_path.empty()) return absl::InvalidArgumentError("--out is required for extract");
  SW_ASSIGN_OR_RETURN(at::ScalarType out_dtype, ParseComputeDtype(absl::GetFlag(FLAGS_out_dtype)));
  // The contract in the file's metadata says which layout ran.
  SW_RETURN_IF_ERROR(engine->SetBatchLayout(target.batch_layout, "--batch_layout"));
  SW_ASSIGN_OR_RETURN(auto states, engine->Extract(seqs, capture, out_dtype));

  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string p = absl::StrCat("seq.", i, ".");
    if (states[i].embedding.defined()) named.emplace_back(p + "embedding", states[i].embedding);
    for (const auto& [id, t] : states[i].layers)
      named.emplace_back(absl::StrCat(p, "layer.", id), t);
    if (states[i].final_norm.defined()) named.emplace_back(p + "final_norm", states[i].final_norm);
  }
  std::vector<TensorToWrite> out;
  SW_ASSIGN_OR_RETURN(DType wire, FromScalarType(out_dtype));
  for (const auto& [name, t] : named) {
    out.push_back(
        {name, wire, t.sizes().vec(),
         std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  nlohmann::json token_meta = seqs;
  SW_RETURN_IF_ERROR(WriteSafetensors(
      out_path, out,
      {{"contract", ContractToJson(engine->contract(), -1)}, {"token_ids", token_meta.dump()}}));
  std::cout << "contract:\n" << ContractToJson(engine->contract()) << "\n";
  std::cout << "wrote " << named.size() << " tensor(s) to " << out_path << ":\n";
  for (const auto& [name, t] : named) std::cout << Summary(name, t);
  return absl::OkStatus();
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      specwire::ParseCommandLineFlags(argc, argv, specwire::kUsage);
  absl::Status s = specwire::Run(args);
  if (!s.ok()) {
    std::cerr << "specwire-extract: " << s.ToString() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
