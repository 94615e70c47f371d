// Continuous evaluation without torch or gRPC: the results database, checkpoint steps and
// completeness, and the watcher + evaluator over a fake ScoreFn.
#include "services/scorer/eval/watch.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/safetensors.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  fs::path d = fs::temp_directory_path() /
               (name + "-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                "-" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void WriteText(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

// A valid one-tensor safetensors file, returned as bytes.
std::string SafetensorsBytes() {
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(8, '\x01');
}

void WriteCheckpoint(const fs::path& dir) {
  fs::create_directories(dir);
  WriteText(dir / "config.json", R"({"block_size": 8})");
  WriteText(dir / "model.safetensors", SafetensorsBytes());
}

AcceptanceSummary FakeSummary(double tau) {
  AcceptanceSummary s;
  s.block_size = 4;
  s.responses = 2;
  s.steps = 10;
  s.tau_mean_of_means = tau;
  s.tau_pooled = tau - 0.1;
  s.per_position_acceptance = {0.9, 0.5, 0.25};
  s.ddtree_tau[8] = {tau + 0.5, tau + 0.4};
  return s;
}

TEST(WatchTest, StepFromName) {
  EXPECT_EQ(StepFromName("checkpoint-1200"), 1200);
  EXPECT_EQ(StepFromName("step_1200"), 1200);
  EXPECT_EQ(StepFromName("step1200"), 1200);
  EXPECT_EQ(StepFromName("global_step7"), 7);
  EXPECT_EQ(StepFromName("1200"), 1200);
  EXPECT_EQ(StepFromName("checkpoint-12a"), std::nullopt);
  EXPECT_EQ(StepFromName("final"), std::nullopt);
  EXPECT_EQ(StepFromName("tmp-checkpoint-5"), std::nullopt);
}

TEST(WatchTest, StepFromTrainerState) {
  fs::path d = TempDir("sw-step") / "final";
  fs::create_directories(d);
  EXPECT_EQ(CheckpointStep(d.string()).status().code(), absl::StatusCode::kNotFound);
  WriteText(d / "trainer_state.json", R"({"global_step": 345})");
  EXPECT_EQ(*CheckpointStep(d.string()), 345);
}

TEST(WatchTest, ParseEvalSets) {
  auto sets = ParseEvalSets("chat=/a/chat.jsonl, /b/code.jsonl");
  ASSERT_TRUE(sets.ok()) << sets.status();
  ASSERT_EQ(sets->size(), 2u);
  EXPECT_EQ((*sets)[0].label, "chat");
  EXPECT_EQ((*sets)[1].label, "code");
  EXPECT_EQ((*sets)[1].path, "/b/code.jsonl");
  EXPECT_EQ(ParseEvalSets("a=x.jsonl,a=y.jsonl").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WatchTest, CompletenessNamesTheFile) {
  fs::path d = TempDir("sw-complete") / "checkpoint-1";
  fs::create_directories(d);
  absl::Status s = CheckCheckpointComplete(d.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("config.json"), std::string::npos) << s;
  WriteCheckpoint(d);
  EXPECT_TRUE(CheckCheckpointComplete(d.string()).ok());
  // Half-written: the data section ends before the header says.
  const std::string full = SafetensorsBytes();
  WriteText(d / "model.safetensors", full.substr(0, full.size() - 4));
  s = CheckCheckpointComplete(d.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s;
  WriteText(d / "model.safetensors", full);
  WriteText(d / "config.json", "{\"block_");
  s = CheckCheckpointComplete(d.string());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST(WatchTest, DatabaseRoundTripAndReopen) {
  fs::path d = TempDir("sw-db");
  const std::string path = (d / "eval.sqlite").string();
  {
    auto db = ResultsDb::Open(path);
    ASSERT_TRUE(db.ok()) << db.status();
    CheckpointResult r;
    r.run = "r1";
    r.step = 100;
    r.dataset = "chat";
    r.status = "ok";
    r.summary = FakeSummary(2.5);
    r.checkpoint_digest = "xxh3-128:00";
    ASSERT_TRUE((*db)->Record(r).ok());
    r.dataset = "code";
    r.status = "failed";
    r.error = "FAILED_PRECONDITION: vocab_size";
    ASSERT_TRUE((*db)->Record(r).ok());
  }
  auto db = ResultsDb::Open(path);
  ASSERT_TRUE(db.ok());
  auto all = (*db)->All();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].summary.tau_mean_of_means, 2.5);
  EXPECT_EQ((*all)[0].summary.ddtree_tau.at(8).first, 3.0);
  EXPECT_EQ((*all)[0].summary.per_position_acceptance, (std::vector<double>{0.9, 0.5, 0.25}));
  EXPECT_EQ((*all)[1].status, "failed");
  EXPECT_EQ((*all)[1].error, "FAILED_PRECONDITION: vocab_size");
  auto found = (*db)->Find("r1", 100, "chat");
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_FALSE(*(*db)->Find("r1", 101, "chat"));
}

// The watcher over a fake scorer: each checkpoint once per eval set, half-written ones wait,
// failures recorded, transient errors retried, nothing rescored by a new watcher (a restart).
TEST(WatchTest, WatcherScoresEachCheckpointOnce) {
  fs::path root = TempDir("sw-watch");
  fs::path watch = root / "run-a";
  fs::create_directories(watch);
  auto db = ResultsDb::Open((root / "eval.sqlite").string());
  ASSERT_TRUE(db.ok());
  std::map<std::string, int> calls;  // drafter dir + dataset → scorings
  absl::Status next_error;
  ScoreFn score = [&](const ScoreSpec& spec) -> absl::StatusOr<EvalScore> {
    if (!next_error.ok()) {
      absl::Status e = next_error;
      next_error = absl::OkStatus();
      return e;
    }
    ++calls[spec.drafter_path + "|" + spec.labels.dataset];
    if (fs::path(spec.drafter_path).filename() == "checkpoint-3") {
      return absl::FailedPreconditionError("vocab_size: drafter expects 9, extractor serves 8");
    }
    CanaryFingerprint canary;
    canary.token_ids = {11};
    canary.compute_dtype = "float32";
    canary.taps = {{"embedding", 0.0, 1.0, 1.0, {0.5}}};
    return EvalScore{FakeSummary(1.0 + calls.size() * 0.1), {}, canary,
                     R"({"weights_digest": "xxh3-128:w", "specwire_commit": "c"})"};
  };
  EvaluatorOptions eo;
  eo.eval_sets = {{"a", "a.jsonl"}, {"b", "b.jsonl"}};
  ContinuousEvaluator evaluator(db->get(), score, eo, nullptr);
  std::atomic<bool> stop{false};
  {
    CheckpointWatcher watcher(&evaluator, {watch.string(), "", 1, ""}, nullptr);
    EXPECT_EQ(watcher.options().run, "run-a");
    WriteCheckpoint(watch / "checkpoint-1");
    EXPECT_EQ(*watcher.Poll(stop), 0);  // first sight: waits one scan
    EXPECT_EQ(*watcher.Poll(stop), 1);
    EXPECT_EQ(*watcher.Poll(stop), 0);
    // Being written: it changes between scans, so it is not read.
    fs::create_directories(watch / "checkpoint-2");
    WriteText(watch / "checkpoint-2" / "config.json", "{}");
    EXPECT_EQ(*watcher.Poll(stop), 0);
    WriteText(watch / "checkpoint-2" / "model.safetensors", SafetensorsBytes().substr(0, 20));
    EXPECT_EQ(*watcher.Poll(stop), 0);
    // Stalled half-written: recorded failed (DATA_LOSS), then scored once it is whole.
    EXPECT_EQ(*watcher.Poll(stop), 1);
    auto row = (*db)->Find("run-a", 2, "a");
    ASSERT_TRUE(row.ok() && row->has_value());
    EXPECT_EQ((*row)->status, "failed");
    EXPECT_NE((*row)->error.find("model.safetensors"), std::string::npos) << (*row)->error;
    EXPECT_EQ(calls.count((watch / "checkpoint-2").string() + "|a"), 0u);
    WriteText(watch / "checkpoint-2" / "model.safetensors", SafetensorsBytes());
    EXPECT_EQ(*watcher.Poll(stop), 0);
    EXPECT_EQ(*watcher.Poll(stop), 1);
    EXPECT_EQ((*(*db)->Find("run-a", 2, "a"))->status, "ok");
    // The row keeps the scored target's canary fingerprint.
    EXPECT_EQ((*(*db)->Find("run-a", 2, "a"))->target_canary.taps.size(), 1u);
    // ... and the job's provenance, with the checkpoint digest the row was scored under.
    {
      const CheckpointResult ok_row = **(*db)->Find("run-a", 2, "a");
      const nlohmann::json p = nlohmann::json::parse(ok_row.provenance);
      EXPECT_EQ(p.at("weights_digest"), "xxh3-128:w");
      EXPECT_EQ(p.at("drafter_digest"), ok_row.checkpoint_digest);
      EXPECT_FALSE(ok_row.checkpoint_digest.empty());
    }
    // Wrong target: recorded failed with the contract error; the watcher goes on.
    WriteCheckpoint(watch / "checkpoint-3");
    // A transient error first: nothing recorded, retried on the next scan.
    next_error = absl::UnavailableError("extractor down");
    EXPECT_EQ(*watcher.Poll(stop), 0);
    EXPECT_FALSE(watcher.Poll(stop).ok());
    EXPECT_FALSE(*(*db)->Find("run-a", 3, "a"));
    EXPECT_EQ(*watcher.Poll(stop), 1);
    EXPECT_EQ((*(*db)->Find("run-a", 3, "b"))->status, "failed");
    EXPECT_NE((*(*db)->Find("run-a", 3, "b"))->error.find("vocab_size"), std::string::npos);
  }
  const std::map<std::string, int> before = calls;
  for (const auto& [key, n] : calls) EXPECT_EQ(n, 1) << key;
  // A new watcher (a restart) over the same database scores nothing again.
  CheckpointWatcher again(&evaluator, {watch.string(), "", 1, ""}, nullptr);
  EXPECT_EQ(*again.Poll(stop), 0);
  EXPECT_EQ(*again.Poll(stop), 0);
  EXPECT_EQ(calls, before);
  auto all = (*db)->All();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 6u);
}

// The value of one gauge sample (NaN when absent).
double GaugeValue(prometheus::Registry& registry, const std::string& name,
                  const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::map<std::string, std::string> got;
      for (const auto& l : m.label) got[l.name] = l.value;
      if (got == labels) return m.gauge.value;
    }
  }
  return std::nan("");
}

