// The matrix-product shapes of a target's decoder layers, for the benchmarks that time or probe
// them (bench/extract_bench.cc, bench/decode_bench.cc).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "common/model_config.h"

namespace specwire {

// The [out_features, in_features] of every linear layer one decoder layer runs, as the forward
// runs them (fused q|k|v and gate|up: common/models/llama.cc, qwen3_5.cc).
inline std::vector<std::pair<int64_t, int64_t>> LayerGemms(const ModelConfig& c, LayerType type) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  std::vector<std::pair<int64_t, int64_t>> g;
  if (type == LayerType::kLinearAttention) {
    const int64_t key = c.linear_num_key_heads * c.linear_key_head_dim;
    const int64_t value = c.linear_num_value_heads * c.linear_value_head_dim;
    g.push_back({2 * key + 2 * value, H});           // in_proj_qkvz
    g.push_back({2 * c.linear_num_value_heads, H});  // in_proj_ba
    g.push_back({H, value});                         // out_proj
  } else {
    const int64_t q = c.num_heads * D * (c.attn_output_gate ? 2 : 1);
    g.push_back({q + 2 * c.num_kv_heads * D, H});  // q (| gate) | k | v
    g.push_back({H, c.num_heads * D});             // o_proj
  }
  g.push_back({2 * c.intermediate_size, H});  // gate | up
  g.push_back({H, c.intermediate_size});      // down
  return g;
}

}  // namespace specwire
