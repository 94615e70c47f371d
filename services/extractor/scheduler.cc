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
  if (job->kind == Job::Kind::kGenerate) {
    // What each prompt's cache reserves while it runs; one that could never fit is refused now.
    const auto& g = job->generate;
    if (g.prompts.empty()) return absl::InvalidArgumentError("prompts: no prompt given");
    job->cache_bytes.clear();
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const int64_t tokens = static_cast<int64_t>(g.prompts[i].size()) + g.max_new_tokens;
      job->cache_bytes.push_back(backend_->SequenceBytes(tokens));
      if (job->cache_bytes.back() > options_.max_cache_bytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "max_new_tokens: prompts[", i, "] + ", g.max_new_tokens, " new tokens (", tokens,
            " positions) need ", job->cache_bytes.back(),
            " bytes of cache, more than the extractor's budget of ", options_.max_cache_bytes,
            " (--kv_cache_bytes)"));
      }
    }
  }
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
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_ && active_runs_ == 0; });
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

int64_t Scheduler::running_sequences() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_sequences_;
}

int64_t Scheduler::reserved_cache_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_bytes_;
}

void Scheduler::Reject(const std::shared_ptr<Job>& job, absl::Status status) {
  Job::Timing timing;
  timing.queue_seconds = Seconds(std::chrono::steady_clock::now() - job->enqueued);
  if (job->kind == Job::Kind::kSession) {
    if (job->session_call) job->session_call(std::move(status));
  } else if (job->kind == Job::Kind::kExtract) {
    if (job->on_extract_done) job->on_extract_done(std::move(status), timing);
  } else if (job->on_generate_done) {
    job->on_generate_done(std::move(status), timing);
  }
}

struct Scheduler::Run {
  std::shared_ptr<Job> job;
  // One per prompt: null before it starts and after it stops (its cache given back).
  std::vector<std::unique_ptr<GenerationSequence>> sequences;
  std::vector<CompletionOutput> completions;  // filled as each stops
  size_t started = 0;                          // sequences started so far, in prompt order
  std::chrono::steady_clock::time_point start;
  int rows = 1;  // the most sequences one decoding step it took part in shared
  bool done() const {
    if (started < sequences.size()) return false;
    for (const auto& s : sequences) {
      if (s) return false;
    }
    return true;
  }
};

bool Scheduler::Reserve(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_sequences_ + 1 > options_.max_running_sequences ||
      reserved_bytes_ + bytes > options_.max_cache_bytes) {
    return false;
  }
  running_sequences_ += 1;
  reserved_bytes_ += bytes;
  pending_starts_ -= 1;
  return true;
}

void Scheduler::Release(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_sequences_ -= 1;
    reserved_bytes_ -= bytes;
  }
  cv_.notify_all();  // Generate jobs waiting for room
}

