// The extractor's work queue and its one worker thread, which owns the engine.
//
// Extract requests wait in a bounded queue and run together as one batch, up to a token budget
// (dynamic batching). Generate requests are batched at the iteration level (continuous
// batching): a request's sequences start when their caches fit the budget (each reserves
// prompt + max_new_tokens positions while it runs; requests are served in arrival order, a
// request with more prompts than fit at once runs them in waves, and a prompt that could never
// fit is refused at once), their prompts are prefilled one chunk (kPrefillChunkTokens) at a
// time, and every sequence that is decoding takes one token per decoding step, shared with all
// the others; a sequence leaves (and gives its cache back) when it stops, a request completes
// when its last sequence does. Each round of the worker runs at most one Extract batch, one
// prefill chunk and one decoding step, so a short Extract never waits behind a long generation
// for more than a round. Decoding rows do not change each other's numbers (DecoderModel::DecodeStep), so a
// sequence's tokens are those it would get alone. Reactions (gRPC threads) only ever enqueue.
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
#include <vector>

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
  // Generation: sequences running at once (decoding or prefilling), and the bytes their caches
  // may hold in all (--max_running_sequences, --kv_cache_bytes).
  int64_t max_running_sequences = 64;
  int64_t max_cache_bytes = int64_t{4} << 30;
};

// One request's work. Exactly one completion callback runs, once, on the worker thread (or on the
// submitting thread when Submit fails).
struct Job {
  // kSession: one call of a live verification session (open, verify, commit), run between the
  // rounds' other work, in arrival order.
  enum class Kind { kExtract, kGenerate, kSession };
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
    int batch_requests = 1;  // requests in the batch this job ran in (Generate: the most
                             // sequences one of its decoding steps shared)
  };
  // Generate: the bytes each prompt's cache reserves while it runs (set by Submit).
  std::vector<int64_t> cache_bytes;
  std::function<void(absl::StatusOr<ExtractOutput>, const Timing&)> on_extract_done;
  std::function<void(absl::StatusOr<GenerateOutput>, const Timing&)> on_generate_done;
  // kSession: runs on the worker with OK, or wherever the job is dropped with why it did not run.
  std::function<void(absl::Status)> session_call;

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
  // Generation sequences admitted now, and the cache bytes they reserve.
  int64_t running_sequences() const;
  int64_t reserved_cache_bytes() const;
  // Called on the worker thread after every Extract batch (requests and padded tokens in it) and
  // when a Generate request completes (1, its prompts' padded tokens).
  void set_batch_observer(std::function<void(int requests, int64_t tokens)> f) {
    batch_observer_ = std::move(f);
  }
  // Called on the worker thread after every decoding step: the sequences it served.
  void set_decode_observer(std::function<void(int sequences)> f) { decode_observer_ = std::move(f); }

 private:
  struct Run;  // an admitted Generate request (worker thread only)

  void WorkerLoop();
  void RunExtractBatch(std::vector<std::shared_ptr<Job>>& batch);
  // One round of generation: start the admitted, one prefill chunk, one decoding step, then
  // complete what finished, was cancelled or ran past its deadline.
  void AdvanceGeneration(std::vector<std::shared_ptr<Job>>& admitted);
  void StartRun(const std::shared_ptr<Job>& job);
  // Starts the run's next sequences while they fit (the first is reserved on admission).
  void StartSequences(Run& run);
  // Reserves room for one sequence of `bytes` if it fits now.
  bool Reserve(int64_t bytes);
  void Release(int64_t bytes);
  void FinishRun(Run& run, absl::Status status);
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
  // Admitted generation (under mu_): runs not yet finished, their running sequences and the
  // cache bytes those reserve.
  int64_t active_runs_ = 0;
  int64_t running_sequences_ = 0;
  int64_t reserved_bytes_ = 0;
  int64_t pending_starts_ = 0;  // sequences of admitted runs still waiting for room
  std::vector<std::unique_ptr<Run>> runs_;  // worker thread only
  std::function<void(int, int64_t)> batch_observer_;
  std::function<void(int)> decode_observer_;
  std::thread worker_;  // last: starts after everything above is initialised
};

}  // namespace specwire
