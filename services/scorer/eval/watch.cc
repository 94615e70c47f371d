#include "services/scorer/eval/watch.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/checkpoint.h"
#include "common/digest.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// A row's provenance: the job's, with the checkpoint digest the row was scored under.
std::string WithDrafterDigest(const std::string& provenance, const std::string& digest) {
  json p = json::parse(provenance.empty() ? "{}" : provenance, nullptr, false);
  if (!p.is_object()) p = json::object();
  p["drafter_digest"] = digest;
  return p.dump();
}

absl::StatusOr<std::vector<EvalSet>> ParseEvalSets(absl::string_view flag) {
  std::vector<EvalSet> sets;
  std::set<std::string> labels;
  for (absl::string_view entry : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    EvalSet set;
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos) {
      set.path = std::string(entry);
      set.label = fs::path(set.path).stem().string();
    } else {
      set.label = std::string(absl::StripAsciiWhitespace(entry.substr(0, eq)));
      set.path = std::string(absl::StripAsciiWhitespace(entry.substr(eq + 1)));
    }
    if (set.label.empty() || set.path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval set \"", std::string(entry), "\": expected label=path or a path"));
    }
    if (!labels.insert(set.label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("eval set label \"", set.label, "\" given twice"));
    }
    sets.push_back(std::move(set));
  }
  return sets;
}

std::optional<int64_t> StepFromName(absl::string_view name) {
  for (absl::string_view prefix :
       {"checkpoint-", "checkpoint_", "global_step", "step-", "step_", "step", ""}) {
    if (!absl::StartsWith(name, prefix)) continue;
    const absl::string_view digits = name.substr(prefix.size());
    if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
      continue;
    }
    int64_t step;
    if (absl::SimpleAtoi(digits, &step)) return step;
  }
  return std::nullopt;
}

absl::StatusOr<int64_t> CheckpointStep(const std::string& dir) {
  const fs::path p(dir);
  if (auto step = StepFromName(p.filename().string())) return *step;
  const fs::path state = p / "trainer_state.json";
  auto text = ReadFileToString(state.string());
  if (text.ok()) {
    json j = json::parse(*text, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("global_step") &&
        j["global_step"].is_number_integer()) {
      return j["global_step"].get<int64_t>();
    }
    return absl::InvalidArgumentError(absl::StrCat(state.string(), ": no integer global_step"));
  }
  return absl::NotFoundError(absl::StrCat(
      dir,
      ": no training step (name it checkpoint-N, step_N or N, or write trainer_state.json "
      "with global_step)"));
}

absl::StatusOr<std::string> DirectoryFingerprint(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> entries;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code fec;
    if (!e.is_regular_file(fec)) continue;
    const auto size = e.file_size(fec);
    const auto mtime = e.last_write_time(fec).time_since_epoch().count();
    if (fec) continue;  // vanished between listing and stat: the next scan sees it change
    entries.push_back(absl::StrCat(e.path().filename().string(), ":", size, ":", mtime));
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": ", ec.message()));
  std::sort(entries.begin(), entries.end());
  return absl::StrJoin(entries, ";");
}

namespace {

std::vector<fs::path> SafetensorsFiles(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code fec;
    if (e.is_regular_file(fec) && e.path().extension() == ".safetensors") {
      files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::Status DigestFileInto(const fs::path& path, ContentDigest& d) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    if (n > 0) d.Update(std::string_view(buf.data(), static_cast<size_t>(n)));
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat(path.string(), ": read error"));
  return absl::OkStatus();
}

// The recorded result of checkpoint `c` on `label` that stands (scored, or failed on these very
// files: a retry would fail again), marked from_database; nullopt when it must be scored.
absl::StatusOr<std::optional<CheckpointResult>> Settled(ResultsDb& db, const CheckpointRef& c,
                                                        const std::string& label) {
  SW_ASSIGN_OR_RETURN(std::optional<CheckpointResult> row, db.Find(c.run, c.step, label));
  if (!row || (row->status != "ok" && row->fingerprint != c.fingerprint)) return std::nullopt;
  row->from_database = true;
  return row;
}

// A result row of checkpoint `c` on `label`, to be filled.
CheckpointResult ResultOf(const CheckpointRef& c, const std::string& label) {
  CheckpointResult r;
  r.run = c.run;
  r.step = c.step;
  r.dataset = label;
  r.source = c.source;
  r.checkpoint_path = c.dir;
  r.fingerprint = c.fingerprint;
  return r;
}

}  // namespace

