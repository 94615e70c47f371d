// The decoder stack shared by every target architecture: embedding → layers → final norm →
// lm_head, with hidden-state capture at the taps a caller asks for.
//
// Architectures differ only inside their DecoderLayer (llama.h: Llama / Qwen2 / Qwen3;
// qwen3_5.h: Gated DeltaNet and gated attention) and in the final norm's flavour.
//
// Batches are right-padded [B, T]: every architecture here is causal, so a real token never sees
// the padding after it, and the captured rows of real tokens are exact. Positions are
// past_len + t for every row.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/extractor_api.h"
#include "common/model_config.h"
#include "common/models/kernel_set.h"
#include "common/models/linear.h"

namespace specwire {

// One tensor a module expects from the checkpoint. `slot` is where the loader puts it.
struct WeightSlot {
  std::string name;            // relative to the module ("self_attn.q_proj.weight")
  std::vector<int64_t> shape;  // expected shape
  at::Tensor* slot;
  bool keep_fp32 = false;      // loaded in fp32 whatever the compute dtype
};
using WeightVisitor = std::function<void(const WeightSlot&)>;

// Per-layer decoding state (KV cache, recurrent state). Owned by a ModelCache.
class LayerCache {
 public:
  virtual ~LayerCache() = default;
  virtual int64_t bytes() const { return 0; }  // memory it holds
  // What a rollback to this point needs: a copy of state that is not indexed by position (a
  // recurrent state, a convolution window); nullptr for caches indexed by position (K/V), which
  // roll back by their ModelCache's length alone.
  virtual std::unique_ptr<LayerCache> SaveState() const { return nullptr; }
  // Puts back what SaveState returned (a cache of the same kind and shape).
  virtual void RestoreState(const LayerCache& saved) { (void)saved; }
};

// Positions and rotary tables for one forward call; rotary tables are built once per device and
// shared by every attention layer on it.
class ForwardContext {
 public:
  ForwardContext(int64_t past_len, int64_t seq_len, at::ScalarType dtype)
      : past_len(past_len), seq_len(seq_len), dtype(dtype) {}
  const int64_t past_len;  // tokens already in the cache
  const int64_t seq_len;   // T, tokens in this call
  const at::ScalarType dtype;

  // cos/sin [T, rotary_dim] for `rope` on `device`, memoised.
  const std::pair<at::Tensor, at::Tensor>& Rotary(const class RotaryEmbedding& rope,
                                                  const at::Device& device) const;

