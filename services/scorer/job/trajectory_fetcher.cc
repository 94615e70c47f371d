#include "services/scorer/job/trajectory_fetcher.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace specwire {

StateSelection DrafterStates(const std::vector<int64_t>& ids, int64_t num_layers,
                              bool last_layer_is_final_norm) {
  StateSelection s;
  for (int64_t id : ids) {
    if (id == num_layers - 1 && last_layer_is_final_norm) {
      s.final_norm = true;
    } else if (std::find(s.layer_ids.begin(), s.layer_ids.end(), id) == s.layer_ids.end()) {
      s.layer_ids.push_back(static_cast<int32_t>(id));
    }
  }
  return s;
}

absl::StatusOr<std::vector<FeatureState>> DrafterFeatureStates(
    std::vector<ReceivedState>& received, const std::vector<int64_t>& ids, int64_t num_layers,
    bool last_layer_is_final_norm, int64_t rows, const std::string& what) {
  std::map<std::string, ReceivedState*> by_name;
  for (ReceivedState& s : received) by_name[s.state] = &s;
  std::set<std::string> moved;
  std::vector<FeatureState> out;
  for (int64_t id : ids) {
    const std::string name = id == num_layers - 1 && last_layer_is_final_norm
                                 ? "final_norm"
                                 : absl::StrCat("layer.", id);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::DataLossError(
          absl::StrCat(what, " lacks the state ", name, " (for target layer ", id, ")"));
    }
    ReceivedState& s = *it->second;
    FeatureState f;
    f.layer_id = id;
    f.dtype = s.dtype;
    f.rows = s.rows;
    f.hidden = s.hidden;
    if (moved.insert(name).second) {
      f.bytes = std::move(s.bytes);
    } else {
      for (const FeatureState& prev : out) {
        if (prev.layer_id == id) f.bytes = prev.bytes;
      }
    }
    if (f.rows != rows) {
      return absl::DataLossError(
          absl::StrCat("state ", name, " has ", f.rows, " rows for ", rows, " tokens"));
    }
    out.push_back(std::move(f));
  }
  return out;
}

absl::StatusOr<Trajectory> TrajectoryFromReply(GenerateReply& reply,
                                               const std::vector<int64_t>& ids, int64_t num_layers,
                                               int64_t max_new_tokens, bool final_norm,
                                               bool last_layer_is_final_norm) {
  if (reply.completions.size() != 1) {
    return absl::InternalError(
        absl::StrCat("expected one completion, got ", reply.completions.size()));
  }
  const ReceivedCompletion& c = reply.completions[0];
  Trajectory t;
  t.tokens = c.prompt_token_ids;
  t.tokens.insert(t.tokens.end(), c.completion_token_ids.begin(), c.completion_token_ids.end());
  t.prompt_len = static_cast<int64_t>(c.prompt_token_ids.size());
  t.max_length = t.prompt_len + max_new_tokens;
  SW_ASSIGN_OR_RETURN(t.states,
                      DrafterFeatureStates(reply.states, ids, num_layers,
                                           last_layer_is_final_norm,
                                           static_cast<int64_t>(t.tokens.size()),
                                           "Generate reply"));
  std::map<std::string, ReceivedState*> by_name;
  for (ReceivedState& s : reply.states) by_name[s.state] = &s;
  std::set<std::string> moved;
  for (int64_t id : ids) {
    if (id == num_layers - 1 && last_layer_is_final_norm) moved.insert("final_norm");
  }
  if (final_norm) {
    auto it = by_name.find("final_norm");
    if (it == by_name.end()) {
      return absl::DataLossError("Generate reply lacks the state final_norm (for the target's "
                                 "distributions)");
    }
    ReceivedState& s = *it->second;
    FeatureState f;
    f.layer_id = num_layers;  // HF hidden_states[num_layers]
    f.dtype = s.dtype;
    f.rows = s.rows;
    f.hidden = s.hidden;
    if (moved.count("final_norm")) {
      for (const FeatureState& prev : t.states) {
        if (prev.layer_id == num_layers - 1) f.bytes = prev.bytes;
      }
    } else {
      f.bytes = std::move(s.bytes);
    }
    if (f.rows != static_cast<int64_t>(t.tokens.size())) {
      return absl::DataLossError(absl::StrCat("state final_norm has ", f.rows, " rows for ",
                                              t.tokens.size(), " tokens"));
    }
    t.final_norm = std::move(f);
  }
  return t;
}
namespace {

// A lock, its condition variable and a stop flag; Stop() wakes every waiter.
class Stoppable {
 public:
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

