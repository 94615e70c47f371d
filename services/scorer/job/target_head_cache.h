// The target's embed_tokens and lm_head, which a DFlash drafter shares with its target: from a
// local checkpoint (no transfer), from the digest-keyed cache on disk, or fetched from the
// extractor (GetTensors) and cached.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/contract.h"
#include "services/scorer/job/scorer_backend.h"

namespace specwire {

class ExtractorEndpoint;

// Where the head comes from: a local checkpoint directory, else the extractor's GetTensors,
// cached under cache_dir keyed by tensor digest ("" : no cache).
struct TargetHeadOptions {
  std::string target_checkpoint;
  std::string cache_dir;
};

// Gives `backend` the head of the target `contract` names unless it holds it already (keyed by
// the weights digest). Says where it came from through `log`.
absl::Status EnsureTargetHead(const TargetHeadOptions& options, ScorerBackend& backend,
                              ExtractorEndpoint& endpoint, const ExtractionContract& contract,
                              const std::function<void(const std::string&)>& log);

// `s` as a file name: every character but [A-Za-z0-9._-] replaced by '-' (a digest's ':').
std::string FileSafe(const std::string& s);

// The cache on disk: <dir>/tensors/<digest>.safetensors (one tensor, named by its canonical
// name) and <dir>/targets/<weights digest>.json ({name: digest}).
absl::StatusOr<TargetHead> LoadCachedTargetHead(const std::string& cache_dir,
                                                const std::string& weights_digest);
absl::Status StoreTargetHead(const std::string& cache_dir, const std::string& weights_digest,
                             const TargetHead& head);
// The head of a local checkpoint directory (embed_tokens; lm_head or, when tied, the
// embedding), after checking its config against the extractor's contract.
absl::StatusOr<TargetHead> LoadCheckpointTargetHead(const std::string& dir,
                                                    const ExtractionContract& contract);

}  // namespace specwire
