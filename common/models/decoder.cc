#include "common/models/decoder.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/models/cpu_threads.h"
#include "common/models/rope.h"
#include "common/models/torch_util.h"

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

// One row of RmsNormFused, one element at a time: y = T(w * T(x * rstd)) with
// rstd = 1 / sqrt(sum(x^2) / dim + eps).
template <typename T>
void RmsNormRowScalar(const T* xr, const T* w, T* o, int64_t dim, float eps, float* buf) {
  float sum = 0;
  for (int64_t i = 0; i < dim; ++i) {
    buf[i] = static_cast<float>(xr[i]);
    sum += buf[i] * buf[i];
  }
  const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) {
    // Round the normalised value to T first, then multiply by the weight in T: the rounding
    // points of transformers' `weight * hidden.to(input_dtype)`.
    const T h = static_cast<T>(buf[i] * rstd);
    o[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(h));
  }
}

#if defined(__x86_64__)
// The same row, 16 lanes at a time (AVX-512F/BW/VL), the elements past the last full vector
// through masked loads and stores: every element of every row takes the same path, so a row's
// result depends only on its values and length. Squares are summed in 16 lanes (a different
// order from the scalar loop: both within fp32 rounding of the mean); the element-wise part
// rounds exactly as the scalar loop does (IEEE products, bf16 round-to-nearest-even).
#define SPECWIRE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
// GCC 12's AVX-512 headers seed some intrinsics with _mm512_undefined_*(), which its own
// -Wuninitialized flags once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

SPECWIRE_AVX512 inline __m512 LoadRow(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
SPECWIRE_AVX512 inline __m512 LoadRow(const at::BFloat16* p, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// bf16 bits (in the low half of each lane) of v, rounded to nearest even (NaN: 0x7FC0), as
// c10::BFloat16's conversion does.
SPECWIRE_AVX512 inline __m512i Bf16Bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_set1_epi32(0x7FC00000));
  return _mm512_srli_epi32(r, 16);
}
SPECWIRE_AVX512 inline __m512 Round(__m512 v, const float*) { return v; }
SPECWIRE_AVX512 inline __m512 Round(__m512 v, const at::BFloat16*) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(Bf16Bits(v), 16));
}
SPECWIRE_AVX512 inline void StoreRow(float* p, __mmask16 m, __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}
SPECWIRE_AVX512 inline void StoreRow(at::BFloat16* p, __mmask16 m, __m512 v) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(Bf16Bits(v)));
}

template <typename T>
SPECWIRE_AVX512 void RmsNormRowAvx512(const T* xr, const T* w, T* o, int64_t dim, float eps,
                                      float*) {
  auto mask = [&](int64_t i) -> __mmask16 {
    const int64_t left = dim - i;
    return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
  };
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < dim; i += 16) {
    const __m512 v = LoadRow(xr + i, mask(i));
    acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
  }
  const float sum = _mm512_reduce_add_ps(acc);
  const __m512 rstd = _mm512_set1_ps(1.0f / std::sqrt(sum / static_cast<float>(dim) + eps));
  for (int64_t i = 0; i < dim; i += 16) {
    const __mmask16 m = mask(i);
    const __m512 h = Round(_mm512_mul_ps(LoadRow(xr + i, m), rstd), xr);
    StoreRow(o + i, m, _mm512_mul_ps(LoadRow(w + i, m), h));
  }
}
#pragma GCC diagnostic pop
#undef SPECWIRE_AVX512

bool HasAvx512Rows() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}
#else
bool HasAvx512Rows() { return false; }
#endif