 protected:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
};

}  // namespace

// Trajectories fetched by the extractor threads, handed to the replay thread. A fetcher takes a
// slot before it calls Generate and the replay returns it after taking the trajectory, so at most
// `slots` trajectories (fetched or in flight) exist at once.
class TrajectoryFetcher::Queue : public Stoppable {
 public:
  using Item = FetchedTrajectory;

  explicit Queue(int64_t slots) : free_slots_(slots) {}

  // False when the job stopped.
  bool AcquireSlot() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_ || free_slots_ > 0; });
    if (stopped_) return false;
    --free_slots_;
    return true;
  }
  // Gives a slot back without an item (a fetch that will be tried again).
  void ReleaseSlot() {
    std::lock_guard<std::mutex> lock(mu_);
    ++free_slots_;
    cv_.notify_all();
  }
  void Push(Item item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(item));
    cv_.notify_all();
  }
  // Waits up to `wait` for an item; nullopt on timeout.
  std::optional<Item> Pop(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !items_.empty(); })) return std::nullopt;
    Item item = std::move(items_.front());
    items_.pop_front();
    ++free_slots_;
    cv_.notify_all();
    return item;
  }

 private:
  std::deque<Item> items_;
  int64_t free_slots_;
};

// The prompts a job still has to fetch: fresh ones in index order, and those whose fetch failed
// with a retryable error (taken first, by whichever extractor asks next, so a second replica
// picks up the prompts of one that went away). The retry budget is per prompt and extractor: an
// extractor that used up its attempts at a prompt leaves it to the others, and the prompt fails
// only once every extractor of the job did. A fetcher waits for work while another one's prompt
// is in flight: that prompt may still come back for a retry.
class TrajectoryFetcher::Tasks : public Stoppable {
 public:
  struct Task {
    int64_t index = 0;
    std::map<const ExtractorEndpoint*, int> attempts;  // made so far, per extractor
    int total_attempts() const {
      int n = 0;
      for (const auto& [e, k] : attempts) n += k;
      return n;
    }
  };

  Tasks(std::vector<int64_t> todo, int max_attempts)
      : todo_(std::move(todo)), max_attempts_(max_attempts) {}

  // The next prompt for extractor `e`; nullopt when nothing is left (or the job stopped).
  std::optional<Task> Take(const ExtractorEndpoint* e) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<Task> t;
    cv_.wait(lock, [&] {
      if (stopped_) return true;
      for (auto it = retry_.begin(); it != retry_.end(); ++it) {
        if (Left(*it, e) > 0) {
          t = std::move(*it);
          retry_.erase(it);
          return true;
        }
      }
      if (next_ < todo_.size()) {
        t.emplace();
        t->index = todo_[next_++];
        return true;
      }
      return retry_.empty() && in_flight_ == 0;
    });
    if (stopped_ || !t) return std::nullopt;
    ++in_flight_;
    return t;
  }
  // Attempts extractor `e` has left at the task.
  int Left(const Task& t, const ExtractorEndpoint* e) const {
    auto it = t.attempts.find(e);
    return max_attempts_ - (it == t.attempts.end() ? 0 : it->second);
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    cv_.notify_all();
  }
  void Retry(Task t) {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    retry_.push_back(std::move(t));
    cv_.notify_all();
  }
  // Sleeps up to `seconds`; true when the job stopped meanwhile.
  bool WaitStopped(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stopped_; });
  }

 private:
  const std::vector<int64_t> todo_;
  const int max_attempts_;
  size_t next_ = 0;
  std::deque<Task> retry_;
  int64_t in_flight_ = 0;
};