// Latest / previous follow the step order, not the order results arrive in (a restart re-exports
// rows sorted by step; push mode may deliver an older step late).
TEST(WatchTest, LatestAndPreviousFollowTheStepOrder) {
  auto registry = std::make_shared<prometheus::Registry>();
  TrainingMetrics metrics(registry);
  auto row = [](int64_t step, double tau) {
    CheckpointResult r;
    r.run = "r1";
    r.step = step;
    r.dataset = "chat";
    r.status = "ok";
    r.summary = FakeSummary(tau);
    return r;
  };
  metrics.Record(row(10, 2.0), true);
  metrics.Record(row(30, 3.0), true);
  metrics.Record(row(20, 2.5), false);
  const std::map<std::string, std::string> mm = {
      {"run", "r1"}, {"dataset", "chat"}, {"kind", "mean_of_means"}};
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_latest_tau", mm), 3.0);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_previous_tau", mm), 2.5);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_latest_step", {{"run", "r1"}}), 30);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_tau",
                       {{"run", "r1"}, {"step", "20"}, {"dataset", "chat"}, {"kind", "pooled"}}),
            2.4);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_latest_acceptance",
                       {{"run", "r1"}, {"dataset", "chat"}, {"position", "3"}}),
            0.25);
  // A failed row, later scored ok: the failure gauge goes away.
  CheckpointResult failed = row(40, 0);
  failed.status = "failed";
  metrics.Record(failed, true);
  const std::map<std::string, std::string> key = {
      {"run", "r1"}, {"step", "40"}, {"dataset", "chat"}};
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_failed", key), 1);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_latest_step", {{"run", "r1"}}), 30);
  metrics.Record(row(40, 1.0), true);
  EXPECT_TRUE(std::isnan(GaugeValue(*registry, "specwire_checkpoint_failed", key)));
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_latest_tau", mm), 1.0);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_previous_tau", mm), 3.0);
}

