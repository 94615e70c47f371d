#include "services/scorer/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/stream_reactor.h"
#include "common/status.h"

namespace specwire {

// ---------------------------------------------------------------------------------------------
// Conversions

void PromptScoreToProto(const PromptScore& s, v1::PromptResult* out) {
  out->set_prompt_index(static_cast<uint32_t>(s.prompt_index));
  out->set_prompt_tokens(static_cast<uint32_t>(s.acceptance.prompt_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(s.acceptance.completion_tokens));
  for (int32_t v : s.acceptance.step_lengths) out->add_step_lengths(static_cast<uint32_t>(v));
  out->set_tau(s.tau);
  for (const auto& [budget, lengths] : s.acceptance.ddtree_step_lengths) {
    auto& l = (*out->mutable_ddtree_step_lengths())[static_cast<uint32_t>(budget)];
    for (int32_t v : lengths) l.add_lengths(static_cast<uint32_t>(v));
  }
  out->set_finish_reason(s.finish_reason);
}

PromptScore PromptScoreFromProto(const v1::PromptResult& p) {
  PromptScore s;
  s.prompt_index = p.prompt_index();
  s.acceptance.prompt_tokens = p.prompt_tokens();
  s.acceptance.completion_tokens = p.completion_tokens();
  s.acceptance.step_lengths.assign(p.step_lengths().begin(), p.step_lengths().end());
  for (const auto& [budget, lengths] : p.ddtree_step_lengths()) {
    s.acceptance.ddtree_step_lengths[static_cast<int32_t>(budget)].assign(lengths.lengths().begin(),
                                                                          lengths.lengths().end());
  }
  s.tau = p.tau();
  s.finish_reason = p.finish_reason();
  return s;
}

void ProgressToProto(const ScoreProgress& p, v1::Progress* out) {
  out->set_prompts_done(static_cast<uint32_t>(p.done));
  out->set_prompts_total(static_cast<uint32_t>(p.total));
  out->set_steps(static_cast<uint64_t>(p.steps));
  out->set_tau_so_far(p.tau_so_far);
}

void SummaryToProto(const AcceptanceSummary& s, v1::AcceptanceSummary* out) {
  out->set_block_size(static_cast<uint32_t>(s.block_size));
  out->set_responses(static_cast<uint64_t>(s.responses));
  out->set_steps(static_cast<uint64_t>(s.steps));
  out->set_tau_mean_of_means(s.tau_mean_of_means);
  out->set_tau_pooled(s.tau_pooled);
  for (int64_t v : s.histogram) out->add_histogram(static_cast<uint64_t>(v));
  for (double v : s.per_position_acceptance) out->add_per_position_acceptance(v);
  out->set_num_drafts(static_cast<uint64_t>(s.num_drafts));
  out->set_num_draft_tokens(static_cast<uint64_t>(s.num_draft_tokens));
  out->set_num_accepted_tokens(static_cast<uint64_t>(s.num_accepted_tokens));
  for (int64_t v : s.num_accepted_tokens_per_pos)
    out->add_num_accepted_tokens_per_pos(static_cast<uint64_t>(v));
  out->set_acceptance_rate(s.acceptance_rate);
  for (const auto& [budget, tau] : s.ddtree_tau) {
    (*out->mutable_ddtree_tau())[static_cast<uint32_t>(budget)] = tau.first;
    (*out->mutable_ddtree_tau_pooled())[static_cast<uint32_t>(budget)] = tau.second;
  }
}

AcceptanceSummary SummaryFromProto(const v1::AcceptanceSummary& p) {
  AcceptanceSummary s;
  s.block_size = static_cast<int32_t>(p.block_size());
  s.responses = static_cast<int64_t>(p.responses());
  s.steps = static_cast<int64_t>(p.steps());
  s.tau_mean_of_means = p.tau_mean_of_means();
  s.tau_pooled = p.tau_pooled();
  s.histogram.assign(p.histogram().begin(), p.histogram().end());
  s.per_position_acceptance.assign(p.per_position_acceptance().begin(),
                                   p.per_position_acceptance().end());
  s.num_drafts = static_cast<int64_t>(p.num_drafts());
  s.num_draft_tokens = static_cast<int64_t>(p.num_draft_tokens());
  s.num_accepted_tokens = static_cast<int64_t>(p.num_accepted_tokens());
  s.num_accepted_tokens_per_pos.assign(p.num_accepted_tokens_per_pos().begin(),
                                       p.num_accepted_tokens_per_pos().end());
  s.acceptance_rate = p.acceptance_rate();
  for (const auto& [budget, tau] : p.ddtree_tau()) {
    auto pooled = p.ddtree_tau_pooled().find(budget);
    s.ddtree_tau[static_cast<int32_t>(budget)] = {
        tau, pooled == p.ddtree_tau_pooled().end() ? 0.0 : pooled->second};
  }
  return s;
}

ScoreSpec SpecFromProto(const v1::ScoreRequest& r) {
  ScoreSpec s;
  s.drafter_path = r.drafter_path();
  for (const auto& p : r.prompts()) {
    if (p.input_case() == v1::PromptInput::kText) {
      s.prompts.push_back(InputSequence::Text(p.text()));
    } else {
      s.prompts.push_back(InputSequence::Tokens(
          std::vector<int64_t>(p.tokens().ids().begin(), p.tokens().ids().end())));
    }
  }
  s.dataset_path = r.dataset_path();
  s.max_new_tokens = r.max_new_tokens() == 0 ? 256 : r.max_new_tokens();
  if (r.ddtree_budgets_size() > 0) {
    s.ddtree_budgets.clear();
    for (uint32_t b : r.ddtree_budgets()) {
      s.ddtree_budgets.push_back(static_cast<int32_t>(std::min<uint32_t>(b, INT32_MAX)));
    }
  }
  s.labels.drafter = r.drafter_label();
  s.labels.dataset = r.dataset_label();
  s.labels.method = r.method_label();
  s.add_special_tokens = r.add_special_tokens();
  s.max_prompts = r.max_prompts();
  s.job_id = r.job_id();
  return s;
}

void SpecToProto(const ScoreSpec& s, v1::ScoreRequest* out) {
  out->set_drafter_path(s.drafter_path);
  for (const InputSequence& p : s.prompts) {
    auto* in = out->add_prompts();
    if (p.is_text) {
      in->set_text(p.text);
    } else {
      for (int64_t id : p.token_ids) in->mutable_tokens()->add_ids(static_cast<int32_t>(id));
    }
  }
  out->set_dataset_path(s.dataset_path);
  out->set_max_new_tokens(static_cast<uint32_t>(s.max_new_tokens));
  for (int32_t b : s.ddtree_budgets) out->add_ddtree_budgets(static_cast<uint32_t>(b));
  out->set_drafter_label(s.labels.drafter);
  out->set_dataset_label(s.labels.dataset);
  out->set_method_label(s.labels.method);
  out->set_add_special_tokens(s.add_special_tokens);
  out->set_max_prompts(static_cast<uint32_t>(s.max_prompts));
  out->set_job_id(s.job_id);
}

// ---------------------------------------------------------------------------------------------
// The worker

ScoreWorker::ScoreWorker(ScoreRunner* runner, int64_t max_queue, ScorerMetrics* metrics)
    : runner_(runner), max_queue_(max_queue), metrics_(metrics), thread_([this] { Loop(); }) {}

ScoreWorker::~ScoreWorker() { Shutdown(); }

absl::Status ScoreWorker::Submit(std::shared_ptr<ScoreJob> job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!accepting_) return absl::UnavailableError("the scorer is shutting down");
  if (static_cast<int64_t>(queue_.size()) >= max_queue_) {
    return absl::ResourceExhaustedError(absl::StrCat("the scorer's queue is full (", max_queue_,
                                                     " jobs wait, --max_queue); retry later"));
  }
  queue_.push_back(std::move(job));
  if (metrics_) metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  cv_.notify_all();
  return absl::OkStatus();
}

bool ScoreWorker::Remove(const std::shared_ptr<ScoreJob>& job, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    queue_.erase(it);
    if (metrics_) metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
    cv_.notify_all();
  }
  job->on_done(status);
  return true;
}

