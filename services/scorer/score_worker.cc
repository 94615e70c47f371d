#include "services/scorer/score_worker.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace specwire {

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
  NotifyCapacityLocked();
  cv_.notify_all();
  return absl::OkStatus();
}

void ScoreWorker::NotifyCapacityLocked() {
  const bool room = static_cast<int64_t>(queue_.size()) < max_queue_;
  if (room == had_room_ || !capacity_observer_) return;
  had_room_ = room;
  capacity_observer_(room);
}

bool ScoreWorker::Remove(const std::shared_ptr<ScoreJob>& job, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    queue_.erase(it);
    if (metrics_) metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
    NotifyCapacityLocked();
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
    NotifyCapacityLocked();
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

}  // namespace specwire
