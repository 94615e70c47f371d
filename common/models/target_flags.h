// The flags that say how a target is loaded and how it computes, defined once for every binary
// that loads one through the extraction engine (specwire-extractor, specwire-extract,
// specwire-replay, extract_bench): --dtype, --device_map, --threads, --kernels, --batch_layout.
// Each binary keeps
// its own flag naming the checkpoint (--model, --target_checkpoint): what the directory must
// hold differs between them (a tokenizer for the server, a drafter's target for the replay).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/models/loader.h"

namespace specwire {

struct TargetFlags {
  std::string dtype;         // --dtype, "auto" resolved: float32 | bfloat16 | float16
  std::string device_map;    // --device_map
  int threads = 0;           // --threads; 0: torch's default
  std::string kernels;       // --kernels
  std::string batch_layout;  // --batch_layout
};

// The flags' values, --dtype=auto resolved to `default_dtype` (the binary's own: bfloat16 for
// the server, float32 for the offline tools). INVALID_ARGUMENT naming the flag for a negative
// --threads.
absl::StatusOr<TargetFlags> TargetFlagsFromFlags(absl::string_view default_dtype);

// The loader's options from them (dtype and kernels parsed; errors name the flag).
absl::StatusOr<LoadOptions> TargetLoadOptions(const TargetFlags& flags);

}  // namespace specwire
