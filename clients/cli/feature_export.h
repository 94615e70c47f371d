// `specwire-cli export`: training features written as the offline datasets of SpecForge and
// vllm-project/speculators (the same layouts as the Python client's specwire_client.export; the
// layouts are described there and in training/README.md).
//
//   specforge   data_{i:08d}.ckpt (torch.save dicts)
//               dflash: input_ids [T], loss_mask [T] (int64), hidden_states [T, k*H]
//               eagle3: input_ids, loss_mask, hidden_state [1, T, H] (final norm),
//                       aux_hidden_state [1, T, 3H]
//   speculators a `datasets` directory (input_ids, loss_mask, seq_len) and
//               hidden_states/hs_{i}.safetensors: hidden_states [T, k+1, H] (the layers, then the
//               last decoder layer's output before the final norm), token_ids [T] int64
//   both        specwire_export.json: contract, layers in both numberings, dtype, template
//               records, counts; written last.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "clients/cpp/extractor_client.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"

namespace specwire {

struct ExportSpec {
  std::string format;              // "specforge" | "speculators"
  std::string layout;              // "dflash" | "eagle3"
  std::vector<int32_t> layer_ids;  // specwire ids: id k = output of decoder layer k
  DType dtype = DType::kBF16;      // kBF16 | kF32
};

// INVALID_ARGUMENT naming the flag for an unknown format or layout.
absl::Status CheckFormatAndLayout(const std::string& format, const std::string& layout);

// The layers a layout reads when none are given: a DFlash drafter's
// dflash_config.target_layer_ids; for EAGLE-3 the drafter's eagle_aux_hidden_state_layer_ids
// (hidden-state indices) or the default [1, L/2 - 1, L - 4]. `drafter_config` may be null.
absl::StatusOr<std::vector<int32_t>> DefaultExportLayers(const std::string& layout,
                                                         int32_t num_layers,
                                                         const nlohmann::json* drafter_config);

// In range, distinct, three for EAGLE-3.
absl::Status CheckExportLayers(const std::string& layout, const std::vector<int32_t>& ids,
                               int32_t num_layers);

struct ExportRow {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> loss_mask;  // 0/1, as long as input_ids
  nlohmann::json chat_template;    // the line's template record, or null
};

// A JSONL dataset of prepared lines: {"input_ids": [...], "loss_mask": [...] (optional: every
// token supervised), "chat_template": {...} (optional)}. Lines with "messages" are refused (the
// Python client renders chat templates: python -m specwire_client.export). Errors name the line
// and the field.
absl::StatusOr<std::vector<ExportRow>> ReadExportDataset(const std::string& path);

struct ExportOptions {
  uint32_t sequences_per_request = 8;
  uint32_t max_chunk_bytes = 0;
  std::string source;  // recorded in the manifest
};

// Extracts every row's states and writes the format's layout under `out_dir` (created). Every
// stream must come from the target of the first one (FAILED_PRECONDITION otherwise).
absl::Status ExportFeatures(ExtractorClient& client, const ExtractionContract& contract,
                            const ExportSpec& spec, const std::vector<ExportRow>& rows,
                            const std::string& out_dir, const ExportOptions& options,
                            std::ostream& report);

}  // namespace specwire
