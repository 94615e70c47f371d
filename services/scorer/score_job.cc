#include "services/scorer/score_job.h"

#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/status.h"

namespace specwire {

// Trajectories replayed in one lockstep batch at most.
constexpr int64_t kMaxReplayBatch = 8;

ScoreRunner::ScoreRunner(ScorerBackend* backend, ExtractorPool* pool, ScoreRunnerOptions options)
    : backend_(backend), pool_(pool), options_(std::move(options)) {}

void ScoreRunner::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

// The job's running numbers: every prompt's acceptance by index (for the summary) and the
// progress the events report after each prompt.
class ScoreRunner::Tally {
 public:
  Tally(int64_t prompts, const ScoreEvents& events) : results_(prompts), events_(events) {
    progress_.total = prompts;
  }

  void Record(const PromptScore& score) {
    results_[score.prompt_index] = score.acceptance;
    const ResponseAcceptance& r = score.acceptance;
    if (!r.step_lengths.empty()) {
      sum_of_means_ += score.tau;
      ++with_steps_;
    }
    progress_.steps += static_cast<int64_t>(r.step_lengths.size());
    for (int32_t v : r.step_lengths) tokens_ += v;
    ++progress_.done;
    progress_.tau_so_far = with_steps_ ? sum_of_means_ / static_cast<double>(with_steps_) : 0;
    progress_.tau_pooled_so_far =
        progress_.steps ? static_cast<double>(tokens_) / static_cast<double>(progress_.steps) : 0;
    if (events_.on_prompt) events_.on_prompt(score);
    ReportProgress();
  }
  void ReportProgress() const {
    if (events_.on_progress) events_.on_progress(progress_);
  }
  bool complete() const { return progress_.done >= progress_.total; }
  const std::vector<ResponseAcceptance>& results() const { return results_; }

 private:
  std::vector<ResponseAcceptance> results_;
  const ScoreEvents& events_;
  ScoreProgress progress_;
  double sum_of_means_ = 0;
  int64_t with_steps_ = 0;
  int64_t tokens_ = 0;
};

absl::Status ScoreRunner::Run(const ScoreSpec& spec_in, const ScoreEvents& events,
                              const std::atomic<bool>& cancelled) {
  SW_RETURN_IF_ERROR(ValidateSpec(spec_in, options_.limits));
  ScoreSpec spec = spec_in;
  spec.labels = ResolveLabels(spec);

  // 1. The target, as every extractor states it.
  SW_ASSIGN_OR_RETURN(const ConnectedTarget target,
                      ConnectTarget(*pool_, options_.fetch.retry, cancelled, options_.log));
  // 2. The drafter, checked against it before any work; its family labels the job unless the
  // job names a method.
  SW_ASSIGN_OR_RETURN(const DrafterSpec drafter, LoadCheckedDrafter(spec, target.contract));
  if (spec.labels.method.empty()) spec.labels.method = drafter.method;
  SW_ASSIGN_OR_RETURN(const TreeSettings trees,
                      ResolveTrees(spec, drafter.method, drafter.block_size));
  // 3. Prompts, 4. the target head.
  std::string template_record;
  SW_ASSIGN_OR_RETURN(const std::vector<std::vector<int64_t>> prompts,
                      ResolvePrompts(spec, options_.limits, target.endpoints[0], target.contract,
                                     &template_record));
  // Prompts prepared with another chat template (or flags) than the drafter's training data.
  SW_RETURN_IF_ERROR(CheckTemplateRecord(spec.drafter_path, template_record));
  SW_RETURN_IF_ERROR(EnsureTargetHead(options_.head, *backend_, *target.endpoints[0],
                                      target.contract, options_.log));
  if (cancelled) return absl::CancelledError("request cancelled");
  // 5. The journal of a resumable job, then the trajectories and their replays.
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ResultsJournal> journal,
                      OpenJournal(spec, target.contract, drafter, prompts));

  ScoreStart start;
  start.contract = target.contract;
  start.chat_template_record = template_record;
  start.drafter = drafter;
  start.labels = spec.labels;
  start.trees = trees;
  start.prompts_total = static_cast<int64_t>(prompts.size());
  for (ExtractorEndpoint* e : target.endpoints) start.extractors.push_back(e->address());
  if (events.on_start) events.on_start(start);
  Tally tally(start.prompts_total, events);
  tally.ReportProgress();
  SW_RETURN_IF_ERROR(
      ReplayTrajectories(spec, trees, target, drafter, prompts, journal.get(), tally, cancelled));

  // 6. The summary, over the prompts in index order.
  SW_RETURN_IF_ERROR(ValidateAcceptance(tally.results(), drafter.block_size));
  if (events.on_summary) {
    AcceptanceSummary summary = Summarize(tally.results(), drafter.block_size, spec.summary);
    summary.tree_method = trees.method;
    summary.tree_depth = trees.depth;
    summary.tree_top_k = trees.top_k;
    events.on_summary(summary);
  }
  return absl::OkStatus();
}