 private:
  mutable std::map<std::pair<const void*, std::string>, std::pair<at::Tensor, at::Tensor>> rotary_;
};

// One sequence of a packed forward: rows [start, start + length) of a [1, N, hidden] input hold
// its tokens at positions 0..length-1 (ctx: past_len 0, seq_len = length; no cache).
struct PackedSegment {
  int64_t start;
  int64_t length;
  const ForwardContext* ctx;
};

// One sequence of a batched decoding step: its own position and cache (a batch-1 cache).
struct DecodeRow {
  const ForwardContext* ctx;  // past_len = the sequence's cache length, seq_len = 1
  LayerCache* cache;
};

// fn(start, length) for each segment's rows, or once for all `rows` when segments is null.
template <typename Fn>
void ForEachRowRange(const std::vector<PackedSegment>* segments, int64_t rows, Fn&& fn) {
  if (segments == nullptr) {
    fn(int64_t{0}, rows);
    return;
  }
  for (const PackedSegment& s : *segments) fn(s.start, s.length);
}

// fn(first, count) over batch rows [first, first + count) of a computation whose every row
// must come out as it would alone; the results (dim 0 = rows) are joined. On the CPU, ATen
// computes sigmoid, silu and softplus with one formula in a contiguous loop's vectorised body and
// another in its scalar tail (one ulp apart at times), so an element's bits depend on where the
// tail falls, i.e. on how many rows precede it. Rows of whole 64-element blocks (`row_elements`,
// contiguous) split alike stacked or alone, and a GPU computes every element with one formula:
// there fn runs once over all rows; otherwise once per row.
template <typename Fn>
at::Tensor ByBatchRows(int64_t rows, int64_t row_elements, bool cpu, Fn&& fn) {
  if (rows <= 1 || !cpu || row_elements % 64 == 0) return fn(int64_t{0}, rows);
  std::vector<at::Tensor> out;
  out.reserve(rows);
  for (int64_t r = 0; r < rows; ++r) out.push_back(fn(r, int64_t{1}));
  return at::cat(out, 0);
}

// op(x) by ByBatchRows over x's dim 0 (op takes and returns a tensor; an in-place op returns its
// argument).
template <typename Op>
at::Tensor ByBatchRow(const at::Tensor& x, Op&& op) {
  const int64_t rows = x.size(0);
  // The contiguous run a row's loop goes over: the whole row, or (a strided view) its last dim.
  const int64_t row_elements = x.is_contiguous() && rows > 0      ? x.numel() / rows
                               : x.dim() > 1 && x.stride(-1) == 1 ? x.size(-1)
                                                                  : 1;
  return ByBatchRows(rows, row_elements, x.is_cpu(),
                     [&](int64_t first, int64_t n) { return op(x.narrow(0, first, n)); });
}

// Per-segment results [1, length, C], in segment order, joined into [1, rows, C] (zeros in the
// padding rows after the last segment).
at::Tensor JoinSegments(std::vector<at::Tensor> parts, int64_t rows);

class DecoderLayer {
 public:
  virtual ~DecoderLayer() = default;
  // h: [B, T, hidden] on device(); returns the residual stream after the layer.
  virtual at::Tensor Forward(const at::Tensor& h, const ForwardContext& ctx, LayerCache* cache) = 0;
  // One new token of each of rows.size() sequences, each at its own position with its own cache:
  // h [M, 1, hidden] with M ≥ rows.size() (rows past rows.size() are padding: their mixer output
  // is zero and nothing is cached for them). The default runs Forward row by row; the layers
  // here share every projection's matrix product across the M rows and attend (or run the
  // recurrence) per sequence.
  virtual at::Tensor DecodeRows(const at::Tensor& h, const std::vector<DecodeRow>& rows);
  // Several sequences packed without padding between them: h [1, N, hidden], the segments in
  // order, rows past the last segment padding (their output is unspecified). Each sequence's
  // rows come out bit-identical to a packed forward of that sequence alone: what runs over all
  // rows at once is row-local (matrix products on DecoderModel::InvariantRows rows, RMS norms,
  // exact adds and products); whatever mixes tokens or rounds a transcendental function (rope,
  // attention, convolution, the delta rule, SiLU, gates) runs per segment, on views of the same
  // shape and strides as the sequence alone. The default runs Forward per segment.
  virtual at::Tensor ForwardPacked(const at::Tensor& h, const std::vector<PackedSegment>& segments);
  virtual void ForEachWeight(const WeightVisitor& visit) = 0;
  // Called once after loading: fuse projections, move to the device.
  virtual void Prepare(const at::Device& device) = 0;
  virtual std::unique_ptr<LayerCache> NewCache(int64_t batch, int64_t capacity) const = 0;
  // Human-readable kernel description for the contract ("sdpa", "gated-delta-rule chunked fp32").
  virtual std::string KernelVariant() const = 0;
  const at::Device& device() const { return device_; }

