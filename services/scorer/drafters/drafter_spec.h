// The plain description of a loaded drafter, and its check against a target's contract: no
// torch and no protobuf, so that the job logic, reports and the drafters share them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/contract.h"
#include "services/scorer/acceptance/acceptance.h"

namespace specwire {

// What everything outside a drafter family may know of a loaded drafter: its family's row
// (registry.h) and its checkpoint fill it; the job logic, reports and metrics read it.
struct DrafterSpec {
  std::string path;
  std::string config_json;  // config.json as read (for reports)
  // The family (registry.h: the metrics' and reports' method label unless the job names one)
  // and the checkpoint format it was read in ("z-lab", "speculators", "specforge", "target").
  std::string method = "dflash";
  std::string format = "z-lab";
  // The tree the family drafts: kTreeDDTree (a best-first tree over the block's per-position
  // marginals), kTreeEagle (EAGLE's top-k tree of its chain) or "" (none: its drafts depend on
  // the drafts before them, or its selector walks one path).
  std::string tree = kTreeDDTree;
  // Whether the family fills its blocks with mask_token_id (which must then be in the target's
  // vocabulary).
  bool uses_mask_token = true;
  // Whether drafting needs the target's embedding and lm_head (false: the checkpoint has its own).
  bool needs_target_head = true;
  // One drafter forward per draft (a chain: EAGLE-3, chained MTP) rather than one per block
  // (DFlash's block, P-EAGLE's parallel draft): what capacity planning charges per step.
  bool autoregressive = false;
  // What target layer id L − 1 stands for: the final-norm output (DFlash reads HF
  // hidden_states[L]) or the last layer's output before the norm (EAGLE-3's auxiliary states, as
  // vLLM and SGLang capture them).
  bool last_layer_is_final_norm = true;
  int32_t block_size = 0;  // the longest block: the anchor and block_size − 1 drafts
  int64_t num_layers = 0;          // the drafter's own layers
  int64_t hidden_size = 0;         // the drafter's own hidden size
  int64_t target_hidden_size = 0;  // per target layer: fc in_features / len(target_layer_ids)
  int64_t fc_in_features = 0;      // = len(target_layer_ids) × target_hidden_size
  int64_t num_target_layers = 0;   // from config.json; 0 when it does not say
  std::vector<int64_t> target_layer_ids;
  int64_t mask_token_id = 0;
  int64_t vocab_size = 0;  // the target vocabulary the drafter was built for (config.json)
  std::string dtype;       // compute dtype the drafter runs in ("float32", ...)
  std::string device;      // "cpu", "cuda:0"
  // The checkpoint tensors that became the drafter, where they are a part of a larger checkpoint
  // (an MTP head among its target's tensors); empty otherwise.
  std::vector<std::string> tensors;
};

// The drafter against the target the extractor serves: num_target_layers, hidden size (fc
// in_features / len(target_layer_ids)), vocab_size, every target_layer_id inside the target,
// mask_token_id inside the vocabulary. FAILED_PRECONDITION naming every mismatching field with
// both values, e.g.
//   "num_target_layers: drafter expects 64, extractor serves 36".
absl::Status CheckDrafterContract(const DrafterSpec& drafter, const ExtractionContract& target);

}  // namespace specwire
