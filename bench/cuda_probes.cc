#include "bench/cuda_probes.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "common/models/torch_util.h"

#ifdef SPECWIRE_CUDA_HEADERS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace specwire {
namespace {

using json = nlohmann::json;

#ifdef SPECWIRE_CUDA_HEADERS
double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : 1e3 * v[v.size() / 2];
}
#endif

}  // namespace

json DecodeGraphProbe(DecoderModel& model, int64_t batch, int reps) {
  json out = {{"mode", "graphs"}, {"batch", batch}};
#ifndef SPECWIRE_CUDA_HEADERS
  (void)model;
  (void)reps;
  out["error"] = "unavailable: built without CUDA headers";
  return out;
#else
  if (!model.output_device().is_cuda() || model.input_device() != model.output_device()) {
    out["error"] = "unavailable: the model is not on one CUDA device";
    return out;
  }
  using Clock = std::chrono::steady_clock;
  const at::Device dev = model.output_device();
  // Each row: a 64-token prompt prefilled into its own cache, its greedy next token pending.
  std::mt19937_64 g(static_cast<uint64_t>(batch));
  std::vector<std::unique_ptr<ModelCache> > owned;
  std::vector<ModelCache*> caches;
  std::vector<ForwardContext> ctx;
  std::vector<int64_t> last;
  ctx.reserve(batch);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> prompt(64);
    for (int64_t& t : prompt) t = static_cast<int64_t>(g() % model.config().vocab_size);
    owned.push_back(model.NewCache(1, 80));
    const at::Tensor logits = model.Forward(at::tensor(prompt, at::kLong).view({1, 64}),
                                            owned.back().get(), {}, nullptr, LogitsMode::kLast);
    last.push_back(logits.argmax(-1).item<int64_t>());
    caches.push_back(owned.back().get());
    ctx.emplace_back(64, 1, model.dtype());
  }
  const int64_t M = std::max(DecoderModel::InvariantRows(batch), model.decode_row_floor());
  std::vector<int64_t> ids(M, 0);
  std::copy(last.begin(), last.end(), ids.begin());
  const at::Tensor h =
      at::embedding(model.embed_tokens(), at::tensor(ids, at::kLong).view({M, 1}).to(dev));
  out["rows"] = M;
  auto time_steps = [&](const std::function<void()>& step) {
    std::vector<double> t;
    for (int r = 0; r < reps + 3; ++r) {
      SynchronizeDevice(dev);
      const auto t0 = Clock::now();
      step();
      SynchronizeDevice(dev);
      if (r >= 3) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return MedianMs(t);
  };
  at::Tensor eager;
  out["eager_ms"] = time_steps([&] { eager = model.DecodeRowsLogits(h, ctx, caches); });
  try {
    at::cuda::CUDAGraph graph;
    at::Tensor captured;
    // Capture runs on a side stream (never the default one). c10's generic guard: the CUDA
    // runtime is reached through libc10_cuda, not linked here.
    const c10::Stream stream = c10::cuda::getStreamFromPool(false, dev.index()).unwrap();
    {
      c10::StreamGuard guard(stream);
      model.DecodeRowsLogits(h, ctx, caches);  // a warm-up on the capture stream
      SynchronizeDevice(dev);
      graph.capture_begin();
      captured = model.DecodeRowsLogits(h, ctx, caches);
      graph.capture_end();
    }
    out["graph_ms"] = time_steps([&] { graph.replay(); });
    out["replay_equals_eager"] = at::equal(captured, eager);
    out["speedup"] = out["eager_ms"].get<double>() / std::max(1e-9, out["graph_ms"].get<double>());
  } catch (const c10::Error& e) {
    out["error"] = std::string("capture failed: ") + e.what_without_backtrace();
  }
  return out;
#endif
}

#ifdef SPECWIRE_CUDA_HEADERS
struct SyncCounter::State : c10::WarningHandler {
  void process(const c10::Warning& w) override {
    if (w.msg().find("synchroniz") == std::string::npos) {
      if (previous) previous->process(w);
      return;
    }
    ++count;
    const auto& loc = w.source_location();
    if (places.size() < 8)
      places.insert(std::string(loc.function) + " (" + loc.file + ":" + std::to_string(loc.line) +
                    ")");
  }
  c10::WarningHandler* previous = nullptr;
  int64_t count = 0;
  int64_t calibration = 0;
  std::set<std::string> places;
  bool active = false;
};

SyncCounter::SyncCounter(const at::Device& device) : state_(std::make_unique<State>()) {
  state_->previous = c10::WarningUtils::get_warning_handler();
  c10::WarningUtils::set_warning_handler(state_.get());
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  state_->active = true;
  if (device.is_cuda()) {
    (void)at::ones({1}, at::TensorOptions().device(device)).item<float>();  // one known wait
  }
  state_->calibration = state_->count;
  state_->count = 0;
  state_->places.clear();
}

SyncCounter::~SyncCounter() { Stop(); }

json SyncCounter::Stop() {
  if (state_->active) {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
    c10::WarningUtils::set_warning_handler(state_->previous);
    state_->active = false;
  }
  return {{"syncs", state_->count},
          {"calibrated", state_->calibration > 0},
          {"places", std::vector<std::string>(state_->places.begin(), state_->places.end())}};
}
#else
struct SyncCounter::State {};
SyncCounter::SyncCounter(const at::Device&) : state_(std::make_unique<State>()) {}
SyncCounter::~SyncCounter() = default;
json SyncCounter::Stop() { return {{"error", "unavailable: built without CUDA headers"}}; }
#endif

}  // namespace specwire
