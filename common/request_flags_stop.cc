// The request flags' stop group (common/request_flags.h).
#include <string>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/request_flags.h"
#include "common/status.h"

ABSL_FLAG(std::string, stop, "",
          "Extra stop token ids of a greedy completion, comma-separated (beside the target's "
          "eos).");
ABSL_FLAG(bool, ignore_model_eos, false,
          "A greedy completion does not stop at the target's eos_token_id (from "
          "generation_config.json when present, else config.json).");

namespace specwire {

absl::StatusOr<StopFlags> StopFromFlags() {
  StopFlags s;
  SW_ASSIGN_OR_RETURN(s.stop_token_ids, ParseIntList(absl::GetFlag(FLAGS_stop), "stop"));
  s.use_model_eos = !absl::GetFlag(FLAGS_ignore_model_eos);
  return s;
}

}  // namespace specwire
