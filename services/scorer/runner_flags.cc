#include "services/scorer/runner_flags.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/wire.h"

ABSL_FLAG(std::string, dtype, "float32", "Drafter compute dtype: float32 | bfloat16 | float16.");
ABSL_FLAG(std::string, device, "cpu", "Where the drafter runs: cpu | cuda | cuda:N.");
ABSL_FLAG(int, threads, 0, "Intra-op CPU threads for the drafter (0: torch's default).");
ABSL_FLAG(std::string, wire_dtype, "auto",
          "Dtype of the features on the wire: fp32 | bf16 | auto (fp32 for a float32 drafter, "
          "bf16 otherwise).");
ABSL_FLAG(std::string, cache_dir, "",
          "Where the target's embed_tokens / lm_head fetched from the extractor are kept "
          "(safetensors keyed by tensor digest), so a restart does not fetch them again. "
          "Default: $XDG_CACHE_HOME/specwire or ~/.cache/specwire; \"none\" disables the cache.");
ABSL_FLAG(std::string, target_checkpoint, "",
          "Read embed_tokens / lm_head from this local target checkpoint directory instead of "
          "the extractor's GetTensors (its config must match the extractor's contract).");
ABSL_FLAG(int64_t, prefetch, 1, "Trajectories fetched ahead of the replay, per extractor.");
ABSL_FLAG(int64_t, generates_per_extractor, 8,
          "Generate calls in flight at once per extractor (it batches their decoding).");
ABSL_FLAG(int, extractor_attempts, 6,
          "Attempts per prompt when an extractor call fails with UNAVAILABLE / ABORTED (the "
          "extractor went away); backoff 0.1 s doubling up to 2 s. 1: no retry.");
ABSL_FLAG(std::string, results_dir, "",
          "Keep each completed prompt of a job that has a job_id in <dir>/<job_id>.jsonl "
          "(fsync'ed), so the same job submitted again after a restart resumes. Empty: off.");

namespace specwire {
namespace {

std::string DefaultCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) {
    return absl::StrCat(x, "/specwire");
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && *h) {
    return absl::StrCat(h, "/.cache/specwire");
  }
  return "";
}

}  // namespace

TorchScorerOptions DrafterOptionsFromFlags() {
  TorchScorerOptions o;
  o.dtype = absl::GetFlag(FLAGS_dtype);
  o.device = absl::GetFlag(FLAGS_device);
  o.threads = absl::GetFlag(FLAGS_threads);
  return o;
}

absl::StatusOr<ScoreRunnerOptions> RunnerOptionsFromFlags() {
  ScoreRunnerOptions o;
  o.head.target_checkpoint = absl::GetFlag(FLAGS_target_checkpoint);
  o.head.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (o.head.cache_dir.empty()) o.head.cache_dir = DefaultCacheDir();
  if (o.head.cache_dir == "none") o.head.cache_dir.clear();
  SW_ASSIGN_OR_RETURN(o.fetch.wire_dtype,
                      ParseWireDType(absl::GetFlag(FLAGS_wire_dtype), absl::GetFlag(FLAGS_dtype)));
  o.fetch.prefetch_per_extractor = absl::GetFlag(FLAGS_prefetch);
  o.fetch.generates_per_extractor = absl::GetFlag(FLAGS_generates_per_extractor);
  o.fetch.retry.max_attempts = std::max(1, absl::GetFlag(FLAGS_extractor_attempts));
  o.journal.results_dir = absl::GetFlag(FLAGS_results_dir);
  return o;
}

}  // namespace specwire
