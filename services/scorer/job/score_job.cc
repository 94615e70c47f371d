#include "services/scorer/job/score_job.h"

#include <chrono>
#include <optional>
#include <span>

#include "absl/strings/str_cat.h"
#include "common/build_info.h"
#include "common/digest.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/job/target_drafter.h"
#include "services/scorer/job/trajectory_fetcher.h"

namespace specwire {

// Trajectories replayed in one lockstep batch at most.
constexpr int64_t kMaxReplayBatch = 8;

namespace {

// The target's half of a live loop over an extractor session: the drafter's states picked out
// of each answer (DrafterFeatureStates), in target_layer_ids order.
class SessionTarget : public LiveTarget {
 public:
  SessionTarget(ExtractorSession* session, const DrafterSpec& drafter, int64_t num_layers)
      : session_(session), drafter_(drafter), num_layers_(num_layers) {}

  absl::StatusOr<Verified> Verify(const std::vector<int64_t>& draft,
                                  const std::vector<float>& draft_probs,
                                  bool commit_accepted) override {
    SessionVerifyParams p;
    p.commit_accepted = commit_accepted;
    p.draft_tokens = draft;
    p.rule = draft_probs.empty() ? DraftRule::kArgmaxDraft : DraftRule::kDraftDistribution;
    p.draft_probs = draft_probs;
    SW_ASSIGN_OR_RETURN(SessionVerifyReply r, session_->Verify(p));
    Verified v;
    v.accepted = r.accepted;
    v.next_token = r.next_token;
    SW_ASSIGN_OR_RETURN(v.states, DrafterFeatureStates(r.states, drafter_.target_layer_ids,
                                                       num_layers_,
                                                       drafter_.last_layer_is_final_norm,
                                                       static_cast<int64_t>(draft.size()) + 1,
                                                       "session verify answer"));
    return v;
  }
  absl::Status Commit(int64_t accepted) override { return session_->Commit(accepted).status(); }

