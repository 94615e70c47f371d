// The scorer's request validation (SpecFromProto + ValidateSpec, what ScorerService::Score runs
// before queueing a job) on arbitrary ScoreRequest bytes: an error naming the field, or a spec
// inside every limit.
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "services/scorer/job/score_job.h"
#include "services/scorer/server.h"

// Parsing arbitrary bytes makes protobuf log every invalid UTF-8 string; the fuzzer's output
// should show findings only.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  v1::ScoreRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  static const ScoreLimits limits = [] {
    ScoreLimits o;
    o.max_prompts = 16;
    o.max_new_tokens = 64;
    o.max_ddtree_budget = 32;
    o.max_ddtree_budgets = 4;
    return o;
  }();
  static const ScoreLimits rooted = [] {
    ScoreLimits o = limits;
    o.data_root = "/nonexistent/specwire-data";
    return o;
  }();
  const ScoreSpec spec = SpecFromProto(request);
  for (const ScoreLimits* o : {&limits, &rooted}) {
    absl::Status s = ValidateSpec(spec, *o);
    if (!s.ok()) {
      fuzz::CheckError(s);
      FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument ||
                     s.code() == absl::StatusCode::kPermissionDenied,
                 "code %d: %s", static_cast<int>(s.code()), std::string(s.message()).c_str());
      continue;
    }
    FUZZ_CHECK(!spec.drafter_path.empty(), "empty drafter_path accepted");
    FUZZ_CHECK(spec.prompts.empty() != spec.dataset_path.empty(), "prompts xor dataset");
    FUZZ_CHECK(static_cast<int64_t>(spec.prompts.size()) <= o->max_prompts, "prompts");
    FUZZ_CHECK(spec.max_new_tokens >= 1 && spec.max_new_tokens <= o->max_new_tokens,
               "max_new_tokens %lld", static_cast<long long>(spec.max_new_tokens));
    FUZZ_CHECK(static_cast<int64_t>(spec.ddtree_budgets.size()) <= o->max_ddtree_budgets,
               "budgets");
    for (int32_t b : spec.ddtree_budgets) {
      FUZZ_CHECK(b >= 1 && b <= o->max_ddtree_budget, "budget %d", b);
    }
    if (o == &rooted) {
      // Nothing under the root exists, so an accepted path must lie under it lexically.
      for (const std::string& p : {spec.drafter_path, spec.dataset_path}) {
        const std::string norm = std::filesystem::path(p).lexically_normal().string();
        FUZZ_CHECK(p.empty() || norm == o->data_root || norm == o->data_root + "/" ||
                       norm.rfind(o->data_root + "/", 0) == 0,
                   "%s accepted outside data_root", p.c_str());
      }
    }
  }
  // Labels are derived from the paths; any path must give some label without crashing.
  (void)ResolveLabels(spec);
  return 0;
}