 protected:
  at::Device device_ = at::kCPU;
};

// Decoding state of a whole model for one batch.
struct ModelCache {
  int64_t batch = 0;
  int64_t capacity = 0;  // max tokens (prompt + generated)
  int64_t length = 0;    // tokens already processed
  std::vector<std::unique_ptr<LayerCache>> layers;
};

// Which hidden states to keep (see common/contract.h for the layer-id convention).
struct CaptureSpec {
  std::vector<int64_t> layers;  // decoder layer ids, each in [0, num_layers)
  bool embedding = false;
  bool final_norm = false;
  bool empty() const { return layers.empty() && !embedding && !final_norm; }
};
// The extractor API's selection (common/extractor_api.h) as the decoder captures it.
inline CaptureSpec CaptureOf(const StateSelection& s) {
  return {s.layer_ids, s.embedding, s.final_norm};
}

struct CapturedStates {
  at::Tensor embedding;                  // [B, T, hidden] when requested
  std::map<int64_t, at::Tensor> layers;  // layer id → [B, T, hidden]
  at::Tensor final_norm;                 // [B, T, hidden] when requested

  // Rows [start, start + length) of batch row b of every tap: views, [length, hidden] each.
  CapturedStates Rows(int64_t b, int64_t start, int64_t length) const;
};

enum class LogitsMode {
  kNone,  // extraction: the stack stops after the last layer anyone needs
  kLast,  // next-token logits of position T-1 of every row: [B, vocab]
  kAll    // [B, T, vocab]
};

// How a model's final norm is computed.
enum class NormKind {
  kPlain,          // Llama / Qwen2 / Qwen3: w * (x / rms(x)).to(dtype)
  kOnePlusWeight,  // Qwen3.5: ((x / rms(x)) * (1 + w)) in fp32, then cast
};

// RMSNorm exactly as transformers rounds it. x: [..., dim]; w: [dim].
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, NormKind kind);

// The same NormKind::kPlain math and rounding points in one pass over each row (CPU, float32 and
// bfloat16; other cases fall back to RmsNorm). The only difference from transformers is the
// order in which a row's squares are summed, so results agree to fp32 rounding of the mean
// (bf16 outputs may differ by one ulp where that flips a rounding). About 4x faster than the
// six-kernel composite on a 2-core CPU, where norms are ~15 % of a layer in bf16.
at::Tensor RmsNormFused(const at::Tensor& x, const at::Tensor& w, double eps);

class DecoderModel {
 public:
  // `kernels` runs the logits product (the layers take theirs from their builder).
  DecoderModel(ModelConfig config, at::ScalarType dtype, NormKind final_norm_kind,
               std::vector<std::unique_ptr<DecoderLayer>> layers,
               KernelSet kernels = KernelSet::kReference);

