// Conversions between the scorer's plain job types (services/scorer/score_spec.h, score_job.h,
// acceptance.h) and its wire messages (specwire/v1/scorer.proto), shared by the scorer service,
// the specwire-score CLI, the CheckpointScorer upload service and tests. The extraction contract's
// conversions are convert.h's. rpc-only: never include this from a torch translation unit.
#pragma once

#include "proto/specwire/v1/scorer.pb.h"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/job/score_job.h"

namespace specwire {

// Results, progress and the summary.
void PromptScoreToProto(const PromptScore& s, v1::PromptResult* out);
PromptScore PromptScoreFromProto(const v1::PromptResult& p);
void ProgressToProto(const ScoreProgress& p, v1::Progress* out);
void SummaryToProto(const AcceptanceSummary& s, v1::AcceptanceSummary* out);
AcceptanceSummary SummaryFromProto(const v1::AcceptanceSummary& p);
// Proto defaults applied: max_new_tokens 0 → 256, no ddtree_budgets → [8].
ScoreSpec SpecFromProto(const v1::ScoreRequest& r);
void SpecToProto(const ScoreSpec& s, v1::ScoreRequest* out);

}  // namespace specwire
