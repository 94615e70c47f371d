#include "common/models/decoder.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/models/rope.h"

namespace specwire {

const std::pair<at::Tensor, at::Tensor>& ForwardContext::Rotary(const RotaryEmbedding& rope,
                                                               const at::Device& device) const {
  auto key = std::make_pair(static_cast<const void*>(&rope), device.str());
  auto it = rotary_.find(key);
  if (it == rotary_.end()) {
    it = rotary_.emplace(key, rope.CosSin(past_len, seq_len, dtype, device)).first;
  }
  return it->second;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, NormKind kind) {
  const at::ScalarType in_dtype = x.scalar_type();
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (kind == NormKind::kPlain) {
    // transformers: weight * hidden.to(input_dtype) — the product is rounded in the input dtype.
    return w * normed.to(in_dtype);
  }
  // Qwen3.5: (1 + w) in fp32, one rounding at the end.
  return (normed * (1.0 + w.to(at::kFloat))).to(in_dtype);
}

namespace {

// y = w * bf16/fp32(x * rsqrt(mean(x^2) + eps)), rows of length `dim` at `x + r * row_stride`.
template <typename T>
void RmsNormRows(const T* x, const int64_t* row_offsets, const T* w, T* out, int64_t rows,
                 int64_t dim, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(dim);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + row_offsets[r];
      float sum = 0;
      for (int64_t i = 0; i < dim; ++i) {
        buf[i] = static_cast<float>(xr[i]);
        sum += buf[i] * buf[i];
      }
      const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
      T* o = out + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        // Round the normalised value to T first, then multiply by the weight in T: the
        // rounding points of transformers' `weight * hidden.to(input_dtype)`.
        const T h = static_cast<T>(buf[i] * rstd);
        o[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(h));
      }
    }
  });
}

}  // namespace

at::Tensor RmsNormFused(const at::Tensor& x, const at::Tensor& w, double eps) {
  const auto t = x.scalar_type();
  if (!x.device().is_cpu() || (t != at::kFloat && t != at::kBFloat16) || w.scalar_type() != t ||
      x.stride(-1) != 1 || !w.is_contiguous()) {
    return RmsNorm(x, w, eps, NormKind::kPlain);
  }
  const int64_t dim = x.size(-1);
  const int64_t rows = x.numel() / dim;
  // Row start offsets (elements) for any strides of the leading dimensions: q/k are views into a
  // fused projection, so their rows are not evenly spaced.
  std::vector<int64_t> offsets(rows);
  {
    const int64_t nd = x.dim() - 1;
    std::vector<int64_t> idx(nd, 0);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t off = 0;
      for (int64_t d = 0; d < nd; ++d) off += idx[d] * x.stride(d);
      offsets[r] = off;
      for (int64_t d = nd - 1; d >= 0; --d) {
        if (++idx[d] < x.size(d)) break;
        idx[d] = 0;
      }
    }
  }
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (t == at::kFloat) {
    RmsNormRows<float>(x.data_ptr<float>(), offsets.data(), w.data_ptr<float>(),
                       out.data_ptr<float>(), rows, dim, static_cast<float>(eps));
  } else {
    RmsNormRows<at::BFloat16>(x.data_ptr<at::BFloat16>(), offsets.data(),
                              w.data_ptr<at::BFloat16>(), out.data_ptr<at::BFloat16>(), rows, dim,
                              static_cast<float>(eps));
  }
  return out;
}

DecoderModel::DecoderModel(ModelConfig config, at::ScalarType dtype, NormKind final_norm_kind,
                           std::vector<std::unique_ptr<DecoderLayer>> layers)
    : config_(std::move(config)),
      dtype_(dtype),
      final_norm_kind_(final_norm_kind),
      tied_(config_.tie_word_embeddings),
      layers_(std::move(layers)) {}

void DecoderModel::ForEachWeight(const WeightVisitor& visit) {
  const int64_t V = config_.vocab_size, H = config_.hidden_size;
  visit({"model.embed_tokens.weight", {V, H}, &embed_tokens_});
  visit({"model.norm.weight", {H}, &norm_});
  if (!tied_) visit({"lm_head.weight", {V, H}, &lm_head_});
  for (size_t i = 0; i < layers_.size(); ++i) {
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    layers_[i]->ForEachWeight([&](const WeightSlot& s) {
      WeightSlot full = s;
      full.name = prefix + s.name;
      visit(full);
    });
  }
}

void DecoderModel::Prepare(const std::vector<at::Device>& layer_devices) {
  TORCH_CHECK(layer_devices.size() == layers_.size(), "device map size mismatch");
  input_device_ = layer_devices.front();
  output_device_ = layer_devices.back();
  embed_tokens_ = embed_tokens_.to(input_device_, dtype_);
  norm_ = norm_.to(output_device_, dtype_);
  if (!tied_) {
    lm_head_ = lm_head_.to(output_device_, dtype_);
  } else if (output_device_ != input_device_) {
    lm_head_ = embed_tokens_.to(output_device_);  // a copy for the last device
    tied_ = false;
  }
  for (size_t i = 0; i < layers_.size(); ++i) layers_[i]->Prepare(layer_devices[i]);
}