  const ModelConfig& config() const { return config_; }
  at::ScalarType dtype() const { return dtype_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  const DecoderLayer& layer(int64_t i) const { return *layers_[i]; }
  // First device (embedding) and last device (final norm, lm_head).
  const at::Device& input_device() const { return input_device_; }
  const at::Device& output_device() const { return output_device_; }
  // Model-level weights: model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent when
  // tied), then every layer's under model.layers.{i}.
  void ForEachWeight(const WeightVisitor& visit);
  // After loading. `layer_devices[i]` is layer i's device.
  void Prepare(const std::vector<at::Device>& layer_devices);

  const at::Tensor& embed_tokens() const { return embed_tokens_; }
  const at::Tensor& lm_head() const { return tied_ ? embed_tokens_ : lm_head_; }

  std::unique_ptr<ModelCache> NewCache(int64_t batch, int64_t capacity) const;

  // Runs input_ids [B, T] (int64, any device) through the stack. With a cache, the tokens extend
  // it (positions continue at cache->length) and cache->length grows by T. Captured states stay on
  // the device that produced them. Returns logits per `mode` (undefined tensor for kNone).
  at::Tensor Forward(const at::Tensor& input_ids, ModelCache* cache, const CaptureSpec& capture,
                     CapturedStates* captured, LogitsMode mode);

  // One greedy-decoding step of several sequences, each with its own batch-1 cache: tokens[i]
  // goes in at position caches[i]->length, which grows by one. Returns next-token logits
  // [N, vocab]. The matrix products run on InvariantRows(N) rows (padding rows after the real
  // ones), where a row's rounding does not depend on how many rows there are: MKL and oneDNN
  // pick other kernels, and other summation orders, for one row or a few, and where "a few" ends
  // depends on the CPU (measured: from 4 rows on an AVX2 Xeon, from 6 on an AVX-512 one), so a
  // sequence's tokens are the same whatever else decodes beside it (decoder_test.cc:
  // DecodeStep.*, batched_decode_test.cc).
  at::Tensor DecodeStep(const std::vector<int64_t>& tokens, const std::vector<ModelCache*>& caches);
  // DecodeStep's work after the embedding: `embedded` [M, 1, H] (rows past caches.size() are
  // padding), ctx[i] the position of row i (past_len = its cache's length, seq_len 1). Returns
  // the logits of all M rows and leaves the caches' lengths alone (DecodeStep advances them).
  // Only device work is queued, nothing waits for the device: a CUDA graph can capture it
  // (bench/decode_bench.cc measures what that would save).
  at::Tensor DecodeRowsLogits(const at::Tensor& embedded, const std::vector<ForwardContext>& ctx,
                              const std::vector<ModelCache*>& caches);

  // Sequences packed one after another into a single forward (no cache, no logits): the layers'
  // matrix products run once over every sequence's rows (InvariantRows(total) rows, padding
  // last), attention and recurrences per sequence (DecoderLayer::ForwardPacked). Returns the
  // captured taps of every sequence, [length, hidden] each, on the device that produced them;
  // each is bit-identical to a packed forward of that sequence alone.
  std::vector<CapturedStates> ForwardPacked(const std::vector<std::vector<int64_t>>& sequences,
                                            const CaptureSpec& capture);

  // Decoding steps run on at least this many rows (default kMinRows): one row count for every
  // batch up to it, so that a library whose kernel choice depends on the row count in ways
  // InvariantRows does not cover still gives a row the same bits (a GPU's decode is bound by
  // reading the weights, so extra rows cost little there).
  void SetDecodeRowFloor(int64_t rows) { decode_row_floor_ = rows; }
  int64_t decode_row_floor() const { return decode_row_floor_; }

  // The decoding steps' row floor on CUDA (DecoderModel::Prepare).
  static constexpr int64_t kCudaDecodeRows = 64;

  static constexpr int64_t kRowQuantum = 4;
  static constexpr int64_t kMinRows = 8;
  // Rows a matrix product runs on so that each row's rounding does not depend on how many rows
  // share it: max(kMinRows, n rounded up to a multiple of kRowQuantum) (measured on AVX2 and
  // AVX-512 Xeons and an AVX-512 EPYC, MKL fp32 and oneDNN bf16: every such row count gives each
  // row the same bits, at any offset, up to thousands of rows).
  static int64_t InvariantRows(int64_t n) {
    const int64_t rounded = (n + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
    return rounded < kMinRows ? kMinRows : rounded;
  }

 private:
  // The last layer a forward runs (every layer when the top is needed: final norm, logits, a
  // cache), and which layers' outputs it captures.
  int64_t LastLayerToRun(const CaptureSpec& capture, bool need_top) const;
  std::vector<bool> LayersToKeep(const CaptureSpec& capture) const;

  ModelConfig config_;
  at::ScalarType dtype_;
  NormKind final_norm_kind_;
  bool tied_;
  std::vector<std::unique_ptr<DecoderLayer>> layers_;
  at::Tensor embed_tokens_;  // [vocab, hidden]
  at::Tensor norm_;          // [hidden]
  at::Tensor lm_head_;       // [vocab, hidden], undefined when tied
  KernelSet kernels_;
  // The logits product over lm_head(). With fast kernels on the CPU it holds lm_head in oneDNN's
  // layout: a second copy of [vocab, hidden], which decoding pays back (its 8-row products run
  // ~3x faster in fp32); lm_head() stays for embedding lookups and drafters' heads.
  Linear logits_;
  at::Device input_device_ = at::kCPU;
  at::Device output_device_ = at::kCPU;
  int64_t decode_row_floor_ = kMinRows;
};

}  // namespace specwire