int64_t ScoreWorker::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

void ScoreWorker::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty()) return;
    std::shared_ptr<ScoreJob> job = std::move(queue_.front());
    queue_.pop_front();
    running_ = job;
    if (metrics_) {
      metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
      metrics_->SetRunning(true);
    }
    lock.unlock();
    absl::Status status = job->cancelled ? absl::CancelledError("request cancelled")
                                         : runner_->Run(job->spec, job->events, job->cancelled);
    job->on_done(status);
    lock.lock();
    running_.reset();
    if (metrics_) metrics_->SetRunning(false);
    cv_.notify_all();
  }
}

void ScoreWorker::Drain(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(seconds));
  cv_.wait_until(lock, deadline, [&] { return queue_.empty() && !running_; });
  // Out of time: cancel what is left (the running job stops at its next prompt).
  if (running_) running_->cancelled = true;
  for (auto& j : queue_) j->cancelled = true;
}

void ScoreWorker::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stop_ = true;
    if (running_) running_->cancelled = true;
    for (auto& j : queue_) j->cancelled = true;  // run as CANCELLED at once
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------------------------------------
// The stream

ScorerService::ScorerService(ScoreWorker* worker, ScorerMetrics* metrics, ScoreRunnerOptions limits)
    : worker_(worker), metrics_(metrics), limits_(std::move(limits)) {}