 private:
  ExtractorSession* session_;
  const DrafterSpec& drafter_;
  int64_t num_layers_;
};

}  // namespace

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

std::string FileDigestOrEmpty(const std::string& path) {
  if (path.empty()) return "";
  auto text = ReadFileToString(path);
  return text.ok() ? DigestBytes(std::as_bytes(std::span(*text))) : "";
}

std::string ScoreProvenanceJson(const ExtractionContract& contract, const std::string& drafter_dtype,
                                const std::string& chat_template_record,
                                const std::string& dataset_digest,
                                const std::string& drafter_digest) {
  nlohmann::json record = nullptr;
  if (!chat_template_record.empty()) {
    record = nlohmann::json::parse(chat_template_record, nullptr, false);
    if (record.is_discarded()) record = chat_template_record;
  }
  return nlohmann::json{{"specwire_version", SpecwireVersion()},
                        {"specwire_commit", SpecwireCommit()},
                        {"weights_digest", contract.weights_digest},
                        {"tokenizer_digest", contract.tokenizer_digest},
                        {"target_chat_template_digest", contract.chat_template_digest},
                        {"prompts_chat_template", record},
                        {"dataset_digest", dataset_digest},
                        {"drafter_digest", drafter_digest},
                        {"target_dtype", contract.compute_dtype},
                        {"drafter_dtype", drafter_dtype}}
      .dump();
}

absl::Status ScoreRunner::Run(const ScoreSpec& spec_in, const ScoreEvents& events,
                              const std::atomic<bool>& cancelled) {
  SW_RETURN_IF_ERROR(ValidateSpec(spec_in, options_.limits));
  ScoreSpec spec = spec_in;
  spec.labels = ResolveLabels(spec);

  // 1. The target, as every extractor states it.
  SW_ASSIGN_OR_RETURN(const ConnectedTarget target,
                      ConnectTarget(*pool_, options_.fetch.retry, cancelled, options_.log));
  // The target's own MTP head: its tensors and config, from the extractor (or the checkpoint).
  if (spec.drafter_path == kTargetMtpDrafter) {
    SW_ASSIGN_OR_RETURN(spec.drafter_path,
                        TargetMtpDrafterDir(options_.head, *target.endpoints[0], target.contract,
                                            options_.log));
  }
  // 2. The drafter, checked against it before any work; its family labels the job unless the
  // job names a method.
  SW_ASSIGN_OR_RETURN(const DrafterSpec drafter, LoadCheckedDrafter(spec, target.contract));
  if (spec.labels.method.empty()) spec.labels.method = drafter.method;
  SW_ASSIGN_OR_RETURN(const TreeSettings trees,
                      ResolveTrees(spec, drafter.tree, drafter.block_size));
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
  LiveSummary live;
  if (spec.live.enabled) {
    SW_RETURN_IF_ERROR(LiveScores(spec, target, drafter, prompts, journal.get(), tally, cancelled,
                                  &live));
  } else {
    SW_RETURN_IF_ERROR(
        ReplayTrajectories(spec, trees, target, drafter, prompts, journal.get(), tally, cancelled));
  }

  // 6. The summary, over the prompts in index order.
  SW_RETURN_IF_ERROR(ValidateAcceptance(tally.results(), drafter.block_size));
  if (events.on_summary) {
    AcceptanceSummary summary = Summarize(tally.results(), drafter.block_size, spec.summary);
    summary.tree_method = spec.live.enabled ? "" : trees.method;
    summary.tree_depth = trees.depth;
    summary.tree_top_k = trees.top_k;
    if (spec.live.enabled) {
      summary.loop = "live";
      summary.live = live;
    }
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

  const ReplayAsks asks{trees, spec.sampling, spec.predicted_cutoffs};
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
    auto replayed = backend_->ReplayBatch(batch, asks);
    if (!replayed.ok()) {
      // Which prompt: replayed one by one, the first that fails names itself.
      for (const FetchedTrajectory& item : items) {
        auto one = backend_->Replay(*item.trajectory, asks);
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

absl::Status ScoreRunner::LiveScores(const ScoreSpec& spec, const ConnectedTarget& target,
                                     const DrafterSpec& drafter,
                                     const std::vector<std::vector<int64_t>>& prompts,
                                     ResultsJournal* journal, Tally& tally,
                                     const std::atomic<bool>& cancelled, LiveSummary* live) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  if (journal != nullptr) {
    for (const auto& [i, score] : journal->completed()) {
      if (i < n) tally.Record(score);
    }
  }
  live->setting = spec.live.setting;
  live->rule = spec.live.rule;
  live->seed = spec.live.seed;
  const int64_t num_layers = target.contract.num_layers;
  SessionOpenParams open;
  open.states = DrafterStates(drafter.target_layer_ids, num_layers,
                              drafter.last_layer_is_final_norm);
  open.dtype = options_.fetch.wire_dtype;
  open.max_new_tokens = static_cast<uint32_t>(spec.max_new_tokens);
  open.max_draft_tokens = static_cast<uint32_t>(std::max(drafter.block_size - 1, 0));
  open.temperature = spec.live.setting.temperature;
  open.top_p = spec.live.setting.top_p;
  open.top_k = static_cast<uint32_t>(std::max(spec.live.setting.top_k, 0));
  LiveSettings settings;
  settings.setting = spec.live.setting;
  settings.rule = spec.live.rule;
  settings.max_new_tokens = spec.max_new_tokens;
  // Greedy: the first prompts scored in this run are also replayed (their live trajectories kept).
  const bool greedy = spec.live.setting.temperature <= 0;
  std::map<int64_t, PromptScore> checked;
  int64_t scored = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (journal != nullptr && journal->completed().count(i)) continue;
    if (cancelled) return absl::CancelledError("request cancelled");
    ExtractorEndpoint* endpoint = target.endpoints[i % target.endpoints.size()];
    // Prompt i's session draws from seed + i (the target's) and the drafter's from the same.
    open.seed = spec.live.seed + static_cast<uint64_t>(i);
    settings.seed = open.seed;
    open.prompt = InputSequence::Tokens(prompts[i]);
    open.request_id = absl::StrCat("score-live-", spec.labels.drafter, "-", i);
    auto session = endpoint->OpenSession(open);
    if (!session.ok()) {
      return Annotate(session.status(), absl::StrCat("prompt ", i, ": opening a session on ",
                                                     endpoint->address()));
    }
    const SessionOpenReply& opened = (*session)->opened();
    LiveStart start;
    start.prompt = opened.prompt_token_ids;
    start.first_token = opened.next_token;
    std::vector<ReceivedState> prompt_states = opened.states;
    SW_ASSIGN_OR_RETURN(start.states,
                        DrafterFeatureStates(prompt_states, drafter.target_layer_ids, num_layers,
                                             drafter.last_layer_is_final_norm,
                                             static_cast<int64_t>(start.prompt.size()),
                                             "session open answer"));
    settings.stop_token_ids = opened.eos_token_ids;
    SessionTarget link(session->get(), drafter, num_layers);
    absl::StatusOr<LiveResult> r = backend_->Live(start, link, settings);
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("prompt ", i, " (live loop)"));
    SW_RETURN_IF_ERROR(Annotate((*session)->Close(), absl::StrCat("prompt ", i, ": session")));
    live->verify_calls += r->verify_calls;
    live->drafted_tokens += r->drafted_tokens;
    live->accepted_tokens += r->accepted_tokens;
    live->drafter_seconds += r->drafter_seconds;
    live->target_seconds += r->target_seconds;
    PromptScore score;
    score.prompt_index = i;
    score.acceptance.step_lengths = r->step_lengths;
    score.acceptance.prompt_tokens = static_cast<int64_t>(start.prompt.size());
    score.acceptance.completion_tokens = static_cast<int64_t>(r->completion.size());
    score.finish_reason = r->finish_reason;
    score.trajectory = start.prompt;
    score.trajectory.insert(score.trajectory.end(), r->completion.begin(), r->completion.end());
    score.trajectory_digest = TrajectoryDigest(score.trajectory);
    score.tau = MeanStepLength(score.acceptance.step_lengths);
    if (greedy && scored < spec.live.self_check_prompts) checked[i] = score;
    ++scored;
    if (journal != nullptr) SW_RETURN_IF_ERROR(journal->Append(score));
    tally.Record(score);
  }
  if (checked.empty()) return absl::OkStatus();

  // The self-check: the same prompts' Generate trajectories, replayed.
  TrajectoryRequest request;
  request.prompts = &prompts;
  for (const auto& [i, score] : checked) request.todo.push_back(i);
  request.max_new_tokens = spec.max_new_tokens;
  request.target_layer_ids = drafter.target_layer_ids;
  request.num_layers = num_layers;
  request.last_layer_is_final_norm = drafter.last_layer_is_final_norm;
  request.request_id_prefix = absl::StrCat("score-selfcheck-", spec.labels.drafter, "-");
  TrajectoryFetcher fetcher(target.endpoints, std::move(request), options_.fetch, cancelled,
                            options_.log);
  const ReplayAsks chain_only;
  for (size_t done = 0; done < checked.size();) {
    if (cancelled) return absl::CancelledError("request cancelled");
    std::optional<FetchedTrajectory> item = fetcher.Next(std::chrono::milliseconds(50));
    if (!item) continue;
    ++done;
    SW_RETURN_IF_ERROR(item->trajectory.status());
    SW_ASSIGN_OR_RETURN(ResponseAcceptance replayed,
                        backend_->Replay(*item->trajectory, chain_only));
    const PromptScore& mine = checked.at(item->index);
    ++live->self_check_prompts;
    if (item->trajectory->tokens == mine.trajectory &&
        replayed.step_lengths == mine.acceptance.step_lengths) {
      ++live->self_check_matching;
    } else {
      live->self_check_mismatches.push_back(item->index);
      Log(absl::StrCat("live self-check: prompt ", item->index, " differs from its replay (",
                       item->trajectory->tokens == mine.trajectory ? "same trajectory, "
                                                                    : "other trajectory, ",
                       "τ live ", mine.tau, ", replay ",
                       MeanStepLength(replayed.step_lengths), ")"));
    }
  }
  std::sort(live->self_check_mismatches.begin(), live->self_check_mismatches.end());
  return absl::OkStatus();
}

}  // namespace specwire