void Scheduler::WorkerLoop() {
  while (true) {
    std::vector<std::shared_ptr<Job>> batch;     // Extract jobs to run together
    std::vector<std::shared_ptr<Job>> admitted;  // Generate jobs whose caches fit now
    std::vector<std::shared_ptr<Job>> calls;     // session calls
    // Jobs that will not run; completed after the lock is released (their callbacks take other
    // locks and talk to gRPC).
    std::vector<std::pair<std::shared_ptr<Job>, absl::Status>> dropped;
    bool stop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty() || active_runs_ > 0; });
      stop = stopping_;
      if (stop && queue_.empty() && active_runs_ == 0) return;
      // Extract jobs: the first live one, then every following one that keeps the padded batch
      // within the token budget, in arrival order. Generate jobs: admitted in arrival order
      // while their reservations fit (none overtakes an earlier one that waits).
      const auto now = std::chrono::steady_clock::now();
      int64_t longest = 0, sequences = 0;
      bool generate_waits = false;
      for (auto it = queue_.begin(); !stop && it != queue_.end();) {
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
        if (job->kind == Job::Kind::kSession) {
          calls.push_back(job);
          it = queue_.erase(it);
          continue;
        }
        if (job->kind == Job::Kind::kGenerate) {
          // Admitted when its first sequence fits (the rest start as room frees up), and only
          // while no earlier run still has sequences waiting for room.
          const int64_t first = job->cache_bytes.empty() ? 0 : job->cache_bytes.front();
          if (!generate_waits && pending_starts_ == 0 &&
              running_sequences_ + 1 <= options_.max_running_sequences &&
              reserved_bytes_ + first <= options_.max_cache_bytes) {
            running_sequences_ += 1;
            reserved_bytes_ += first;
            ++active_runs_;
            pending_starts_ += SequenceCount(*job) - 1;
            admitted.push_back(job);
            it = queue_.erase(it);
          } else {
            generate_waits = true;
            ++it;
          }
          continue;
        }
        const int64_t l = std::max(longest, LongestSequence(*job));
        const int64_t s = sequences + SequenceCount(*job);
        if (!batch.empty() && l * s > options_.max_batch_tokens) {
          ++it;
          continue;
        }
        longest = l;
        sequences = s;
        batch.push_back(job);
        it = queue_.erase(it);
      }
      busy_ = !batch.empty() || !calls.empty() || active_runs_ > 0;
    }
    for (auto& [job, status] : dropped) Reject(job, status);
    if (stop) {
      // Shutdown: the generations in progress end now.
      for (auto& run : runs_) FinishRun(*run, absl::UnavailableError("extractor shut down"));
      runs_.clear();
      continue;
    }
    for (auto& call : calls) call->session_call(absl::OkStatus());
    if (!batch.empty()) RunExtractBatch(batch);
    AdvanceGeneration(admitted);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

void Scheduler::StartRun(const std::shared_ptr<Job>& job) {
  auto run = std::make_unique<Run>();
  run->job = job;
  run->start = std::chrono::steady_clock::now();
  const size_t n = job->generate.prompts.size();
  run->sequences.resize(n);
  run->completions.resize(n);
  Run& r = *run;
  runs_.push_back(std::move(run));
  // The first sequence's room was reserved on admission.
  auto seq = backend_->StartSequence(job->generate.prompts[0], job->generate);
  r.started = 1;
  if (!seq.ok()) {
    Release(job->cache_bytes[0]);
    FinishRun(r, seq.status());
    return;
  }
  r.sequences[0] = std::move(*seq);
  StartSequences(r);
}

void Scheduler::StartSequences(Run& run) {
  const GenerateWork& w = run.job->generate;
  while (run.job != nullptr && run.started < run.sequences.size() &&
         Reserve(run.job->cache_bytes[run.started])) {
    const size_t i = run.started++;
    auto seq = backend_->StartSequence(w.prompts[i], w);
    if (!seq.ok()) {
      Release(run.job->cache_bytes[i]);
      FinishRun(run, seq.status());
      return;
    }
    run.sequences[i] = std::move(*seq);
  }
}