grpc::ServerWriteReactor<v1::ScoreResponse>* ScorerService::Score(grpc::CallbackServerContext* ctx,
                                                                  const v1::ScoreRequest* request) {
  ScorerMetrics* metrics = metrics_;
  auto* r = new StreamReactor<v1::ScoreResponse>(
      SteadyDeadline(ctx), [metrics](const std::string& code, double seconds) {
        metrics->RequestDone("Score", code, seconds);
      });
  auto job = std::make_shared<ScoreJob>();
  job->spec = SpecFromProto(*request);
  absl::Status valid = ValidateSpec(job->spec, limits_);
  if (!valid.ok()) {
    r->Fail(valid);
    return r;
  }
  // The events run on the worker thread only, so their shared state needs no lock.
  struct JobState {
    ScoreLabels labels;
    int32_t block_size = 0;
    std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  };
  auto state = std::make_shared<JobState>();
  job->events.on_start = [r, state](const ScoreStart& s) {
    state->labels = s.labels;
    state->block_size = s.drafter.block_size;
    state->last = std::chrono::steady_clock::now();
    v1::ScoreResponse m;
    ContractToProto(s.contract, m.mutable_contract());
    r->SendMessage(std::move(m));
  };
  job->events.on_progress = [r, state, metrics](const ScoreProgress& p) {
    metrics->Progress(state->labels, p);
    v1::ScoreResponse m;
    ProgressToProto(p, m.mutable_progress());
    r->SendMessage(std::move(m));
  };
  job->events.on_prompt = [r, state, metrics](const PromptScore& s) {
    const auto now = std::chrono::steady_clock::now();
    // A result read back from the journal was counted when it was scored (maybe by an earlier
    // process, whose counters Prometheus already has): counting it again would double it.
    if (!s.resumed) {
      metrics->PromptScored(state->labels, s.acceptance, state->block_size,
                            std::chrono::duration<double>(now - state->last).count());
    }
    state->last = now;
    v1::ScoreResponse m;
    PromptScoreToProto(s, m.mutable_result());
    r->SendMessage(std::move(m));
  };
  job->events.on_summary = [r, state, metrics](const AcceptanceSummary& s) {
    metrics->Summary(state->labels, s);
    v1::ScoreResponse m;
    SummaryToProto(s, m.mutable_summary());
    r->SendMessage(std::move(m));
  };
  job->on_done = [r](const absl::Status& s) {
    if (s.ok()) {
      r->Complete();
    } else {
      r->Fail(s);
    }
    r->ReleaseWork();
  };
  ScoreWorker* worker = worker_;
  r->AttachWork([job, worker](bool deadline) {
    job->cancelled = true;
    // A queued job leaves the queue now (its on_done fails the stream); a running one stops at
    // its next prompt.
    worker->Remove(job, deadline ? absl::DeadlineExceededError("deadline exceeded")
                                 : absl::CancelledError("request cancelled"));
  });
  absl::Status submitted = worker_->Submit(job);
  if (!submitted.ok()) {
    r->Fail(submitted);
    r->ReleaseWork();  // on_done will never run
  }
  return r;
}

}  // namespace specwire
