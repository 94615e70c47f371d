// The libtorch implementation of ExtractorBackend: an ExtractionEngine behind the plain types of
// work.h, so rpc code never sees torch.
#pragma once

#include <memory>

#include "services/extractor/work.h"

namespace specwire {

class ExtractionEngine;

struct BackendOptions {
  std::string model_dir;
  std::string dtype = "float32";  // compute dtype
  std::string device_map = "cpu";
  int threads = 0;  // intra-op CPU threads; 0: torch's default
  // Where they run (common/models/cpu_threads.h): auto | none | cores | CPU ids and ranges.
  std::string cpu_binding = "auto";
  // How a batch of sequences runs (engine.h): packed or per sequence (bit-identical whatever
  // shares the batch), or as padded forwards.
  std::string batch_layout = "auto";
  // The target's kernels (common/models/kernel_set.h): auto | reference | fast.
  std::string kernels = "auto";
  int64_t canary_tokens = 80;  // the contract's canary fingerprint (0: none)
};

absl::StatusOr<std::unique_ptr<ExtractorBackend>> LoadTorchBackend(const BackendOptions& options);

}  // namespace specwire