// The regression check pairs prompts by trajectory, looks only at the fixed token window, and
// its gauge goes away when nothing pairs (which the alert rules treat as an alert of its own).
TEST(WatchTest, RegressionCheckIsPairedOnAFixedWindow) {
  auto registry = std::make_shared<prometheus::Registry>();
  RegressionOptions o;
  o.window_tokens = 8;
  TrainingMetrics metrics(registry, o);
  auto row = [](int64_t step, std::vector<std::vector<int32_t>> steps, const std::string& tag) {
    CheckpointResult r;
    r.run = "r1";
    r.step = step;
    r.dataset = "chat";
    r.status = "ok";
    r.summary = FakeSummary(2.0);
    for (size_t i = 0; i < steps.size(); ++i) {
      r.prompts.push_back({static_cast<int64_t>(i), tag + std::to_string(i), steps[i], 0, {}});
    }
    return r;
  };
  // A step belongs to the window of its first token (the first step starts at token 2): in
  // [1, 8] the base drafter's steps average 2, 2 and 4 on the three prompts.
  const auto base = row(10, {{2, 2, 2, 2, 5, 5}, {1, 1, 3, 3}, {4, 4, 4}}, "t");
  // Worse inside the window on every prompt (1 per step); much better after it (a longer
  // generation would show that, the window keeps it out).
  const std::vector<int32_t> late{1, 1, 1, 1, 1, 1, 1, 16, 16};
  const auto worse = row(20, {late, late, late}, "t");
  const PairedComparison d = RegressionCheck(base, worse, o);
  EXPECT_EQ(d.prompts, 3);
  EXPECT_LT(d.delta, 0);
  ASSERT_TRUE(d.delta_ci);
  EXPECT_LT(d.delta_ci->hi, 0);
  metrics.Record(base, true);
  const std::map<std::string, std::string> hi = {
      {"run", "r1"}, {"dataset", "chat"}, {"bound", "hi"}};
  EXPECT_TRUE(std::isnan(GaugeValue(*registry, "specwire_checkpoint_delta_tau", hi)));
  metrics.Record(worse, true);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_delta_tau", hi), d.delta_ci->hi);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_delta_tau",
                       {{"run", "r1"}, {"dataset", "chat"}, {"bound", "estimate"}}),
            d.delta);
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_delta_tau_prompts",
                       {{"run", "r1"}, {"dataset", "chat"}}),
            3);
  // Other trajectories (another target or generation settings): nothing pairs, no gauge.
  metrics.Record(row(30, {{2, 2}, {2, 2}, {2, 2}}, "other"), true);
  EXPECT_TRUE(std::isnan(GaugeValue(*registry, "specwire_checkpoint_delta_tau", hi)));
  EXPECT_EQ(GaugeValue(*registry, "specwire_checkpoint_delta_tau_prompts",
                       {{"run", "r1"}, {"dataset", "chat"}}),
            0);
}

