// specwire-bench-extract: times the extraction forward of a checkpoint, in-process.
//
// Prints one JSON line per (dtype, sequence length) with every repetition's wall time, so a driver
// (bench/extract_vs_hf.py) can interleave it with transformers on the same machine and compare
// medians. Capture is every decoder layer plus the final-norm tap, the same work as
// transformers' output_hidden_states=True.
//
// With --gemm, each repetition also times the forward's projection GEMMs alone (every linear
// layer of every decoder layer at the forward's shapes, dtype and threads, on weights of the same
// shapes, by the kernels the forward runs: common/models/linear.h), back to back with the forward: GEMM time / forward time is how close the forward is to
// the machine's GEMM rate (extract_vs_gemm_ratio; 1.0 is the limit). It also times every
// attention layer's attention alone at the forward's shapes (causal, per sequence, the kernel
// the forward runs: common/models/attention.h), so the rest (norms, rope, activations, copies,
// the recurrences of a hybrid) is forward - GEMMs - attention.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_probes.h"
#include "bench/layer_gemms.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "common/models/attention.h"
#include "common/models/cpu_threads.h"
#include "common/models/host_copies.h"
#include "common/models/kernel_set.h"
#include "common/models/linear.h"
#include "common/models/loader.h"
#include "common/models/torch_util.h"
#include "nlohmann/json.hpp"
#include "common/models/engine.h"
#include "common/models/target_flags.h"

ABSL_FLAG(std::string, model, "", "Checkpoint directory (config.json + *.safetensors). Required.");
ABSL_FLAG(std::string, layers, "all",
          "all (embedding, every layer, final norm) | none (final norm only) | 0,5,...");
ABSL_FLAG(std::string, seq_lens, "512", "Sequence lengths to time, comma-separated.");
ABSL_FLAG(int, batch, 1, "Sequences per forward.");
ABSL_FLAG(int, reps, 3, "Timed repetitions per sequence length.");
ABSL_FLAG(int, warmup, 1, "Untimed repetitions first.");
ABSL_FLAG(std::string, cpu_binding, "auto",
          "Intra-op threads bound to CPUs: auto | none | cores | a list such as 0-3 (the "
          "extractor's flag, with its default).");
ABSL_FLAG(bool, random_weights, false,
          "Draw the weights on the device from --model's config.json alone (normal(0, 0.02), "
          "norms 1): a large target's shape timed without its checkpoint.");
ABSL_FLAG(std::string, packed_rows, "0",
          "Tokens one packed forward holds at most (0: the extractor's default); a list runs "
          "every sequence length once per value.");
ABSL_FLAG(std::string, batches, "",
          "Sequences per forward for each of --seq_lens (comma-separated, one per length; "
          "overrides --batch).");
ABSL_FLAG(bool, copy_breakdown, false,
          "Also time, per repetition, the forwards alone with the states left on the device "
          "(forward_times_s) and the device-to-host copy of the same states alone "
          "(copy_times_s): how much of the copy the extraction hides behind the next forward.");
ABSL_FLAG(bool, count_syncs, false,
          "CUDA: count the operations that make the host wait for the device in one extraction "
          "(torch's sync debug mode).");
ABSL_FLAG(bool, gemm, false,
          "Also time the forward's projection GEMMs alone (gemm_times_s) and its attention "
          "alone (attention_times_s).");

