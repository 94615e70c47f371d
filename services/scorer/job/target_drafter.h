// The target's own multi-token-prediction head as the job's drafter (ScoreSpec::drafter_path
// "mtp"): every Qwen3.5 / 3.6 checkpoint carries one (its mtp.* tensors), the drafter every such
// user gets for free. The extractor skips those tensors in its forward but names them in its
// contract and serves them through GetTensors, with the checkpoint's config.json.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/contract.h"
#include "services/scorer/job/extractor_pool.h"
#include "services/scorer/job/target_head_cache.h"

namespace specwire {

// The drafter_path that names the target's own MTP head.
inline constexpr const char* kTargetMtpDrafter = "mtp";

// A directory the MTP family loads in its target format (config.json + the mtp.* tensors): the
// local target checkpoint when the scorer has one (options.target_checkpoint), else
// <cache_dir>/target-mtp/<head digest>-<config digest>/ (a temporary directory without a cache),
// written once from the contract's config_json and the extractor's GetTensors of the contract's
// "mtp." names and reused by later jobs on the same head. FAILED_PRECONDITION naming drafter_path when the
// target has no MTP head or the extractor does not send its config; GetTensors' errors annotated.
absl::StatusOr<std::string> TargetMtpDrafterDir(
    const TargetHeadOptions& options, ExtractorEndpoint& endpoint,
    const ExtractionContract& contract, const std::function<void(const std::string&)>& log);

}  // namespace specwire
