// specwire-bench-decode: decoding on the device a target runs on, in-process (engine only: it
// builds on GPU hosts). Each mode prints JSON lines; scripts/gpu_decode.sh drives it on a GPU.
//
//   --mode invariance  a sequence decoded beside others (joining at staggered steps, in shuffled
//                      rows) against the same sequence alone: its logits at every step must be
//                      bit-identical (the batch-invariance contract of DecoderModel::DecodeStep)
//   --mode throughput  Generate's schedule (chunked prefill, then one DecodeStep for every
//                      sequence per token) at each --batches size: decode tokens/s and ms/step
//   --mode graphs      one decode step of B rows run eagerly against the same step captured as
//                      a CUDA graph and replayed (what graph capture would save per step)
//   --mode packed_invariance  the extraction's packed layout: a sequence's states packed beside
//                      others against the sequence alone, bit for bit
//   --mode gemm_rows   for every matrix-product shape of the model, whether a row's bits depend
//                      on how many rows the product has (the premise of InvariantRows)
//
// --random_weights draws the weights on the device from config.json alone, so a Qwen3-8B-shaped
// target needs nothing but its config to travel.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_probes.h"
#include "bench/layer_gemms.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "common/models/generate.h"
#include "common/models/kernel_set.h"
#include "common/models/linear.h"
#include "common/models/loader.h"
#include "common/models/staggered_schedule.h"
#include "common/models/torch_util.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "",
          "Checkpoint directory (config.json + *.safetensors; config.json alone with "
          "--random_weights). Required.");
ABSL_FLAG(bool, random_weights, false,
          "Draw the weights on the device (normal(0, 0.02), norms 1) instead of reading them.");
ABSL_FLAG(std::string, dtype, "bfloat16", "Compute dtype: float32 | bfloat16 | float16.");
ABSL_FLAG(std::string, device_map, "cpu",
          "Where layers run: cpu | cuda | cuda:0,cuda:1 (even split) | cuda:0=0-31,cuda:1=32-63.");
ABSL_FLAG(std::string, kernels, "auto", specwire::kKernelsFlagHelp);
ABSL_FLAG(std::string, mode, "invariance,throughput",
          "Comma-separated: invariance | packed_invariance | throughput | graphs | gemm_rows.");
ABSL_FLAG(std::string, batches, "1,8,32", "throughput / graphs: batch sizes.");
ABSL_FLAG(int64_t, prompt_len, 128, "throughput: prompt tokens per sequence.");
ABSL_FLAG(int64_t, new_tokens, 32, "throughput: tokens generated per sequence.");
ABSL_FLAG(int64_t, cases, 8, "invariance: sequences.");
ABSL_FLAG(int64_t, max_prompt, 600, "invariance: longest prompt (crosses prefill chunks).");
ABSL_FLAG(int64_t, seed, 1, "invariance: seed of the prompts and the schedule.");
ABSL_FLAG(int64_t, decode_row_floor, 0,
          "Decode steps run on at least this many rows (0: the model's default).");
ABSL_FLAG(int, reps, 20, "graphs: timed steps per variant.");

namespace specwire {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int64_t> RandomPrompt(std::mt19937_64& g, int64_t len, int64_t vocab) {
  std::vector<int64_t> p(len);
  for (int64_t& t : p) t = static_cast<int64_t>(g() % vocab);
  return p;
}

// The batched schedule of common/models/batched_decode_test.cc (staggered_schedule.h) at a
// larger scale: arrivals at staggered steps, one pending prompt advancing by a prefill chunk per
// step, every decoding sequence one token per step in a shuffled row order.
json Invariance(DecoderModel& model) {
  const int64_t n = absl::GetFlag(FLAGS_cases), seed = absl::GetFlag(FLAGS_seed);
  const int64_t vocab = model.config().vocab_size, longest = absl::GetFlag(FLAGS_max_prompt);
  std::mt19937_64 g(static_cast<uint64_t>(seed));
  std::vector<StaggeredCase> cases;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = (g() % 3 == 0) ? 1 + static_cast<int64_t>(g() % longest)
                                       : 1 + static_cast<int64_t>(g() % 48);
    cases.push_back({RandomPrompt(g, len, vocab), 4 + static_cast<int64_t>(g() % 20),
                     static_cast<int64_t>(g() % 10)});
  }
  const auto t0 = Clock::now();
  std::vector<StepLogits> alone;
  for (const StaggeredCase& c : cases) {
    absl::StatusOr<StepLogits> logits = DecodeAlone(model, c);
    TORCH_CHECK(logits.ok(), logits.status().ToString());
    alone.push_back(*std::move(logits));
  }
  absl::StatusOr<StaggeredRun> run = RunStaggered(model, cases, g, 10000);
  TORCH_CHECK(run.ok(), run.status().ToString());
  const std::vector<StepLogits>& batched = run->logits;
  const int64_t max_rows = run->max_rows;
  int64_t steps = 0, differing = 0, token_differences = 0;
  double max_abs = 0;
  std::string first;
  for (size_t i = 0; i < cases.size(); ++i) {
    TORCH_CHECK(batched[i].size() == alone[i].size(), "case ", i, ": step counts differ");
    for (size_t t = 0; t < alone[i].size(); ++t) {
      ++steps;
      if (at::equal(batched[i][t], alone[i][t])) continue;
      ++differing;
      token_differences +=
          batched[i][t].argmax().item<int64_t>() != alone[i][t].argmax().item<int64_t>();
      const double d =
          (batched[i][t].to(at::kDouble) - alone[i][t].to(at::kDouble)).abs().max().item<double>();
      if (first.empty()) {
        first = "case " + std::to_string(i) + " (prompt " + std::to_string(cases[i].prompt.size()) +
                ") step " + std::to_string(t);
      }
      max_abs = std::max(max_abs, d);
    }
  }
  return {{"mode", "invariance"},
          {"identical", differing == 0},
          {"sequences", n},
          {"steps", steps},
          {"differing_steps", differing},
          {"argmax_differences", token_differences},
          {"max_abs_diff", max_abs},
          {"first_difference", first},
          {"max_rows", max_rows},
          {"seconds", Seconds(t0, Clock::now())}};
}

