// The extractor's work queue: requests wait in a bounded queue; one worker thread owns the engine
// and runs queued Extract requests together as one batch, up to a token budget (dynamic
// batching). Generate requests run one at a time. Reactions (gRPC threads) only ever enqueue.
// The scorer's ScoreWorker (services/scorer/score_worker.h) says why the two are not one queue.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/extractor/work.h"

namespace specwire {

struct SchedulerOptions {
  // Padded tokens (sequences × longest sequence) per forward pass. Requests are never split; a
  // single request over the budget runs alone.
  int64_t max_batch_tokens = 16384;
  // Requests waiting at most; one more gets RESOURCE_EXHAUSTED.
  int64_t max_queue = 64;
};

// One request's work. Exactly one completion callback runs, once, on the worker thread (or on the
// submitting thread when Submit fails).
struct Job {
  enum class Kind { kExtract, kGenerate };
  Kind kind = Kind::kExtract;
  ExtractWork extract;
  GenerateWork generate;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point enqueued;
  // Set by the rpc layer when the client cancels; the worker skips or stops the job.
  std::atomic<bool> cancelled{false};

  struct Timing {
    double queue_seconds = 0;
    double compute_seconds = 0;
    int batch_requests = 1;  // requests in the batch this job ran in
  };
  std::function<void(absl::StatusOr<ExtractOutput>, const Timing&)> on_extract_done;
  std::function<void(absl::StatusOr<GenerateOutput>, const Timing&)> on_generate_done;

  int64_t padded_tokens() const;
};

class Scheduler {
 public:
  // `backend` must outlive the scheduler.
  Scheduler(ExtractorBackend* backend, SchedulerOptions options);
  ~Scheduler();  // Shutdown() and join

  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE after Shutdown().
  absl::Status Submit(std::shared_ptr<Job> job);
  // Stops accepting work; queued jobs still run (graceful drain). Returns when the queue is empty
  // and the worker idle.
  void Drain();
  void Shutdown();

  // Takes a job out of the queue (a cancelled or expired call) and completes it with `status`, so
  // it stops holding a queue slot at once. False when it is not queued (running or done).
  bool Remove(const std::shared_ptr<Job>& job, const absl::Status& status);

  int64_t queue_depth() const;
  // Called after every batch on the worker thread: requests and padded tokens in it.
  void set_batch_observer(std::function<void(int requests, int64_t tokens)> f) {
    batch_observer_ = std::move(f);
  }

 private:
  void WorkerLoop();
  void RunExtractBatch(std::vector<std::shared_ptr<Job>>& batch);
  void RunGenerate(const std::shared_ptr<Job>& job);
  // Completes a job that will not run (cancelled, deadline, shutdown).
  static void Reject(const std::shared_ptr<Job>& job, absl::Status status);

  ExtractorBackend* backend_;
  SchedulerOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool accepting_ = true;
  bool stopping_ = false;
  bool busy_ = false;
  std::function<void(int, int64_t)> batch_observer_;
  std::thread worker_;  // last: starts after everything above is initialised
};

}  // namespace specwire
