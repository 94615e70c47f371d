// The flags that say what a request asks of the target, defined once for the binaries that build
// one from their command line: specwire-extract (in process), specwire-cli (over gRPC),
// specwire-replay and specwire-score.
//
//   tokens   --tokens, --tokens_file          token-id sequences       extract, cli, replay, score
//   prompts  --text, --prompts_file           texts (or ids) the server tokenizes    cli, score
//   states   --layers, --embedding, --final_norm   which hidden states          extract, cli
//   stop     --stop, --ignore_model_eos       where a greedy completion ends  extract, cli, replay
//
// Each group is an object file of its own in one static library, so a binary links (and --help
// lists) only the groups whose functions it calls. --max_new_tokens is not a request flag here: it
// is a generate call's budget in specwire-extract and specwire-cli (32, each its own) and a scored
// trajectory's in specwire-replay and specwire-score (256, services/scorer/replay/score_flags.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/extractor_api.h"
#include "nlohmann/json.hpp"

namespace specwire {

// tokens: the sequences of --tokens ("1,2,3;4,5": ids comma-separated, ';' between sequences) or
// of --tokens_file (a JSON file holding a list of token-id lists), at most one of the two. Every
// sequence must hold a token: an empty one is refused naming its flag and index. Neither flag:
// an empty list. Errors are INVALID_ARGUMENT naming the flag (NOT_FOUND for a missing file).
absl::StatusOr<std::vector<std::vector<int64_t>>> TokenSequencesFromFlags();
// How many of --tokens, --tokens_file were given (a non-empty value).
int TokenSourcesGiven();
// --tokens_file's path ("" when not given), e.g. for a provenance digest.
std::string TokensFilePath();

// A JSON list of token ids; INVALID_ARGUMENT "<what>: ..." for anything else.
absl::StatusOr<std::vector<int64_t>> TokenIdsFromJson(const nlohmann::json& j, absl::string_view what);

// prompts: the prompts of --prompts_file (a JSON list, each a text or a token-id list), then
// --text's (one text). Texts are tokenized where they are served. Empty token-id lists are refused
// as in TokenSequencesFromFlags.
absl::StatusOr<std::vector<InputSequence>> TextPromptsFromFlags();
// How many of --text, --prompts_file were given.
int PromptSourcesGiven();
// --prompts_file's path ("" when not given).
std::string PromptsFilePath();

// states: --layers (decoder layer ids k, comma-separated: layer k's output, HF hidden_states[k+1]),
// --embedding (hidden_states[0]), --final_norm (hidden_states[num_layers]). The ids are checked
// against the target where it is loaded.
absl::StatusOr<StateSelection> StatesFromFlags();

// stop: --stop's extra stop token ids, and whether the target's own eos ends a completion
// (not with --ignore_model_eos).
struct StopFlags {
  std::vector<int64_t> stop_token_ids;
  bool use_model_eos = true;
};
absl::StatusOr<StopFlags> StopFromFlags();

}  // namespace specwire