// y = w * bf16/fp32(x * rsqrt(mean(x^2) + eps)) for rows of length `dim` at x + row_offsets[r].
// The kernel is chosen once per process (the CPU's), so every row of every call takes it.
template <typename T>
void RmsNormRows(const T* x, const int64_t* row_offsets, const T* w, T* out, int64_t rows,
                 int64_t dim, float eps) {
  using RowFn = void (*)(const T*, const T*, T*, int64_t, float, float*);
  RowFn row = RmsNormRowScalar<T>;
#if defined(__x86_64__)
  if (HasAvx512Rows()) row = RmsNormRowAvx512<T>;
#endif
  constexpr int64_t kRowsPerItem = 16;
  IntraOpForEach((rows + kRowsPerItem - 1) / kRowsPerItem, [&](int64_t item) {
    thread_local std::vector<float> buf;
    buf.resize(dim);
    const int64_t end = std::min(rows, (item + 1) * kRowsPerItem);
    for (int64_t r = item * kRowsPerItem; r < end; ++r)
      row(x + row_offsets[r], w, out + r * dim, dim, eps, buf.data());
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
                           std::vector<std::unique_ptr<DecoderLayer>> layers, KernelSet kernels)
    : config_(std::move(config)),
      dtype_(dtype),
      final_norm_kind_(final_norm_kind),
      tied_(config_.tie_word_embeddings),
      layers_(std::move(layers)),
      kernels_(kernels) {}

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
  logits_ = Linear(lm_head(), {}, kernels_);
  // cuBLAS picks its kernel, and with it a row's summation order, by the row count in ways
  // InvariantRows does not cover (an H200 changed rows' bits from 9 rows on for some Qwen3-8B
  // shapes): decoding steps there run on one row count for every batch up to kCudaDecodeRows.
  // Measured: fp32 decoding bit-identical alone and batched with it (314 of 314 steps), 85 of 314
  // without. A GPU's decoding step is bound by reading the weights: the rows cost little.
  for (const at::Device& d : layer_devices) {
    if (d.is_cuda()) decode_row_floor_ = std::max(decode_row_floor_, kCudaDecodeRows);
  }
}

std::unique_ptr<ModelCache> DecoderModel::NewCache(int64_t batch, int64_t capacity) const {
  auto cache = std::make_unique<ModelCache>();
  cache->batch = batch;
  cache->capacity = capacity;
  for (const auto& layer : layers_) cache->layers.push_back(layer->NewCache(batch, capacity));
  return cache;
}

CapturedStates CapturedStates::Rows(int64_t b, int64_t start, int64_t length) const {
  auto rows = [&](const at::Tensor& t) { return t.select(0, b).narrow(0, start, length); };
  CapturedStates out;
  if (embedding.defined()) out.embedding = rows(embedding);
  for (const auto& [id, t] : layers) out.layers[id] = rows(t);
  if (final_norm.defined()) out.final_norm = rows(final_norm);
  return out;
}

int64_t DecoderModel::LastLayerToRun(const CaptureSpec& capture, bool need_top) const {
  int64_t last = need_top ? num_layers() - 1 : -1;
  for (int64_t id : capture.layers) last = std::max(last, id);
  return last;
}

std::vector<bool> DecoderModel::LayersToKeep(const CaptureSpec& capture) const {
  std::vector<bool> keep(layers_.size(), false);
  for (int64_t id : capture.layers) keep[id] = true;
  return keep;
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
  const int64_t last = LastLayerToRun(capture, need_top);
  const std::vector<bool> keep = LayersToKeep(capture);

  at::Tensor h =
      at::embedding(embed_tokens_, ToDeviceAsync(input_ids, input_device_));  // [B, T, H]
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
    case LogitsMode::kLast: return logits_(normed.select(1, normed.size(1) - 1));
    case LogitsMode::kAll: return logits_(normed);
  }
  return at::Tensor();
}

at::Tensor JoinSegments(std::vector<at::Tensor> parts, int64_t rows) {
  TORCH_CHECK(!parts.empty(), "no segment to join");
  int64_t filled = 0;
  for (const at::Tensor& t : parts) filled += t.size(1);
  if (filled < rows) {
    const at::Tensor& last = parts.back();
    parts.push_back(at::zeros({1, rows - filled, last.size(2)}, last.options()));
  }
  return at::cat(parts, 1);
}

