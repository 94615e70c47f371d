#include "common/models/target_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/models/batch_layout.h"
#include "common/models/kernel_set.h"
#include "common/models/torch_util.h"
#include "common/status.h"

ABSL_FLAG(std::string, dtype, "auto",
          "The target's compute dtype: float32 | bfloat16 | float16 | auto (bfloat16 in "
          "specwire-extractor; float32 in specwire-extract, specwire-replay and extract_bench, "
          "exact against transformers' float32). specwire-replay's drafter computes in it too.");
ABSL_FLAG(std::string, device_map, "cpu",
          "Where the target's layers run: cpu | cuda | cuda:0,cuda:1 (even split) | "
          "cuda:0=0-31,cuda:1=32-63. A drafter in the same process runs on the target's output "
          "device.");
ABSL_FLAG(int, threads, 0, "Intra-op CPU threads of the target's forwards (0: torch's default).");
ABSL_FLAG(std::string, kernels, "auto", specwire::kKernelsFlagHelp);
ABSL_FLAG(std::string, batch_layout, "auto", specwire::kBatchLayoutFlagHelp);

namespace specwire {

absl::StatusOr<TargetFlags> TargetFlagsFromFlags(absl::string_view default_dtype) {
  TargetFlags f;
  f.dtype = absl::GetFlag(FLAGS_dtype);
  if (f.dtype == "auto") f.dtype = std::string(default_dtype);
  f.device_map = absl::GetFlag(FLAGS_device_map);
  f.threads = absl::GetFlag(FLAGS_threads);
  if (f.threads < 0) return absl::InvalidArgumentError("--threads must not be negative");
  f.kernels = absl::GetFlag(FLAGS_kernels);
  f.batch_layout = absl::GetFlag(FLAGS_batch_layout);
  return f;
}

absl::StatusOr<LoadOptions> TargetLoadOptions(const TargetFlags& flags) {
  LoadOptions load;
  auto dtype = ParseComputeDtype(flags.dtype);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtype.status().message()));
  }
  load.dtype = *dtype;
  load.device_map = flags.device_map;
  SW_ASSIGN_OR_RETURN(load.kernels, ParseKernelSet(flags.kernels, "--kernels"));
  return load;
}

}  // namespace specwire