absl::StatusOr<DrafterSpec> ScoreRunner::LoadCheckedDrafter(const ScoreSpec& spec,
                                                            const ExtractionContract& contract) {
  auto loaded = backend_->LoadDrafter(spec.drafter_path);
  if (!loaded.ok()) {
    return Annotate(loaded.status(), absl::StrCat("drafter_path ", spec.drafter_path));
  }
  SW_RETURN_IF_ERROR(Annotate(backend_->FitDrafterToTarget(*loaded, contract.num_layers),
                              absl::StrCat("drafter_path ", spec.drafter_path)));
  SW_RETURN_IF_ERROR(CheckDrafterContract(*loaded, contract));
  return loaded;
}

absl::StatusOr<std::unique_ptr<ResultsJournal>> ScoreRunner::OpenJournal(
    const ScoreSpec& spec, const ExtractionContract& contract, const DrafterSpec& drafter,
    const std::vector<std::vector<int64_t>>& prompts) {
  const std::string path = options_.journal.PathFor(spec);
  if (path.empty()) return std::unique_ptr<ResultsJournal>();
  SW_ASSIGN_OR_RETURN(const std::string drafter_digest, DigestDrafterFiles(spec.drafter_path));
  const std::string key =
      JobKey(spec, contract, drafter, drafter_digest, prompts, options_.fetch.wire_dtype);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ResultsJournal> journal, ResultsJournal::Open(path, key));
  const int64_t n = static_cast<int64_t>(prompts.size());
  int64_t resumed = 0;
  for (const auto& entry : journal->completed()) resumed += entry.first < n ? 1 : 0;
  Log(absl::StrCat("results journal ", path, ": ", resumed, " of ", n, " prompts already scored",
                   journal->ignored_lines() > 0
                       ? absl::StrCat(" (", journal->ignored_lines(),
                                      " lines of another job spec or torn, ignored)")
                       : ""));
  return journal;
}

absl::Status ScoreRunner::ReplayTrajectories(const ScoreSpec& spec, const TreeSettings& trees,
                                             const ConnectedTarget& target,
                                             const DrafterSpec& drafter,
                                             const std::vector<std::vector<int64_t>>& prompts,
                                             ResultsJournal* journal, Tally& tally,
                                             const std::atomic<bool>& cancelled) {
  // Prompts a results journal holds from an earlier run of the job are reported first and not
  // fetched again.
  const int64_t n = static_cast<int64_t>(prompts.size());
  TrajectoryRequest request;
  request.prompts = &prompts;
  if (journal != nullptr) {
    for (const auto& [i, score] : journal->completed()) {
      if (i < n) tally.Record(score);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (journal == nullptr || !journal->completed().count(i)) request.todo.push_back(i);
  }
  request.max_new_tokens = spec.max_new_tokens;
  request.target_layer_ids = drafter.target_layer_ids;
  request.num_layers = target.contract.num_layers;
  request.last_layer_is_final_norm = drafter.last_layer_is_final_norm;
  request.request_id_prefix = absl::StrCat("score-", spec.labels.drafter, "-");
  request.final_norm = !spec.sampling.empty();
  TrajectoryFetcher fetcher(target.endpoints, std::move(request), options_.fetch, cancelled,
                            options_.log);

  while (!tally.complete()) {
    if (cancelled) return absl::CancelledError("request cancelled");
    // The trajectories fetched so far (up to kMaxReplayBatch) replay together: one drafter
    // forward per lockstep step for all of them.
    std::vector<FetchedTrajectory> items;
    for (auto wait = std::chrono::milliseconds(50);
         static_cast<int64_t>(items.size()) < kMaxReplayBatch; wait = std::chrono::milliseconds(0)) {
      std::optional<FetchedTrajectory> item = fetcher.Next(wait);
      if (!item) break;
      SW_RETURN_IF_ERROR(item->trajectory.status());
      items.push_back(std::move(*item));
    }
    if (items.empty()) continue;
    std::vector<const Trajectory*> batch;
    for (const FetchedTrajectory& item : items) batch.push_back(&*item.trajectory);
    auto replayed = backend_->ReplayBatch(batch, trees, spec.sampling);
    if (!replayed.ok()) {
      // Which prompt: replayed one by one, the first that fails names itself.
      for (const FetchedTrajectory& item : items) {
        auto one = backend_->Replay(*item.trajectory, trees, spec.sampling);
        if (!one.ok()) return Annotate(one.status(), absl::StrCat("prompt ", item.index));
      }
      return replayed.status();
    }
    for (size_t k = 0; k < items.size(); ++k) {
      const FetchedTrajectory* item = &items[k];
      const Trajectory& trajectory = *item->trajectory;
      PromptScore score;
      score.prompt_index = item->index;
      score.acceptance = std::move((*replayed)[k]);
      score.acceptance.prompt_tokens = trajectory.prompt_len;
      score.acceptance.completion_tokens =
          static_cast<int64_t>(trajectory.tokens.size()) - score.acceptance.prompt_tokens;
      score.finish_reason = item->finish_reason;
      score.trajectory_digest = TrajectoryDigest(trajectory.tokens);
      score.trajectory = trajectory.tokens;
      score.tau = MeanStepLength(score.acceptance.step_lengths);
      if (journal != nullptr) SW_RETURN_IF_ERROR(journal->Append(score));
      tally.Record(score);
    }
  }
  return absl::OkStatus();
}

}  // namespace specwire
