#include "services/extractor/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace specwire {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int64_t LongestSequence(const Job& job) {
  int64_t t = 0;
  const auto& seqs = job.kind == Job::Kind::kExtract ? job.extract.sequences : job.generate.prompts;
  for (const auto& s : seqs) t = std::max<int64_t>(t, s.size());
  return t;
}

int64_t SequenceCount(const Job& job) {
  return job.kind == Job::Kind::kExtract ? job.extract.sequences.size() : job.generate.prompts.size();
}

}  // namespace

int64_t Job::padded_tokens() const { return SequenceCount(*this) * LongestSequence(*this); }

Scheduler::Scheduler(ExtractorBackend* backend, SchedulerOptions options)
    : backend_(backend), options_(options), worker_([this] { WorkerLoop(); }) {}

Scheduler::~Scheduler() { Shutdown(); }

absl::Status Scheduler::Submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) return absl::UnavailableError("extractor is shutting down");
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "extractor queue is full (", options_.max_queue, " requests waiting); retry later"));
    }
    job->enqueued = std::chrono::steady_clock::now();
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return absl::OkStatus();
}

void Scheduler::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  accepting_ = false;
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void Scheduler::Shutdown() {
  std::deque<std::shared_ptr<Job>> rejected;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stopping_ = true;
    rejected.swap(queue_);
  }
  cv_.notify_all();
  for (auto& job : rejected) Reject(job, absl::UnavailableError("extractor shut down"));
  if (worker_.joinable()) worker_.join();
}

bool Scheduler::Remove(const std::shared_ptr<Job>& job, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return false;
    queue_.erase(it);
  }
  idle_cv_.notify_all();
  Reject(job, status);
  return true;
}

int64_t Scheduler::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

void Scheduler::Reject(const std::shared_ptr<Job>& job, absl::Status status) {
  Job::Timing timing;
  timing.queue_seconds = Seconds(std::chrono::steady_clock::now() - job->enqueued);
  if (job->kind == Job::Kind::kExtract) {
    if (job->on_extract_done) job->on_extract_done(std::move(status), timing);
  } else if (job->on_generate_done) {
    job->on_generate_done(std::move(status), timing);
  }
}

void Scheduler::WorkerLoop() {
  while (true) {
    std::vector<std::shared_ptr<Job>> batch;
    // Jobs that will not run; completed after the lock is released (their callbacks take other
    // locks and talk to gRPC).
    std::vector<std::pair<std::shared_ptr<Job>, absl::Status>> dropped;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_ && queue_.empty()) return;
      // Take the first live job, then (for Extract) every following Extract job that keeps the
      // padded batch within the token budget, in arrival order.
      const auto now = std::chrono::steady_clock::now();
      int64_t longest = 0, sequences = 0;
      for (auto it = queue_.begin(); it != queue_.end();) {
        std::shared_ptr<Job> job = *it;
        if (job->cancelled.load()) {
          it = queue_.erase(it);
          dropped.emplace_back(job, absl::CancelledError("request cancelled while queued"));
          continue;
        }
        if (now > job->deadline) {
          it = queue_.erase(it);
          dropped.emplace_back(job, absl::DeadlineExceededError("deadline passed while queued"));
          continue;
        }
        if (batch.empty()) {
          batch.push_back(job);
          it = queue_.erase(it);
          if (job->kind == Job::Kind::kGenerate) break;
          longest = LongestSequence(*job);
          sequences = SequenceCount(*job);
          continue;
        }
        if (job->kind != Job::Kind::kExtract) {
          ++it;
          continue;
        }
        const int64_t l = std::max(longest, LongestSequence(*job));
        const int64_t s = sequences + SequenceCount(*job);
        if (l * s > options_.max_batch_tokens) break;
        longest = l;
        sequences = s;
        batch.push_back(job);
        it = queue_.erase(it);
      }
      busy_ = !batch.empty();
    }
    for (auto& [job, status] : dropped) Reject(job, status);
    if (batch.empty()) {
      idle_cv_.notify_all();
      continue;
    }
    if (batch.front()->kind == Job::Kind::kGenerate) {
      RunGenerate(batch.front());
    } else {
      RunExtractBatch(batch);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void Scheduler::RunExtractBatch(std::vector<std::shared_ptr<Job>>& batch) {
  std::vector<const ExtractWork*> works;
  int64_t longest = 0, sequences = 0;
  for (const auto& job : batch) {
    works.push_back(&job->extract);
    longest = std::max(longest, LongestSequence(*job));
    sequences += SequenceCount(*job);
  }
  const auto start = std::chrono::steady_clock::now();
  auto results = backend_->ExtractBatch(works);
  const auto end = std::chrono::steady_clock::now();
  if (batch_observer_) batch_observer_(static_cast<int>(batch.size()), longest * sequences);
  for (size_t i = 0; i < batch.size(); ++i) {
    Job::Timing timing;
    timing.queue_seconds = Seconds(start - batch[i]->enqueued);
    timing.compute_seconds = Seconds(end - start);
    timing.batch_requests = static_cast<int>(batch.size());
    if (!results.ok()) {
      batch[i]->on_extract_done(results.status(), timing);
    } else {
      batch[i]->on_extract_done(std::move((*results)[i]), timing);
    }
  }
}

void Scheduler::RunGenerate(const std::shared_ptr<Job>& job) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = job->deadline;
  auto stop = [job, deadline] {
    return job->cancelled.load() || std::chrono::steady_clock::now() > deadline;
  };
  auto result = backend_->Generate(job->generate, stop);
  const auto end = std::chrono::steady_clock::now();
  if (batch_observer_) batch_observer_(1, job->padded_tokens());
  Job::Timing timing;
  timing.queue_seconds = Seconds(start - job->enqueued);
  timing.compute_seconds = Seconds(end - start);
  if (result.ok() && job->cancelled.load()) result = absl::CancelledError("request cancelled");
  if (result.ok() && end > deadline) result = absl::DeadlineExceededError("deadline exceeded");
  job->on_generate_done(std::move(result), timing);
}

}  // namespace specwire