std::unique_ptr<ModelCache> DecoderModel::NewCache(int64_t batch, int64_t capacity) const {
  auto cache = std::make_unique<ModelCache>();
  cache->batch = batch;
  cache->capacity = capacity;
  for (const auto& layer : layers_) cache->layers.push_back(layer->NewCache(batch, capacity));
  return cache;
}

at::Tensor DecoderModel::Forward(const at::Tensor& input_ids, ModelCache* cache,
                                 const CaptureSpec& capture, CapturedStates* captured,
                                 LogitsMode mode) {
  TORCH_CHECK(input_ids.dim() == 2, "input_ids must be [B, T]");
  TORCH_CHECK(captured != nullptr || capture.empty(), "capture requested without output");
  const int64_t T = input_ids.size(1);
  const int64_t past = cache ? cache->length : 0;
  if (cache) {
    TORCH_CHECK(cache->batch == input_ids.size(0), "cache batch mismatch");
    TORCH_CHECK(past + T <= cache->capacity, "cache capacity ", cache->capacity, " exceeded");
  }
  ForwardContext ctx(past, T, dtype_);

  // Layers past the last one anybody needs are skipped: extraction of a middle layer does not pay
  // for the rest of the stack. With a cache every layer must run to keep the cache consistent.
  const bool need_top = mode != LogitsMode::kNone || capture.final_norm || cache != nullptr;
  int64_t last = need_top ? num_layers() - 1 : -1;
  for (int64_t id : capture.layers) last = std::max(last, id);

  std::vector<bool> keep(layers_.size(), false);
  for (int64_t id : capture.layers) keep[id] = true;

  at::Tensor h = at::embedding(embed_tokens_, input_ids.to(input_device_));  // [B, T, H]
  if (capture.embedding) captured->embedding = h;
  for (int64_t i = 0; i <= last; ++i) {
    DecoderLayer& layer = *layers_[i];
    if (h.device() != layer.device()) h = h.to(layer.device());
    h = layer.Forward(h, ctx, cache ? cache->layers[i].get() : nullptr);
    if (keep[i]) captured->layers[i] = h;
  }
  if (cache) cache->length += T;
  if (!need_top) return at::Tensor();

  if (h.device() != output_device_) h = h.to(output_device_);
  if (mode == LogitsMode::kLast && !capture.final_norm) h = h.narrow(1, T - 1, 1);
  at::Tensor normed = RmsNorm(h, norm_, config_.rms_norm_eps, final_norm_kind_);
  if (capture.final_norm) captured->final_norm = normed;
  switch (mode) {
    case LogitsMode::kNone: return at::Tensor();
    case LogitsMode::kLast: return at::linear(normed.select(1, normed.size(1) - 1), lm_head());
    case LogitsMode::kAll: return at::linear(normed, lm_head());
  }
  return at::Tensor();
}

at::Tensor DecoderLayer::DecodeRows(const at::Tensor& h, const std::vector<DecodeRow>& rows) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    out.push_back(Forward(h.narrow(0, static_cast<int64_t>(i), 1), *rows[i].ctx, rows[i].cache));
  }
  const int64_t pad = h.size(0) - static_cast<int64_t>(rows.size());
  if (pad > 0) out.push_back(at::zeros({pad, 1, h.size(2)}, h.options()));
  return at::cat(out, 0);
}

at::Tensor DecoderModel::DecodeStep(const std::vector<int64_t>& tokens,
                                    const std::vector<ModelCache*>& caches) {
  TORCH_CHECK(!tokens.empty() && tokens.size() == caches.size(), "one cache per token");
  const int64_t N = static_cast<int64_t>(tokens.size());
  const int64_t M = DecodeRowsFor(N);
  std::vector<ForwardContext> ctx;
  ctx.reserve(tokens.size());  // rows point into it
  at::Tensor ids = at::zeros({M, 1}, at::kLong);
  for (int64_t i = 0; i < N; ++i) {
    const ModelCache& c = *caches[i];
    TORCH_CHECK(c.batch == 1, "decode rows need batch-1 caches");
    TORCH_CHECK(c.length + 1 <= c.capacity, "cache capacity ", c.capacity, " exceeded");
    ids[i][0] = tokens[i];
    ctx.emplace_back(c.length, 1, dtype_);
  }
  at::Tensor h = at::embedding(embed_tokens_, ids.to(input_device_));  // [M, 1, H]
  std::vector<DecodeRow> rows(tokens.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& layer = *layers_[l];
    if (h.device() != layer.device()) h = h.to(layer.device());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = {&ctx[i], caches[i]->layers[l].get()};
    h = layer.DecodeRows(h, rows);
  }
  for (ModelCache* c : caches) c->length += 1;
  if (h.device() != output_device_) h = h.to(output_device_);
  at::Tensor normed = RmsNorm(h.select(1, 0), norm_, config_.rms_norm_eps, final_norm_kind_);
  return at::linear(normed, lm_head()).narrow(0, 0, N);
}

}  // namespace specwire