absl::Status CheckCheckpointComplete(const std::string& dir) {
  const fs::path config = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::exists(config, ec)) {
    return absl::NotFoundError(absl::StrCat(config.string(), ": missing (incomplete checkpoint)"));
  }
  SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config.string()));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.string(), ": not a JSON object (truncated or corrupt)"));
  }
  const std::vector<fs::path> files = SafetensorsFiles(dir);
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no *.safetensors file (incomplete checkpoint)"));
  }
  for (const fs::path& f : files) {
    auto opened = SafetensorsFile::Open(f.string());
    if (!opened.ok()) return opened.status();
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileDigest(const std::string& path) {
  ContentDigest d;
  SW_RETURN_IF_ERROR(DigestFileInto(path, d));
  return d.Hex();
}

absl::StatusOr<std::string> CheckpointDigest(const std::string& dir) {
  std::vector<fs::path> files = SafetensorsFiles(dir);
  files.insert(files.begin(), fs::path(dir) / "config.json");
  ContentDigest d;
  for (const fs::path& f : files) {
    d.UpdateField(f.filename().string());
    SW_RETURN_IF_ERROR(DigestFileInto(f, d));
  }
  return d.Hex();
}

bool IsCheckpointError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kInternal:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// ContinuousEvaluator

ContinuousEvaluator::ContinuousEvaluator(ResultsDb* db, ScoreFn score, EvaluatorOptions options,
                                         TrainingMetrics* metrics)
    : db_(db), score_(std::move(score)), options_(std::move(options)), metrics_(metrics) {}

void ContinuousEvaluator::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

absl::Status ContinuousEvaluator::ExportRecorded() {
  SW_ASSIGN_OR_RETURN(std::vector<CheckpointResult> rows, db_->All());
  if (metrics_ != nullptr) {
    for (const CheckpointResult& r : rows) metrics_->Record(r, /*fresh=*/false);
  }
  Log(absl::StrCat("results database ", db_->path(), ": ", rows.size(), " recorded results"));
  return absl::OkStatus();
}

absl::Status ContinuousEvaluator::Store(const CheckpointResult& r) {
  SW_RETURN_IF_ERROR(db_->Record(r));
  if (metrics_ != nullptr) metrics_->Record(r, /*fresh=*/true);
  return absl::OkStatus();
}

absl::StatusOr<bool> ContinuousEvaluator::AllRecorded(const CheckpointRef& c) {
  for (const EvalSet& set : options_.eval_sets) {
    SW_ASSIGN_OR_RETURN(std::optional<CheckpointResult> row, Settled(*db_, c, set.label));
    if (!row) return false;
  }
  return true;
}

absl::StatusOr<std::vector<CheckpointResult>> ContinuousEvaluator::Evaluate(
    const CheckpointRef& c) {
  std::vector<CheckpointResult> out;
  std::string digest;
  for (const EvalSet& set : options_.eval_sets) {
    SW_ASSIGN_OR_RETURN(std::optional<CheckpointResult> row, Settled(*db_, c, set.label));
    if (row) {
      out.push_back(*std::move(row));
      continue;
    }
    if (digest.empty()) {
      auto d = CheckpointDigest(c.dir);
      digest = d.ok() ? *d : "";
    }
    ScoreSpec spec;
    spec.drafter_path = c.dir;
    spec.dataset_path = set.path;
    spec.max_prompts = options_.max_prompts;
    spec.max_new_tokens = options_.max_new_tokens;
    spec.ddtree_budgets = options_.ddtree_budgets;
    spec.labels = {c.run, set.label, ""};  // method: the drafter's family
    CheckpointResult r = ResultOf(c, set.label);
    r.checkpoint_digest = digest;
    r.started_at = UtcNow();
    Log(absl::StrCat("scoring run ", c.run, " step ", c.step, " (", c.dir, ") on eval set ",
                     set.label));
    absl::StatusOr<EvalScore> summary = score_(spec);
    r.finished_at = UtcNow();
    if (summary.ok()) {
      r.status = "ok";
      r.summary = std::move(summary->summary);
      r.target_canary = std::move(summary->target_canary);
      r.provenance = WithDrafterDigest(summary->provenance, digest);
      for (const PromptScore& p : summary->prompts) {
        r.prompts.push_back({p.prompt_index, p.trajectory_digest, p.acceptance.step_lengths,
                             p.acceptance.prompt_tokens, p.trajectory});
      }
      std::sort(r.prompts.begin(), r.prompts.end(),
                [](const PromptSteps& a, const PromptSteps& b) {
                  return a.prompt_index < b.prompt_index;
                });
      Log(absl::StrCat("run ", c.run, " step ", c.step, " eval set ", set.label, ": tau ",
                       r.summary.tau_mean_of_means, " (pooled ", r.summary.tau_pooled, ")"));
    } else if (IsCheckpointError(summary.status())) {
      r.status = "failed";
      r.error = summary.status().ToString();
      Log(absl::StrCat("run ", c.run, " step ", c.step, " eval set ", set.label,
                       ": FAILED: ", r.error));
    } else {
      // Not the checkpoint's fault: nothing recorded, scored again later.
      return summary.status();
    }
    SW_RETURN_IF_ERROR(Store(r));
    out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<std::vector<CheckpointResult>> ContinuousEvaluator::RecordFailure(
    const CheckpointRef& c, const absl::Status& error) {
  std::vector<CheckpointResult> out;
  for (const EvalSet& set : options_.eval_sets) {
    SW_ASSIGN_OR_RETURN(std::optional<CheckpointResult> row, Settled(*db_, c, set.label));
    if (row) {
      out.push_back(*std::move(row));
      continue;
    }
    CheckpointResult r = ResultOf(c, set.label);
    r.status = "failed";
    r.error = error.ToString();
    r.started_at = r.finished_at = UtcNow();
    SW_RETURN_IF_ERROR(Store(r));
    out.push_back(std::move(r));
  }
  Log(absl::StrCat("run ", c.run, " step ", c.step, " (", c.dir, "): FAILED: ", error.ToString()));
  return out;
}

// ---------------------------------------------------------------------------------------------
// CheckpointWatcher

CheckpointWatcher::CheckpointWatcher(ContinuousEvaluator* evaluator, WatchOptions options,
                                     TrainingMetrics* metrics)
    : evaluator_(evaluator), options_(std::move(options)), metrics_(metrics) {
  if (options_.run.empty()) {
    options_.run = fs::path(options_.dir).lexically_normal().filename().string();
    if (options_.run.empty()) {
      options_.run = fs::path(options_.dir).lexically_normal().parent_path().filename().string();
    }
  }
}

absl::StatusOr<int> CheckpointWatcher::Poll(const std::atomic<bool>& stop) {
  if (metrics_ != nullptr) metrics_->WatchPolled();
  std::error_code ec;
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(options_.dir, ec)) {
    std::error_code dec;
    const std::string name = e.path().filename().string();
    // Hidden directories and the trainer's tmp-checkpoint-N (renamed when complete).
    if (!e.is_directory(dec) || absl::StartsWith(name, ".") || absl::StartsWith(name, "tmp")) {
      continue;
    }
    dirs.push_back(e.path());
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("watch directory ", options_.dir, ": ", ec.message()));
  }
  struct Candidate {
    int64_t step;
    fs::path dir;
    std::string fingerprint;
  };
  std::vector<Candidate> ready;
  std::set<std::string> present;
  for (const fs::path& d : dirs) {
    const std::string name = d.filename().string();
    present.insert(name);
    auto fp = DirectoryFingerprint(d.string());
    if (!fp.ok()) continue;
    Seen& seen = seen_[name];
    if (*fp != seen.fingerprint) {
      seen = Seen{*fp, 0, false};
      continue;
    }
    if (seen.done) continue;
    if (++seen.stable < options_.stable_polls) continue;
    if (!options_.marker.empty() && !fs::exists(d / options_.marker, ec)) continue;
    auto step = CheckpointStep(d.string());
    if (!step.ok()) {
      if (evaluator_->options().log) {
        evaluator_->options().log(
            absl::StrCat("watch: skipping ", d.string(), ": ", step.status().ToString()));
      }
      seen.done = true;
      continue;
    }
    ready.push_back({*step, d, *fp});
  }
  for (auto it = seen_.begin(); it != seen_.end();) {
    it = present.count(it->first) ? std::next(it) : seen_.erase(it);
  }
  std::sort(ready.begin(), ready.end(),
            [](const Candidate& a, const Candidate& b) { return a.step < b.step; });
  int evaluated = 0;
  for (const Candidate& c : ready) {
    if (stop) break;
    CheckpointRef ref{options_.run, c.step, c.dir.string(), c.fingerprint, "watch"};
    SW_ASSIGN_OR_RETURN(bool recorded, evaluator_->AllRecorded(ref));
    if (!recorded) {
      absl::Status complete = CheckCheckpointComplete(ref.dir);
      if (complete.ok()) {
        SW_RETURN_IF_ERROR(evaluator_->Evaluate(ref).status());
      } else {
        SW_RETURN_IF_ERROR(evaluator_->RecordFailure(ref, complete).status());
      }
      ++evaluated;
    }
    seen_[c.dir.filename().string()].done = true;
  }
  return evaluated;
}

// ---------------------------------------------------------------------------------------------
// EvaluationLoop

EvaluationLoop::EvaluationLoop(CheckpointWatcher* watcher, double poll_seconds,
                               std::function<void(const std::string&)> log)
    : watcher_(watcher), poll_seconds_(poll_seconds), log_(std::move(log)) {}

EvaluationLoop::~EvaluationLoop() { Stop(); }

void EvaluationLoop::Start(std::function<bool(const std::atomic<bool>&)> first) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this, first = std::move(first)]() mutable { Loop(std::move(first)); });
}