void Scheduler::AdvanceGeneration(std::vector<std::shared_ptr<Job>>& admitted) {
  // Earlier runs' waiting sequences first (arrival order), then the newly admitted.
  for (auto& run : runs_) {
    if (run->job != nullptr) StartSequences(*run);
  }
  for (const auto& job : admitted) StartRun(job);
  if (runs_.empty()) return;
  std::vector<Run*> failed;
  // One prefill chunk: the oldest sequence with prompt tokens left.
  for (auto& run : runs_) {
    GenerationSequence* pending = nullptr;
    for (auto& s : run->sequences) {
      if (s && s->pending_prompt_tokens() > 0 && !s->finished()) {
        pending = s.get();
        break;
      }
    }
    if (pending == nullptr) continue;
    absl::Status st = backend_->PrefillChunk(*pending);
    if (!st.ok()) FinishRun(*run, st);
    break;
  }
  // One decoding step of every sequence that is decoding.
  std::vector<GenerationSequence*> rows;
  std::vector<Run*> owners;
  for (auto& run : runs_) {
    if (run->job == nullptr) continue;
    for (auto& s : run->sequences) {
      if (s && s->decoding()) {
        rows.push_back(s.get());
        owners.push_back(run.get());
      }
    }
  }
  if (!rows.empty()) {
    absl::Status st = backend_->DecodeStep(rows);
    if (decode_observer_) decode_observer_(static_cast<int>(rows.size()));
    for (Run* run : owners) {
      run->rows = std::max(run->rows, static_cast<int>(rows.size()));
      if (!st.ok() && run->job != nullptr) FinishRun(*run, st);
    }
  }
  // Sequences that stopped give back their caches; requests whose last sequence stopped, that
  // were cancelled or ran past their deadline, complete.
  const auto now = std::chrono::steady_clock::now();
  for (auto& run : runs_) {
    if (run->job == nullptr) continue;
    for (size_t i = 0; i < run->sequences.size(); ++i) {
      auto& s = run->sequences[i];
      if (s && s->finished()) {
        run->completions[i] = s->completion();
        s.reset();
        Release(run->job->cache_bytes[i]);
      }
    }
    if (run->job->cancelled.load()) {
      FinishRun(*run, absl::CancelledError("request cancelled"));
    } else if (now > run->job->deadline) {
      FinishRun(*run, absl::DeadlineExceededError("deadline exceeded"));
    } else if (run->done()) {
      FinishRun(*run, absl::OkStatus());
    }
  }
  std::erase_if(runs_, [](const std::unique_ptr<Run>& r) { return r->job == nullptr; });
}

void Scheduler::FinishRun(Run& run, absl::Status status) {
  if (run.job == nullptr) return;  // already finished
  std::shared_ptr<Job> job = std::move(run.job);
  run.job = nullptr;
  absl::StatusOr<GenerateOutput> result = GenerateOutput();
  if (!status.ok()) {
    result = status;
  } else {
    GenerateOutput out;
    out.completions = std::move(run.completions);
    const GenerateWork& w = job->generate;
    if (!w.selection.empty()) {
      // Features of prompt + completion in one forward pass over each full sequence — the same
      // values a training pipeline gets from Extract on those tokens.
      ExtractWork ew;
      for (size_t i = 0; i < w.prompts.size(); ++i) {
        std::vector<int64_t> seq = w.prompts[i];
        seq.insert(seq.end(), out.completions[i].tokens.begin(), out.completions[i].tokens.end());
        ew.sequences.push_back(std::move(seq));
      }
      ew.selection = w.selection;
      ew.wire_dtype = w.wire_dtype;
      auto states = backend_->ExtractBatch({&ew});
      if (states.ok()) {
        out.states = std::move((*states)[0].states);
        result = std::move(out);
      } else {
        result = states.status();
      }
    } else {
      result = std::move(out);
    }
  }
  // The caches still held go before their reservations are returned; sequences never started
  // no longer wait for room.
  int64_t held = 0, running = 0;
  for (size_t i = 0; i < run.sequences.size(); ++i) {
    if (run.sequences[i]) {
      run.sequences[i].reset();
      held += job->cache_bytes[i];
      ++running;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_sequences_ -= running;
    reserved_bytes_ -= held;
    pending_starts_ -= static_cast<int64_t>(run.sequences.size() - run.started);
    --active_runs_;
  }
  cv_.notify_all();  // Generate jobs waiting for room
  idle_cv_.notify_all();
  if (batch_observer_) batch_observer_(1, job->padded_tokens());
  const auto end = std::chrono::steady_clock::now();
  Job::Timing timing;
  timing.queue_seconds = Seconds(run.start - job->enqueued);
  timing.compute_seconds = Seconds(end - run.start);
  timing.batch_requests = run.rows;
  job->on_generate_done(std::move(result), timing);
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

}  // namespace specwire
