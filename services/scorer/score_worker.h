// The scorer's job queue: one worker thread runs queued jobs in order, each to completion,
// through a ScoreRunner (the drafter is not shared, so jobs never overlap).
//
// Not the same queue as the extractor's Scheduler (services/extractor/scheduler.h), although both
// admit work into a bounded deque with removal on cancel: the Scheduler picks work out of the
// middle of its queue by kind and token budget to form forward batches on the engine thread,
// and completes rejected work with per-kind callbacks, while the ScoreWorker is strictly FIFO over
// whole jobs, each of which waits on remote extractors for most of its run, and drains with a
// time limit after which it cancels. Sharing a class would leave only the bounded deque in
// common; each keeps its ~20 lines of admission.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "services/scorer/metrics.h"
#include "services/scorer/job/score_job.h"

namespace specwire {

// A queued or running job. `on_done` runs exactly once: on the worker thread after the job, or
// on the thread that removes it from the queue (cancel, shutdown) or whose Submit fails.
struct ScoreJob {
  ScoreSpec spec;
  ScoreEvents events;
  std::atomic<bool> cancelled{false};
  std::function<void(const absl::Status&)> on_done;
};

// One worker thread running queued jobs in order through a ScoreRunner.
class ScoreWorker {
 public:
  // `runner` and `metrics` (may be null) must outlive the worker.
  ScoreWorker(ScoreRunner* runner, int64_t max_queue, ScorerMetrics* metrics);
  ~ScoreWorker();  // Shutdown()

  // RESOURCE_EXHAUSTED when max_queue jobs wait already; UNAVAILABLE once draining. The job's
  // on_done has not run when this fails (the caller reports the error).
  absl::Status Submit(std::shared_ptr<ScoreJob> job);
  // Takes a queued job out and completes it with `status`; false when it is not queued.
  bool Remove(const std::shared_ptr<ScoreJob>& job, const absl::Status& status);
  // Stops accepting jobs and waits up to `seconds` for queued and running ones; what is left then
  // is cancelled.
  void Drain(double seconds);
  void Shutdown();
  int64_t queue_depth() const;
  // Called with false when the queue is full (a new job would be refused) and with true when it
  // has room again: health then says NOT_SERVING while no job can be admitted. Set before jobs
  // are submitted; called under the worker's lock (it must not call back into the worker).
  void set_capacity_observer(std::function<void(bool has_room)> f) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_observer_ = std::move(f);
  }

 private:
  void Loop();
  void NotifyCapacityLocked();  // mu_ held

  ScoreRunner* runner_;
  int64_t max_queue_;
  ScorerMetrics* metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<ScoreJob>> queue_;
  std::shared_ptr<ScoreJob> running_;
  bool accepting_ = true;
  bool stop_ = false;
  std::function<void(bool)> capacity_observer_;
  bool had_room_ = true;
  std::thread thread_;
};

}  // namespace specwire