json Throughput(DecoderModel& model, int64_t batch) {
  const int64_t P = absl::GetFlag(FLAGS_prompt_len), N = absl::GetFlag(FLAGS_new_tokens);
  std::mt19937_64 g(static_cast<uint64_t>(batch) * 7919);
  std::vector<std::unique_ptr<GreedySequence>> seqs;
  for (int64_t b = 0; b < batch; ++b) {
    auto s =
        GreedySequence::Start(model, RandomPrompt(g, P, model.config().vocab_size), NoStops(N));
    TORCH_CHECK(s.ok(), s.status().ToString());
    seqs.push_back(std::move(*s));
  }
  SynchronizeDevice(model.output_device());
  const auto t0 = Clock::now();
  for (auto& s : seqs) {
    while (s->pending_prompt_tokens() > 0) s->PrefillChunk();
  }
  SynchronizeDevice(model.output_device());
  const auto t1 = Clock::now();
  std::vector<GreedySequence*> all;
  for (auto& s : seqs) all.push_back(s.get());
  int64_t steps = 0;
  std::vector<double> step_seconds;
  while (all.front()->decoding()) {
    const auto s0 = Clock::now();
    DecodeStep(model, all);  // ends with the argmax on the host: one sync per step
    step_seconds.push_back(Seconds(s0, Clock::now()));
    ++steps;
  }
  const auto t2 = Clock::now();
  std::sort(step_seconds.begin(), step_seconds.end());
  const double decode = Seconds(t1, t2);
  return {
      {"mode", "throughput"},
      {"batch", batch},
      {"prompt_len", P},
      {"new_tokens", N},
      {"prefill_s", Seconds(t0, t1)},
      {"decode_s", decode},
      {"decode_steps", steps},
      {"step_ms_median", step_seconds.empty() ? 0.0 : 1e3 * step_seconds[step_seconds.size() / 2]},
      {"decode_tok_s", steps > 0 ? static_cast<double>(batch * steps) / decode : 0.0},
      {"generate_tok_s", static_cast<double>(batch * N) / Seconds(t0, t2)}};
}

// The extraction's packed layout: each sequence's captured states (every layer, the final norm)
// packed beside others, in random groups, against the sequence packed alone: bit-identical is
// the contract (ExtractionEngine's BatchLayout::kPacked).
json PackedInvariance(DecoderModel& model) {
  const int64_t n = absl::GetFlag(FLAGS_cases), vocab = model.config().vocab_size;
  std::mt19937_64 g(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)) + 17);
  std::vector<std::vector<int64_t>> pool;
  for (int64_t i = 0; i < n; ++i) {
    pool.push_back(
        RandomPrompt(g, 1 + static_cast<int64_t>(g() % absl::GetFlag(FLAGS_max_prompt)), vocab));
  }
  CaptureSpec all;
  for (int64_t l = 0; l < model.num_layers(); ++l) all.layers.push_back(l);
  all.final_norm = true;
  auto host = [](const CapturedStates& c) {
    std::vector<at::Tensor> t;
    for (const auto& [id, x] : c.layers) t.push_back(x.cpu());
    t.push_back(c.final_norm.cpu());
    return t;
  };
  std::vector<std::vector<at::Tensor>> alone;
  for (const auto& seq : pool) alone.push_back(host(model.ForwardPacked({seq}, all)[0]));
  int64_t compared = 0, differing = 0;
  double max_abs = 0;
  for (int group = 0; group < 6; ++group) {
    std::vector<size_t> members(2 + g() % 6);
    for (size_t& m : members) m = g() % pool.size();
    std::vector<std::vector<int64_t>> seqs;
    for (size_t m : members) seqs.push_back(pool[m]);
    std::vector<CapturedStates> got = model.ForwardPacked(seqs, all);
    for (size_t i = 0; i < members.size(); ++i) {
      const std::vector<at::Tensor> h = host(got[i]);
      for (size_t t = 0; t < h.size(); ++t) {
        ++compared;
        if (at::equal(h[t], alone[members[i]][t])) continue;
        ++differing;
        max_abs = std::max(max_abs, (h[t].to(at::kDouble) - alone[members[i]][t].to(at::kDouble))
                                        .abs()
                                        .max()
                                        .item<double>());
      }
    }
  }
  return {{"mode", "packed_invariance"}, {"identical", differing == 0}, {"taps_compared", compared},
          {"taps_differing", differing}, {"max_abs_diff", max_abs},     {"sequences", n}};
}