at::Tensor DecoderLayer::ForwardPacked(const at::Tensor& h,
                                       const std::vector<PackedSegment>& segments) {
  at::Tensor out = h.clone();  // padding rows keep their input
  for (const PackedSegment& s : segments) {
    out.narrow(1, s.start, s.length)
        .copy_(Forward(h.narrow(1, s.start, s.length), *s.ctx, nullptr));
  }
  return out;
}

std::vector<CapturedStates> DecoderModel::ForwardPacked(
    const std::vector<std::vector<int64_t>>& sequences, const CaptureSpec& capture) {
  TORCH_CHECK(!sequences.empty(), "no sequence to pack");
  std::vector<ForwardContext> ctx;
  ctx.reserve(sequences.size());  // segments point into it
  std::vector<PackedSegment> segments;
  int64_t total = 0;
  for (const auto& seq : sequences) {
    const int64_t len = static_cast<int64_t>(seq.size());
    TORCH_CHECK(len > 0, "an empty sequence cannot be packed");
    ctx.emplace_back(0, len, dtype_);
    segments.push_back({total, len, &ctx.back()});
    total += len;
  }
  at::Tensor ids = at::zeros({1, InvariantRows(total)}, at::kLong);  // padding: token 0
  int64_t* p = ids.data_ptr<int64_t>();
  for (const auto& seq : sequences) p = std::copy(seq.begin(), seq.end(), p);

  const int64_t last = LastLayerToRun(capture, capture.final_norm);
  const std::vector<bool> keep = LayersToKeep(capture);

  CapturedStates packed;
  at::Tensor h = at::embedding(embed_tokens_, ToDeviceAsync(ids, input_device_));  // [1, N, H]
  if (capture.embedding) packed.embedding = h;
  for (int64_t i = 0; i <= last; ++i) {
    DecoderLayer& layer = *layers_[i];
    if (h.device() != layer.device()) h = h.to(layer.device());
    h = layer.ForwardPacked(h, segments);
    if (keep[i]) packed.layers[i] = h;
  }
  if (capture.final_norm) {
    if (h.device() != output_device_) h = h.to(output_device_);
    packed.final_norm = RmsNorm(h, norm_, config_.rms_norm_eps, final_norm_kind_);
  }
  std::vector<CapturedStates> out;
  for (const PackedSegment& seg : segments) out.push_back(packed.Rows(0, seg.start, seg.length));
  return out;
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
  const int64_t M = std::max(InvariantRows(N), decode_row_floor_);
  std::vector<ForwardContext> ctx;
  ctx.reserve(tokens.size());  // rows point into it
  at::Tensor ids = at::zeros({M, 1}, at::kLong);  // padding rows: token 0
  int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i) {
    const ModelCache& c = *caches[i];
    TORCH_CHECK(c.batch == 1, "decode rows need batch-1 caches");
    TORCH_CHECK(c.length + 1 <= c.capacity, "cache capacity ", c.capacity, " exceeded");
    id[i] = tokens[i];
    ctx.emplace_back(c.length, 1, dtype_);
  }
  at::Tensor h = at::embedding(embed_tokens_, ToDeviceAsync(ids, input_device_));  // [M, 1, H]
  at::Tensor logits = DecodeRowsLogits(h, ctx, caches);
  for (ModelCache* c : caches) c->length += 1;
  return logits.narrow(0, 0, N);
}

at::Tensor DecoderModel::DecodeRowsLogits(const at::Tensor& embedded,
                                          const std::vector<ForwardContext>& ctx,
                                          const std::vector<ModelCache*>& caches) {
  TORCH_CHECK(ctx.size() == caches.size(), "one context per cache");
  at::Tensor h = embedded;
  std::vector<DecodeRow> rows(caches.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    DecoderLayer& layer = *layers_[l];
    if (h.device() != layer.device()) h = h.to(layer.device());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = {&ctx[i], caches[i]->layers[l].get()};
    h = layer.DecodeRows(h, rows);
  }
  if (h.device() != output_device_) h = h.to(output_device_);
  at::Tensor normed = RmsNorm(h.select(1, 0), norm_, config_.rms_norm_eps, final_norm_kind_);
  return logits_(normed);  // [M, V]
}

}  // namespace specwire