namespace {

int Fail(const std::string& msg) {
  std::cerr << "specwire-bench-extract: " << msg << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace specwire;
  const std::vector<std::string> args = ParseCommandLineFlags(
      argc, argv,
      "specwire-bench-extract --model DIR [--dtype float32|bfloat16] [--seq_lens 512,2048] "
      "[--reps 3] [--warmup 1] [--threads N] [--batch B] [--layers all|none|0,5] "
      "[--device_map cpu] [--batch_layout per_sequence|padded] [--gemm]");
  if (!args.empty()) return Fail("unexpected argument " + args[0]);
  const std::string model_dir = absl::GetFlag(FLAGS_model), layers = absl::GetFlag(FLAGS_layers);
  auto target = TargetFlagsFromFlags("float32");
  if (!target.ok()) return Fail(std::string(target.status().message()));
  const int reps = absl::GetFlag(FLAGS_reps), warmup = absl::GetFlag(FLAGS_warmup),
            threads = target->threads, batch_flag = absl::GetFlag(FLAGS_batch);
  if (model_dir.empty()) return Fail("--model is required (see --help)");
  if (reps < 1 || warmup < 0 || batch_flag < 1) return Fail("bad flag value");
  std::vector<int64_t> seq_lens;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_seq_lens), ',')) {
    int64_t n;
    if (!absl::SimpleAtoi(s, &n) || n < 1) return Fail("bad --seq_lens");
    seq_lens.push_back(n);
  }
  if (threads > 0) at::set_num_threads(threads);
  KeepFreedMemoryForReuse();  // as the extractor does
  auto binding = ParseCpuBinding(absl::GetFlag(FLAGS_cpu_binding), threads);
  if (!binding.ok()) return Fail(std::string(binding.status().message()));
  SetCpuBinding(*binding);
  BindIntraOpThreads();  // this thread runs every forward below
  auto load_options = TargetLoadOptions(*target);
  if (!load_options.ok()) return Fail(std::string(load_options.status().message()));
  LoadOptions load = *load_options;
  const at::ScalarType dtype = load.dtype;
  const std::string& dtype_name = target->dtype;
  if (absl::GetFlag(FLAGS_random_weights)) load.random_weights_seed = 0;
  auto engine = ExtractionEngine::Load(model_dir, load);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  const ModelConfig& cfg = (*engine)->config();
  auto packed_rows = ParseIntList(absl::GetFlag(FLAGS_packed_rows), "packed_rows");
  if (!packed_rows.ok() || packed_rows->empty()) return Fail("bad --packed_rows");
  std::vector<int64_t> batches(seq_lens.size(), batch_flag);
  if (const std::string b = absl::GetFlag(FLAGS_batches); !b.empty()) {
    auto list = ParseIntList(b, "batches");
    if (!list.ok() || list->size() != seq_lens.size()) return Fail("--batches: one per --seq_lens");
    batches = *list;
  }
  // (sequence length, sequences, packed rows) of every run.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> runs;
  for (int64_t rows : *packed_rows) {
    for (size_t i = 0; i < seq_lens.size(); ++i) runs.emplace_back(seq_lens[i], batches[i], rows);
  }

  CaptureSpec capture;
  if (layers == "all") {
    for (int64_t i = 0; i < cfg.num_layers; ++i) capture.layers.push_back(i);
    capture.final_norm = true;
    capture.embedding = true;
  } else if (layers != "none") {
    for (auto s : absl::StrSplit(layers, ',')) {
      int64_t n;
      if (!absl::SimpleAtoi(s, &n)) return Fail("bad --layers");
      capture.layers.push_back(n);
    }
  } else {
    capture.final_norm = true;
  }
  if (auto st = (*engine)->SetBatchLayout(target->batch_layout, "--batch_layout");
      !st.ok()) {
    return Fail(std::string(st.message()));
  }
  const std::optional<BatchLayout> layout = (*engine)->batch_layout();
  const bool gemm = absl::GetFlag(FLAGS_gemm);
  const at::Device dev = (*engine)->model().input_device();
  // Products of every GEMM shape the layers use (values do not change the speed), run by the
  // kernels the forward runs (the fast set's are oneDNN's on reordered weights).
  const KernelSet kernel_set = ResolveKernelSet(cfg.family, load.kernels);
  std::vector<std::vector<std::pair<int64_t, Linear>>> gemm_weights;  // (in_features, product)
  if (gemm) {
    const auto opts = at::TensorOptions().dtype(dtype).device(dev);
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      gemm_weights.emplace_back();
      for (const auto& [out, in] : LayerGemms(cfg, cfg.layer_types[l])) {
        gemm_weights.back().emplace_back(in, Linear(at::randn({out, in}, opts) * 0.02, {},
                                                    kernel_set));
      }
    }
  }
  for (const auto& [T, batch, rows] : runs) {
    (*engine)->SetPackedRows(rows > 0 ? rows : kPackedRows);
    std::vector<std::vector<int64_t>> seqs(batch);
    for (int b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < T; ++t)
        seqs[b].push_back((t * 7919 + b * 104729 + 13) % cfg.vocab_size);
    }
    // The GEMMs' row counts, as the forwards run them: one call per sequence (per_sequence),
    // one for the padded batch, one per packed forward (sequences of length T, as many as fit in
    // the engine's packed rows, on InvariantRows rows).
    const int64_t per_call = *layout == BatchLayout::kPerSequence ? 1
                             : *layout == BatchLayout::kPadded
                                 ? batch
                                 : std::max<int64_t>(1, (*engine)->packed_rows() / T);
    const int64_t calls = (batch + per_call - 1) / per_call;
    const int64_t call_rows =
        *layout == BatchLayout::kPacked
            ? DecoderModel::InvariantRows(std::min<int64_t>(per_call, batch) * T)
            : std::min<int64_t>(per_call, batch) * T;
    std::map<int64_t, at::Tensor> inputs;  // by in_features: [rows, in]
    for (const auto& layer : gemm_weights) {
      for (const auto& [in, product] : layer) {
        if (!inputs.count(in)) {
          inputs[in] = at::randn({call_rows, in}, at::TensorOptions().dtype(dtype).device(dev));
        }
      }
    }
    // The packed forwards' groups, as ExtractionEngine::Extract forms them.
    std::vector<std::vector<std::vector<int64_t>>> groups;
    for (int64_t b = 0; b < batch; b += per_call) {
      groups.emplace_back(seqs.begin() + b, seqs.begin() + std::min<int64_t>(batch, b + per_call));
    }
    const bool breakdown = absl::GetFlag(FLAGS_copy_breakdown) && *layout == BatchLayout::kPacked;
    int64_t state_bytes = 0;
    nlohmann::json syncs;
    if (absl::GetFlag(FLAGS_count_syncs)) {
      SyncCounter counter(dev);
      auto out = (*engine)->Extract(seqs, capture, dtype, *layout);
      if (!out.ok()) return Fail(std::string(out.status().message()));
      syncs = counter.Stop();
    }
    // Attention inputs as the forward has them for one sequence: q [1, Hq, T, D], k and v
    // [1, Hkv, T, D] (transposed views of [1, T, heads, D]).
    at::Tensor q, k, v;
    int64_t attention_layers = 0;
    for (LayerType t : cfg.layer_types) attention_layers += t != LayerType::kLinearAttention;
    if (gemm && attention_layers > 0) {
      const auto opts = at::TensorOptions().dtype(dtype).device(dev);
      q = at::randn({1, T, cfg.num_heads, cfg.head_dim}, opts).transpose(1, 2);
      k = at::randn({1, T, cfg.num_kv_heads, cfg.head_dim}, opts).transpose(1, 2);
      v = at::randn({1, T, cfg.num_kv_heads, cfg.head_dim}, opts).transpose(1, 2);
    }
    std::vector<double> times, gemm_times, attention_times, forward_times, copy_times;
    for (int r = 0; r < warmup + reps; ++r) {
      SynchronizeDevice(dev);
      auto t0 = std::chrono::steady_clock::now();
      // Hidden states stay in the compute dtype, copied to the host as a client would receive them.
      auto out = (*engine)->Extract(seqs, capture, dtype, *layout);
      SynchronizeDevice(dev);
      auto t1 = std::chrono::steady_clock::now();
      if (!out.ok()) return Fail(std::string(out.status().message()));
      if (r >= warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
      if (breakdown) {
        c10::InferenceMode inference;
        std::vector<std::vector<CapturedStates>> kept;
        auto f0 = std::chrono::steady_clock::now();
        for (const auto& group : groups)
          kept.push_back((*engine)->model().ForwardPacked(group, capture));
        SynchronizeDevice(dev);
        auto f1 = std::chrono::steady_clock::now();
        state_bytes = 0;
        for (const auto& group : kept) {
          for (const CapturedStates& c : group) {
            std::vector<at::Tensor> taps;
            if (c.embedding.defined()) taps.push_back(c.embedding);
            for (const auto& [id, t] : c.layers) taps.push_back(t);
            if (c.final_norm.defined()) taps.push_back(c.final_norm);
            for (const at::Tensor& t : taps) {
              at::Tensor host = at::empty(
                  t.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(dev.is_cuda()));
              host.copy_(t);
              state_bytes += static_cast<int64_t>(host.nbytes());
            }
          }
        }
        SynchronizeDevice(dev);
        auto f2 = std::chrono::steady_clock::now();
        if (r >= warmup) {
          forward_times.push_back(std::chrono::duration<double>(f1 - f0).count());
          copy_times.push_back(std::chrono::duration<double>(f2 - f1).count());
        }
      }
      if (!gemm) continue;
      {
        c10::InferenceMode inference;
        auto g0 = std::chrono::steady_clock::now();
        for (int64_t k = 0; k < calls; ++k) {
          for (const auto& layer : gemm_weights) {
            for (const auto& [in, product] : layer) {
              at::Tensor y = product(inputs.at(in));
            }
          }
        }
        SynchronizeDevice(dev);
        auto g1 = std::chrono::steady_clock::now();
        const ForwardContext attention_ctx(0, T, dtype);
        const AttentionKernel kernel = AttentionKernelOf(kernel_set);
        const double scale = 1.0 / std::sqrt(static_cast<double>(cfg.head_dim));
        for (int64_t s = 0; q.defined() && s < batch; ++s) {
          for (int64_t l = 0; l < attention_layers; ++l) {
            at::Tensor o = CausalAttention(q, k, v, attention_ctx, nullptr, 0, scale, kernel);
          }
        }
        SynchronizeDevice(dev);
        auto g2 = std::chrono::steady_clock::now();
        if (r >= warmup) {
          gemm_times.push_back(std::chrono::duration<double>(g1 - g0).count());
          attention_times.push_back(std::chrono::duration<double>(g2 - g1).count());
        }
      }
    }
    nlohmann::json line = {{"impl", "specwire"},
                           {"dtype", dtype_name},
                           {"seq_len", T},
                           {"batch", batch},
                           {"batch_layout", BatchLayoutName(*layout)},
                           {"times_s", times},
                           {"threads", at::get_num_threads()},
                           {"cpu_binding", binding->ToString()},
                           {"attention_kernel",
                            AttentionKernelName(
                                AttentionKernelOf(kernel_set), dtype, dev)},
                           {"kernels", KernelSetName(kernel_set)}};
    line["packed_rows"] = (*engine)->packed_rows();
    line["device"] = dev.str();
    line["host_copies"] = HostCopies(dev).asynchronous() ? "async" : "sync";
    if (gemm) {
      line["gemm_times_s"] = gemm_times;
      line["attention_times_s"] = attention_times;
      line["gemm_calls"] = calls;
      line["gemm_rows"] = call_rows;
    }
    if (breakdown) {
      line["forward_times_s"] = forward_times;
      line["copy_times_s"] = copy_times;
      line["state_bytes"] = state_bytes;
    }
    if (!syncs.is_null()) line["syncs"] = syncs;
    std::cout << line.dump() << std::endl;
  }
  return 0;
}