bool EvaluationLoop::Post(std::function<void(bool)> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_ || !started_) return false;
  tasks_.push_back(std::move(task));
  cv_.notify_all();
  return true;
}

void EvaluationLoop::RequestStop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

void EvaluationLoop::Stop() {
  RequestStop();
  if (thread_.joinable()) thread_.join();
  std::deque<std::function<void(bool)>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(tasks_);
  }
  for (auto& t : left) t(true);
}

void EvaluationLoop::Loop(std::function<bool(const std::atomic<bool>&)> first) {
  bool first_done = !first;
  auto next_scan = std::chrono::steady_clock::now();
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(poll_seconds_));
  while (!stop_) {
    std::function<void(bool)> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (tasks_.empty()) {
        cv_.wait_until(lock, next_scan, [&] { return stop_ || !tasks_.empty(); });
      }
      if (stop_) break;
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    if (task) {
      task(false);
      continue;
    }
    if (std::chrono::steady_clock::now() < next_scan) continue;
    if (!first_done) first_done = first(stop_);
    if (watcher_ != nullptr && !stop_) {
      auto n = watcher_->Poll(stop_);
      if (!n.ok() && log_) log_(absl::StrCat("watch: ", n.status().ToString()));
    }
    next_scan = std::chrono::steady_clock::now() + period;
  }
}

}  // namespace specwire