TrajectoryFetcher::TrajectoryFetcher(std::vector<ExtractorEndpoint*> endpoints,
                                     TrajectoryRequest request, TrajectoryOptions options,
                                     const std::atomic<bool>& cancelled,
                                     std::function<void(const std::string&)> log)
    : endpoints_(std::move(endpoints)),
      request_(std::move(request)),
      options_(std::move(options)),
      cancelled_(cancelled),
      log_(std::move(log)),
      states_([&] {
        StateSelection s = DrafterStates(request_.target_layer_ids, request_.num_layers,
                                          request_.last_layer_is_final_norm);
        if (request_.final_norm) s.final_norm = true;
        return s;
      }()) {
  const int64_t per_extractor = std::max<int64_t>(options_.generates_per_extractor, 1);
  const int64_t extractors = static_cast<int64_t>(endpoints_.size());
  queue_ = std::make_unique<Queue>(
      extractors * (per_extractor + std::max<int64_t>(options_.prefetch_per_extractor, 0)));
  tasks_ = std::make_unique<Tasks>(request_.todo, std::max(options_.retry.max_attempts, 1));
  try {
    // Interleaved, so that the first prompts go to every extractor, not all to the first.
    for (int64_t k = 0; k < per_extractor; ++k) {
      for (ExtractorEndpoint* e : endpoints_) threads_.emplace_back([this, e] { FetchLoop(e); });
    }
  } catch (...) {
    Stop();  // the threads already started must be joined before they are destroyed
    throw;
  }
}

TrajectoryFetcher::~TrajectoryFetcher() { Stop(); }

std::optional<FetchedTrajectory> TrajectoryFetcher::Next(std::chrono::milliseconds wait) {
  return queue_->Pop(wait);
}

void TrajectoryFetcher::Stop() {
  queue_->Stop();
  tasks_->Stop();
  in_flight_.Cancel();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void TrajectoryFetcher::FetchLoop(ExtractorEndpoint* e) {
  const ExtractorRetryPolicy& retry = options_.retry;
  int failures_in_row = 0;  // this extractor's, for its backoff
  while (!cancelled_) {
    if (!queue_->AcquireSlot()) return;
    std::optional<Tasks::Task> task = tasks_->Take(e);
    if (!task) return;
    const int64_t i = task->index;
    GenerateParams p;
    p.prompts = {InputSequence::Tokens((*request_.prompts)[i])};
    p.max_new_tokens = static_cast<uint32_t>(request_.max_new_tokens);
    p.states = states_;
    p.dtype = options_.wire_dtype;
    p.request_id = absl::StrCat(request_.request_id_prefix, i);
    p.cancel = &in_flight_;
    FetchedTrajectory item;
    item.index = i;
    auto reply = e->Generate(p);
    ++task->attempts[e];
    // Retried while some extractor of the job has attempts left at this prompt.
    bool others_left = false;
    for (ExtractorEndpoint* other : endpoints_) others_left |= tasks_->Left(*task, other) > 0;
    if (!reply.ok() && IsRetryableExtractorError(reply.status()) && !cancelled_ && others_left) {
      ++failures_in_row;
      if (log_) {
        log_(absl::StrCat("prompt ", i, ": Generate on ", e->address(), " failed (attempt ",
                          task->attempts[e], " of ", retry.max_attempts,
                          " there), retrying: ", reply.status().ToString()));
      }
      queue_->ReleaseSlot();
      tasks_->Retry(std::move(*task));
      if (tasks_->WaitStopped(retry.Backoff(failures_in_row))) return;
      continue;
    }
    tasks_->Done();
    if (!reply.ok()) {
      std::string where = absl::StrCat("prompt ", i, " (Generate on ", e->address());
      if (IsRetryableExtractorError(reply.status()) && task->total_attempts() > 1) {
        absl::StrAppend(&where, ", failed ", task->total_attempts(), " times, the retry budget");
      }
      item.trajectory = Annotate(reply.status(), absl::StrCat(where, ")"));
    } else {
      failures_in_row = 0;
      item.finish_reason = reply->completions.empty() ? "" : reply->completions[0].finish_reason;
      item.trajectory = TrajectoryFromReply(*reply, request_.target_layer_ids, request_.num_layers,
                                            request_.max_new_tokens, request_.final_norm,
                                            request_.last_layer_is_final_norm);
      if (!item.trajectory.ok()) {
        item.trajectory =
            Annotate(item.trajectory.status(), absl::StrCat("prompt ", i, " (", e->address(), ")"));
      }
    }
    queue_->Push(std::move(item));
  }
}

}  // namespace specwire