// A longer generation (another max_new_tokens) changes the digest but not the prefix the window
// depends on: the prompts still pair; a prefix that differs inside the window does not.
TEST(WatchTest, RegressionCheckPairsAcrossGenerationLengths) {
  RegressionOptions o;
  o.window_tokens = 8;
  auto row = [](std::vector<int64_t> traj, std::vector<int32_t> steps) {
    CheckpointResult r;
    r.status = "ok";
    r.summary = FakeSummary(2.0);  // block size 4
    r.prompts.push_back({0, TrajectoryDigest(traj), steps, 3, traj});
    return r;
  };
  std::vector<int64_t> long_traj(40), short_traj;
  for (int i = 0; i < 40; ++i) long_traj[i] = i % 7;
  short_traj.assign(long_traj.begin(), long_traj.begin() + 3 + 8 + 4 + 1);  // just enough
  const auto previous = row(long_traj, {2, 2, 2, 2, 4, 4});
  const auto latest = row(short_traj, {1, 1, 1, 1, 1, 1, 1});
  PairedComparison d = RegressionCheck(previous, latest, o);
  EXPECT_EQ(d.prompts, 1);
  EXPECT_DOUBLE_EQ(d.delta, 1.0 - 2.0);
  short_traj.pop_back();  // one token short of the window + a block: cannot be trusted
  EXPECT_EQ(RegressionCheck(previous, row(short_traj, {1, 1, 1}), o).prompts, 0);
  std::vector<int64_t> other = long_traj;
  other[6] = 99;  // differs inside the window
  EXPECT_EQ(RegressionCheck(previous, row(other, {1, 1, 1}), o).prompts, 0);
}

TEST(WatchTest, PromptStepsSurviveTheDatabase) {
  const fs::path root = fs::temp_directory_path() / "specwire_watch_prompt_steps";
  fs::remove_all(root);
  auto db = ResultsDb::Open((root / "eval.sqlite").string());
  ASSERT_TRUE(db.ok());
  CheckpointResult r;
  r.run = "r";
  r.step = 1;
  r.dataset = "d";
  r.status = "ok";
  r.summary = FakeSummary(2.0);
  r.prompts = {{0, "xxh3-128:a", {1, 2, 3}, 2, {5, 6, 7, 8}}, {2, "xxh3-128:b", {}, 0, {}}};
  r.target_canary.token_ids = {11, 7930};
  r.target_canary.compute_dtype = "float32";
  r.target_canary.taps = {{"embedding", 0.1, 0.9, 0.905, {0.5, -0.25}},
                          {"final_norm", -0.0, 1.0, 1.0, {1.0 / 3, 2e-17}}};
  ASSERT_TRUE((*db)->Record(r).ok());
  auto back = (*db)->Find("r", 1, "d");
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->prompts, r.prompts);
  EXPECT_EQ((*back)->target_canary, r.target_canary);  // doubles round-trip exactly
  EXPECT_EQ((*back)->provenance, "");
  r.step = 2;
  r.provenance = ScoreProvenanceJson(ExtractionContract{}, "float32", "", "xxh3-128:d", "");
  ASSERT_TRUE((*db)->Record(r).ok());
  EXPECT_EQ(nlohmann::json::parse((*(*db)->Find("r", 2, "d"))->provenance),
            nlohmann::json::parse(r.provenance));
  r.step = 3;
  r.provenance = "[1]";
  EXPECT_FALSE((*db)->Record(r).ok());  // not an object: refused, nothing half-written
  fs::remove_all(root);
}

}  // namespace
}  // namespace specwire