// Whether each of the first 8 rows of x W^T keeps its bits when the product has M rows, for
// every M in `row_counts`, against M = 8.
json GemmRows(const ModelConfig& c, at::ScalarType dtype, const at::Device& device,
              KernelSet kernels) {
  const std::vector<int64_t> row_counts = {1,  2,  3,  4,  5,   6,   7,   8,   9,    12,   16,  24,
                                           32, 48, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096};
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (LayerType t : c.layer_types) {
    for (const auto& s : LayerGemms(c, t)) shapes.insert(s);
  }
  shapes.insert({c.vocab_size, c.hidden_size});  // the logits
  json out = json::array();
  const auto opts = at::TensorOptions().dtype(dtype).device(device);
  at::manual_seed(3);
  for (const auto& [n, k] : shapes) {
    Linear product(at::randn({n, k}, opts) * 0.02, {}, kernels);
    at::Tensor x = at::randn({row_counts.back(), k}, opts);
    const at::Tensor ref = product(x.narrow(0, 0, 8)).cpu();
    std::vector<int64_t> differ;
    for (int64_t m : row_counts) {
      const int64_t rows = std::min<int64_t>(m, 8);
      at::Tensor y = product(x.narrow(0, 0, m)).narrow(0, 0, rows).cpu();
      if (!at::equal(y, ref.narrow(0, 0, rows))) differ.push_back(m);
    }
    out.push_back({{"out", n}, {"in", k}, {"row_counts_differing_from_8", differ}});
  }
  return {{"mode", "gemm_rows"}, {"row_counts", row_counts}, {"shapes", out}};
}

int Fail(const std::string& msg) {
  std::cerr << "specwire-bench-decode: " << msg << "\n";
  return 2;
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  using namespace specwire;
  const std::vector<std::string> args = ParseCommandLineFlags(
      argc, argv,
      "specwire-bench-decode --model DIR [--random_weights] [--device_map cuda] "
      "[--mode invariance,throughput,graphs,gemm_rows] [--batches 1,8,32]");
  if (!args.empty()) return Fail("unexpected argument " + args[0]);
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return Fail("--model is required (see --help)");
  KeepFreedMemoryForReuse();
  auto dtype = ParseComputeDtype(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return Fail(std::string(dtype.status().message()));
  auto kernels = ParseKernelSet(absl::GetFlag(FLAGS_kernels), "--kernels");
  if (!kernels.ok()) return Fail(std::string(kernels.status().message()));
  auto batches = ParseIntList(absl::GetFlag(FLAGS_batches), "batches");
  if (!batches.ok()) return Fail(std::string(batches.status().message()));
  LoadOptions load;
  load.dtype = *dtype;
  load.device_map = absl::GetFlag(FLAGS_device_map);
  load.kernels = *kernels;
  if (absl::GetFlag(FLAGS_random_weights)) load.random_weights_seed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto loaded = LoadModel(dir, load);
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  DecoderModel& model = *(*loaded)->model;
  if (const int64_t floor = absl::GetFlag(FLAGS_decode_row_floor); floor > 0) {
    model.SetDecodeRowFloor(floor);
  }
  SynchronizeDevice(model.output_device());
  std::cout << json{{"mode", "load"},
                    {"seconds", Seconds(t0, std::chrono::steady_clock::now())},
                    {"kernel_variant", (*loaded)->contract.kernel_variant},
                    {"decode_row_floor", model.decode_row_floor()}}
                   .dump()
            << std::endl;
  absl::Status status = RunGuarded("decode bench", [&]() -> absl::Status {
    c10::InferenceMode inference;
    for (absl::string_view mode : absl::StrSplit(absl::GetFlag(FLAGS_mode), ',')) {
      if (mode == "invariance") {
        std::cout << Invariance(model).dump() << std::endl;
      } else if (mode == "throughput") {
        for (int64_t b : *batches) std::cout << Throughput(model, b).dump() << std::endl;
      } else if (mode == "graphs") {
        for (int64_t b : *batches) {
          std::cout << DecodeGraphProbe(model, b, absl::GetFlag(FLAGS_reps)).dump() << std::endl;
        }
      } else if (mode == "packed_invariance") {
        std::cout << PackedInvariance(model).dump() << std::endl;
      } else if (mode == "gemm_rows") {
        std::cout << GemmRows(model.config(), *dtype, model.output_device(),
                              ResolveKernelSet(model.config().family, *kernels))
                         .dump()
                  << std::endl;
      } else {
        return absl::InvalidArgumentError("--mode: unknown mode \"" + std::string(mode) + "\"");
      }
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return Fail(status.ToString());
  return 0;
}
