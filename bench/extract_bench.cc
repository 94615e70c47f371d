// specwire-bench-extract: times the extraction forward of a checkpoint, in-process.
//
// Prints one JSON line per (dtype, sequence length) with every repetition's wall time, so a driver
// (bench/extract_vs_hf.py) can interleave it with transformers on the same machine and compare
// medians. Capture is every decoder layer plus the final-norm tap, the same work as
// transformers' output_hidden_states=True.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/models/torch_util.h"
#include "nlohmann/json.hpp"
#include "services/extractor/engine.h"

namespace {

int Fail(const std::string& msg) {
  std::cerr << "specwire-bench-extract: " << msg << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace specwire;
  std::string model_dir, dtype_name = "float32", device = "cpu", layers = "all";
  std::vector<int64_t> seq_lens = {512};
  int reps = 3, warmup = 1, threads = 0, batch = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model_dir = v;
    else if (k == "--dtype") dtype_name = v;
    else if (k == "--device-map") device = v;
    else if (k == "--layers") layers = v;
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--batch") batch = std::stoi(v);
    else if (k == "--seq-lens") {
      seq_lens.clear();
      for (auto s : absl::StrSplit(v, ',')) {
        int64_t n;
        if (!absl::SimpleAtoi(s, &n)) return Fail("bad --seq-lens");
        seq_lens.push_back(n);
      }
    } else {
      return Fail("unknown flag " + k);
    }
  }
  if (model_dir.empty()) {
    std::cout << "usage: specwire-bench-extract --model DIR [--dtype float32|bfloat16] "
                 "[--seq-lens 512,2048] [--reps 3] [--warmup 1] [--threads N] [--batch B] "
                 "[--layers all|none|0,5] [--device-map cpu]\n";
    return 2;
  }
  if (threads > 0) at::set_num_threads(threads);
  KeepFreedMemoryForReuse();  // as the extractor does
  auto dtype = ParseComputeDtype(dtype_name);
  if (!dtype.ok()) return Fail(std::string(dtype.status().message()));
  LoadOptions load;
  load.dtype = *dtype;
  load.device_map = device;
  auto engine = ExtractionEngine::Load(model_dir, load);
  if (!engine.ok()) return Fail(std::string(engine.status().message()));
  const ModelConfig& cfg = (*engine)->config();

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
  const at::Device dev = (*engine)->model().input_device();
  for (int64_t T : seq_lens) {
    std::vector<std::vector<int64_t>> seqs(batch);
    for (int b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < T; ++t) seqs[b].push_back((t * 7919 + b * 104729 + 13) % cfg.vocab_size);
    }
    std::vector<double> times;
    for (int r = 0; r < warmup + reps; ++r) {
      SynchronizeDevice(dev);
      auto t0 = std::chrono::steady_clock::now();
      // Hidden states stay in the compute dtype, copied to the host as a client would receive them.
      auto out = (*engine)->Extract(seqs, capture, *dtype);
      SynchronizeDevice(dev);
      auto t1 = std::chrono::steady_clock::now();
      if (!out.ok()) return Fail(std::string(out.status().message()));
      if (r >= warmup) times.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    nlohmann::json line = {{"impl", "specwire"}, {"dtype", dtype_name}, {"seq_len", T},
                           {"batch", batch},     {"times_s", times},    {"threads", at::get_num_threads()}};
    std::cout << line.dump() << std::endl;
  }
  return 0;
}
