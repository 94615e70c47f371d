// Loads a Hugging Face CausalLM checkpoint directory into a DecoderModel and states what it loaded.
//
// One pass over the model's weight list (DecoderModel::ForEachWeight) drives loading, shape
// validation and the load report: every expected tensor must exist with its exact shape; every
// checkpoint tensor must be either loaded or skipped for a stated reason (vision tower and MTP head
// of a VLM package, an lm_head tied to the embedding, rotary buffers); anything else is an error
// that names it. A VLM-packaged checkpoint (model.language_model.*) runs through the text path
// exactly like transformers' AutoModelForCausalLM.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint.h"
#include "common/contract.h"
#include "common/model_config.h"
#include "common/models/decoder.h"
#include "common/models/kernel_set.h"

namespace specwire {

struct LoadOptions {
  at::ScalarType dtype = at::kFloat;  // compute dtype: float32, bfloat16 or float16
  // Where layers run:
  //   "cpu", "cuda", "cuda:1"           every layer on one device
  //   "cuda:0,cuda:1"                   layers split into equal contiguous runs, in order
  //   "cuda:0=0-31,cuda:1=32-63"        explicit inclusive layer ranges covering every layer once
  // The embedding runs on the first layer's device; final norm and lm_head on the last one's.
  std::string device_map = "cpu";
  // ExtractionEngine::Load runs the canary (CanaryTokens(vocab, n), every tap fingerprinted into
  // the contract) with this many tokens; 0: none. 80 crosses the linear-attention chunk (64).
  int64_t canary_tokens = 80;
  // The targets' kernels (--kernels, common/models/kernel_set.h); unset: the family's default
  // (ResolveKernelSet, which says why): reference for the Qwen3.5 hybrid, fast for the dense
  // families.
  std::optional<KernelSet> kernels;
  // Benchmarks only: no weights are read. Every tensor config.json implies is drawn on the device
  // that runs it (normal(0, 0.02); RMS-norm weights 1), so a large target's shape can be timed
  // on a host that holds only its config.json. The contract says so (source_layout "random",
  // weights_digest "random:seed=N").
  std::optional<uint64_t> random_weights_seed;
};

struct LoadedModel {
  // Kept alive: CPU weights whose dtype already matches are views into its mapping (no copy).
  // Null for random weights (LoadOptions::random_weights_seed).
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<DecoderModel> model;
  ModelConfig config;
  ExtractionContract contract;
};

// The kernels a target of `family` runs for the choice (LoadOptions::kernels).
KernelSet ResolveKernelSet(ModelFamily family, std::optional<KernelSet> choice);

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& dir,
                                                       const LoadOptions& options);

// Resolves a device map (see LoadOptions::device_map) into one device per layer.
absl::StatusOr<std::vector<at::Device>> ResolveDeviceMap(const std::string& spec,
                                                        int64_t num_layers);

}  // namespace specwire
