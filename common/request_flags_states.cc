// The request flags' states group (common/request_flags.h).
#include <string>

#include "absl/flags/flag.h"
#include "common/command_line.h"
#include "common/request_flags.h"
#include "common/status.h"

ABSL_FLAG(std::string, layers, "",
          "Decoder layer ids k whose output to capture, comma-separated: layer k's output is HF "
          "hidden_states[k+1].");
ABSL_FLAG(bool, embedding, false, "Also capture the embedding output (HF hidden_states[0]).");
ABSL_FLAG(bool, final_norm, false,
          "Also capture the final-norm output (HF hidden_states[num_layers]).");

namespace specwire {

absl::StatusOr<StateSelection> StatesFromFlags() {
  StateSelection s;
  SW_ASSIGN_OR_RETURN(s.layer_ids, ParseIntList(absl::GetFlag(FLAGS_layers), "layers"));
  s.embedding = absl::GetFlag(FLAGS_embedding);
  s.final_norm = absl::GetFlag(FLAGS_final_norm);
  return s;
}

}  // namespace specwire
