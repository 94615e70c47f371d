#include "services/scorer/job/score_job.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/safetensors.h"
#include "services/scorer/job/scorer_test_fakes.h"

namespace specwire {
namespace {

namespace fs = std::filesystem;
using testing::FakeBackend;
using testing::FakeContract;
using testing::FakeDrafter;
using testing::FakeEndpoint;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / absl::StrCat("score_job_test_", name, "_", ::getpid());
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void WriteText(const fs::path& p, const std::string& text) {
  std::ofstream out(p);
  out << text;
}

// --- the contract check -------------------------------------------------------------------------

DrafterSpec Qwen36Drafter() {
  DrafterSpec d;
  d.path = "/drafters/Qwen3.6-27B-DFlash";
  d.block_size = 16;
  d.hidden_size = 5120;
  d.target_hidden_size = 5120;
  d.fc_in_features = 5 * 5120;
  d.num_target_layers = 64;
  d.target_layer_ids = {1, 16, 31, 46, 61};
  d.mask_token_id = 248070;
  d.vocab_size = 248320;
  return d;
}

ExtractionContract Qwen36Target() {
  ExtractionContract c = FakeContract(64, 5120, 248320);
  c.architecture = "Qwen3_5ForCausalLM";
  return c;
}

TEST(CheckDrafterContract, MatchingTargetPasses) {
  EXPECT_TRUE(CheckDrafterContract(Qwen36Drafter(), Qwen36Target()).ok());
  EXPECT_TRUE(CheckDrafterContract(FakeDrafter(), FakeContract()).ok());
}

TEST(CheckDrafterContract, WrongDepthNamesNumTargetLayersWithBothValues) {
  ExtractionContract t = FakeContract(36, 5120, 248320);  // a Qwen3-8B-sized depth
  absl::Status s = CheckDrafterContract(Qwen36Drafter(), t);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("num_target_layers: drafter expects 64, extractor serves 36"),
            std::string::npos)
      << s;
  // Layer ids beyond the target are named too, with the layer and the target's range.
  EXPECT_NE(s.message().find(
                "target_layer_ids[3]: drafter uses layer 46, extractor serves layers [0, 36)"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.message().find("target_layer_ids[2]"), std::string::npos) << s;  // 31 < 36
}

TEST(CheckDrafterContract, ThreeLayerExtractor) {
  absl::Status s = CheckDrafterContract(Qwen36Drafter(), FakeContract(3, 5120, 248320));
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("num_target_layers: drafter expects 64, extractor serves 3"),
            std::string::npos)
      << s;
}

TEST(CheckDrafterContract, WrongHiddenSizeShowsTheFcArithmetic) {
  absl::Status s = CheckDrafterContract(Qwen36Drafter(), FakeContract(64, 4096, 248320));
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("hidden_size: drafter expects 5120 (fc in_features 25600 / 5 target "
                             "layers), extractor serves 4096"),
            std::string::npos)
      << s;
}

TEST(CheckDrafterContract, VocabularyAndMaskToken) {
  absl::Status s = CheckDrafterContract(Qwen36Drafter(), FakeContract(64, 5120, 151936));
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("vocab_size: drafter expects 248320, extractor serves 151936"),
            std::string::npos)
      << s;
  EXPECT_NE(
      s.message().find("mask_token_id: drafter uses 248070, extractor's vocabulary is [0, 151936)"),
      std::string::npos)
      << s;
}

TEST(CheckDrafterContract, UnstatedDepthIsNotAMismatch) {
  DrafterSpec d = Qwen36Drafter();
  d.num_target_layers = 0;  // config.json without num_target_layers
  EXPECT_TRUE(CheckDrafterContract(d, FakeContract(62, 5120, 248320)).ok());
  EXPECT_FALSE(CheckDrafterContract(d, FakeContract(61, 5120, 248320)).ok());  // layer 61
}

TEST(CheckSameTarget, NamesFieldAndBothAddresses) {
  ExtractionContract a = FakeContract(), b = FakeContract();
  EXPECT_TRUE(CheckSameTarget("h1:1", a, "h2:2", b).ok());
  b.weights_digest = "xxh3-128:other";
  absl::Status s = CheckSameTarget("h1:1", a, "h2:2", b);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("weights_digest: h1:1 serves " + a.weights_digest +
                             ", h2:2 serves xxh3-128:other"),
            std::string::npos)
      << s;
  b = FakeContract();
  b.compute_dtype = "bfloat16";
  EXPECT_NE(CheckSameTarget("h1:1", a, "h2:2", b).message().find("compute_dtype"),
            std::string::npos);
}

// --- prompts, features ------------------------------------------------------------------------

TEST(ReadPromptDataset, TextAndIdsBlankLinesAndLimit) {
  const fs::path dir = TempDir("dataset");
  WriteText(dir / "d.jsonl",
            "{\"prompt\": \"hello\"}\n\n{\"input_ids\": [1, 2, 3]}\n{\"prompt\": \"x\"}\n");
  auto all = ReadPromptDataset((dir / "d.jsonl").string(), 0);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_TRUE((*all)[0].is_text);
  EXPECT_EQ((*all)[0].text, "hello");
  EXPECT_EQ((*all)[1].token_ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ReadPromptDataset((dir / "d.jsonl").string(), 2)->size(), 2u);

  WriteText(dir / "bad.jsonl", "{\"prompt\": \"ok\"}\n{\"input_ids\": [1, \"a\"]}\n");
  auto bad = ReadPromptDataset((dir / "bad.jsonl").string(), 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  WriteText(dir / "other.jsonl", "{\"question\": \"?\"}\n");
  EXPECT_NE(
      ReadPromptDataset((dir / "other.jsonl").string(), 0).status().message().find("expected"),
      std::string::npos);
  EXPECT_EQ(ReadPromptDataset((dir / "missing.jsonl").string(), 0).status().code(),
            absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST(DrafterStates, LastLayerIsTheFinalNormTap) {
  // dflash reads hidden_states[id + 1]; for id = L − 1 that is transformers' final-normed state.
  StateSelection s = DrafterStates({2, 0, 2}, 3);
  EXPECT_EQ(s.layer_ids, (std::vector<int64_t>{0}));
  EXPECT_TRUE(s.final_norm);
  EXPECT_FALSE(s.embedding);
  s = DrafterStates({1, 16, 31, 46, 61}, 64);
  EXPECT_EQ(s.layer_ids, (std::vector<int64_t>{1, 16, 31, 46, 61}));
  EXPECT_FALSE(s.final_norm);
  // EAGLE-3's auxiliary states are layer outputs before the norm, the last layer's too.
  s = DrafterStates({0, 2}, 3, /*last_layer_is_final_norm=*/false);
  EXPECT_EQ(s.layer_ids, (std::vector<int64_t>{0, 2}));
  EXPECT_FALSE(s.final_norm);
}

TEST(TrajectoryFromReply, StatesInTargetLayerOrder) {
  FakeEndpoint e("fake:1");
  GenerateParams p;
  p.prompts = {InputSequence::Tokens({3, 4})};
  p.max_new_tokens = 3;
  p.states = DrafterStates({2, 0}, 3);
  auto reply = e.Generate(p);
  ASSERT_TRUE(reply.ok());
  // Mark the states to tell them apart.
  for (auto& s : reply->states) s.bytes[0] = s.state == "final_norm" ? std::byte{9} : std::byte{5};
  auto t = TrajectoryFromReply(*reply, {2, 0}, 3, 3);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens, (std::vector<int64_t>{3, 4, 5, 6, 0}));
  EXPECT_EQ(t->prompt_len, 2);
  EXPECT_EQ(t->max_length, 5);
  ASSERT_EQ(t->states.size(), 2u);
  EXPECT_EQ(t->states[0].layer_id, 2);
  EXPECT_EQ(t->states[0].bytes[0], std::byte{9});  // final_norm stands for layer 2
  EXPECT_EQ(t->states[1].layer_id, 0);
  EXPECT_EQ(t->states[1].bytes[0], std::byte{5});
  EXPECT_EQ(t->states[1].rows, 5);

  GenerateReply missing = *e.Generate(p);
  missing.states.pop_back();
  EXPECT_EQ(TrajectoryFromReply(missing, {2, 0}, 3, 3).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(ResolveExtractorAddresses, ListsAndDns) {
  auto list = ResolveExtractorAddresses(" 127.0.0.1:5001, host:5002 ,[::1]:5003");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(*list, (std::vector<std::string>{"127.0.0.1:5001", "host:5002", "[::1]:5003"}));
  EXPECT_EQ(*ResolveExtractorAddresses("ipv4:10.0.0.1:1,10.0.0.2:1"),
            (std::vector<std::string>{"10.0.0.1:1", "10.0.0.2:1"}));
  EXPECT_EQ(ResolveExtractorAddresses("nohost").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveExtractorAddresses("").status().code(), absl::StatusCode::kInvalidArgument);
  auto dns = ResolveExtractorAddresses("dns:///localhost:5005");
  ASSERT_TRUE(dns.ok()) << dns.status();
  ASSERT_FALSE(dns->empty());
  for (const auto& a : *dns) {
    EXPECT_TRUE(a == "127.0.0.1:5005" || a == "[::1]:5005") << a;
  }
}

TEST(ValidateSpec, Limits) {
  ScoreLimits o;
  o.max_new_tokens = 100;
  o.max_ddtree_budget = 64;
  o.max_ddtree_budgets = 2;
  o.max_prompts = 2;
  ScoreSpec s;
  s.drafter_path = "/d";
  s.prompts = {InputSequence::Tokens({1})};
  s.max_new_tokens = 10;
  EXPECT_TRUE(ValidateSpec(s, o).ok());
  ScoreSpec bad = s;
  bad.drafter_path.clear();
  EXPECT_NE(ValidateSpec(bad, o).message().find("drafter_path"), std::string::npos);
  bad = s;
  bad.max_new_tokens = 101;
  EXPECT_NE(ValidateSpec(bad, o).message().find("max_new_tokens: 101"), std::string::npos);
  bad = s;
  bad.ddtree_budgets = {8, 128};
  EXPECT_NE(ValidateSpec(bad, o).message().find("ddtree_budgets[1]: 128"), std::string::npos);
  bad.ddtree_budgets = {1, 2, 3};
  EXPECT_NE(ValidateSpec(bad, o).message().find("3 budgets"), std::string::npos);
  bad = s;
  bad.prompts.assign(3, InputSequence::Tokens({1}));
  EXPECT_EQ(ValidateSpec(bad, o).code(), absl::StatusCode::kInvalidArgument);
  bad = s;
  bad.dataset_path = "/x.jsonl";
  EXPECT_NE(ValidateSpec(bad, o).message().find("not both"), std::string::npos);
  bad = s;
  bad.prompts.clear();
  EXPECT_EQ(ValidateSpec(bad, o).code(), absl::StatusCode::kInvalidArgument);

  const fs::path root = TempDir("root");
  o.data_root = root.string();
  ScoreSpec inside = s;
  inside.drafter_path = (root / "drafters" / "a").string();
  EXPECT_TRUE(ValidateSpec(inside, o).ok());
  inside.drafter_path = (root / ".." / "elsewhere").string();
  EXPECT_EQ(ValidateSpec(inside, o).code(), absl::StatusCode::kPermissionDenied);
  fs::remove_all(root);
}

TEST(ResolveLabels, Defaults) {
  ScoreSpec s;
  s.drafter_path = "/models/Qwen3-8B-DFlash-b16/";
  s.dataset_path = "/data/gsm8k.jsonl";
  // The method is the job's, or (ScoreRunner::Run) the loaded drafter's family.
  EXPECT_EQ(ResolveLabels(s), (ScoreLabels{"Qwen3-8B-DFlash-b16", "gsm8k", ""}));
  s.dataset_path.clear();
  s.labels.method = "dflash-sw";
  EXPECT_EQ(ResolveLabels(s), (ScoreLabels{"Qwen3-8B-DFlash-b16", "inline", "dflash-sw"}));
}

// --- the runner -------------------------------------------------------------------------------

struct Recorded {
  std::vector<std::string> order;  // "start", "progress:N", "prompt:I", "summary"
  ScoreStart start;
  std::vector<PromptScore> prompts;
  std::vector<ScoreProgress> progress;
  AcceptanceSummary summary;
};

ScoreEvents Record(Recorded& r) {
  ScoreEvents e;
  e.on_start = [&](const ScoreStart& s) {
    r.order.push_back("start");
    r.start = s;
  };
  e.on_progress = [&](const ScoreProgress& p) {
    r.order.push_back(absl::StrCat("progress:", p.done));
    r.progress.push_back(p);
  };
  e.on_prompt = [&](const PromptScore& p) {
    r.order.push_back(absl::StrCat("prompt:", p.prompt_index));
    r.prompts.push_back(p);
  };
  e.on_summary = [&](const AcceptanceSummary& s) {
    r.order.push_back("summary");
    r.summary = s;
  };
  return e;
}

std::vector<std::unique_ptr<ExtractorEndpoint>> Endpoints(int n, std::vector<FakeEndpoint*>* raw) {
  std::vector<std::unique_ptr<ExtractorEndpoint>> out;
  for (int i = 0; i < n; ++i) {
    auto e = std::make_unique<FakeEndpoint>(absl::StrCat("fake:", i + 1));
    if (raw) raw->push_back(e.get());
    out.push_back(std::move(e));
  }
  return out;
}

ScoreSpec FiveTokenPrompts() {
  ScoreSpec s;
  s.drafter_path = "/drafters/tiny";
  for (int i = 0; i < 5; ++i) s.prompts.push_back(InputSequence::Tokens({i, i + 1, 2 * i}));
  s.max_new_tokens = 12;
  s.ddtree_budgets = {4, 8};
  return s;
}

TEST(ScoreRunner, EventsInOrderAndASummaryOverAllPrompts) {
  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, &raw));
  FakeBackend backend;
  ScoreRunner runner(&backend, pool.get(), {});
  Recorded r;
  std::atomic<bool> cancelled{false};
  absl::Status s = runner.Run(FiveTokenPrompts(), Record(r), cancelled);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(r.order.size(), 1 + 1 + 2 * 5 + 1u);
  EXPECT_EQ(r.order[0], "start");
  EXPECT_EQ(r.order[1], "progress:0");
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(r.order[2 + 2 * i].starts_with("prompt:"));
    EXPECT_EQ(r.order[3 + 2 * i], absl::StrCat("progress:", i + 1));
  }
  EXPECT_EQ(r.order.back(), "summary");
  EXPECT_EQ(r.start.labels, (ScoreLabels{"tiny", "inline", "dflash"}));
  EXPECT_EQ(r.start.prompts_total, 5);
  EXPECT_EQ(r.start.drafter.target_layer_ids, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r.summary.responses, 5);
  EXPECT_EQ(r.summary.block_size, 4);
  EXPECT_EQ(r.summary.ddtree_tau.size(), 2u);
  // Per-prompt results carry the token counts, τ, and the finish reason.
  for (const PromptScore& p : r.prompts) {
    EXPECT_EQ(p.acceptance.prompt_tokens, 3);
    EXPECT_EQ(p.acceptance.completion_tokens, 12);
    EXPECT_EQ(p.finish_reason, "max_new_tokens");
    EXPECT_DOUBLE_EQ(p.tau, MeanStepLength(p.acceptance.step_lengths));
  }
  EXPECT_DOUBLE_EQ(r.progress.back().tau_so_far, r.summary.tau_mean_of_means);
  EXPECT_DOUBLE_EQ(r.progress.back().tau_pooled_so_far, r.summary.tau_pooled);
  // The extractor was asked for layer 0 and the final-norm tap (layer 2 = L − 1), in fp32.
  EXPECT_EQ(raw[0]->requested_states.layer_ids, (std::vector<int64_t>{0}));
  EXPECT_TRUE(raw[0]->requested_states.final_norm);
  EXPECT_EQ(raw[0]->wire_dtype, DType::kF32);
  EXPECT_EQ(backend.last_states, 2u);
  EXPECT_EQ(backend.heads_set, 1);
  EXPECT_EQ(backend.head_shape, (std::vector<int64_t>{16, 4}));
}

TEST(ResolveTrees, EachFamilyItsTree) {
  ScoreSpec s;
  s.ddtree_budgets = {8, 32};
  auto dd = ResolveTrees(s, kTreeDDTree, 16);
  ASSERT_TRUE(dd.ok()) << dd.status();
  EXPECT_EQ(dd->method, kTreeDDTree);
  EXPECT_EQ(dd->budgets, (std::vector<int32_t>{8, 32}));
  EXPECT_EQ(dd->depth, 0);
  EXPECT_EQ(dd->top_k, 0);
  // DFlash2's selector walks one path: no tree, whatever the job's budgets.
  auto d2 = ResolveTrees(s, "", 16);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->method, "");
  EXPECT_TRUE(d2->budgets.empty());
  // EAGLE-3: the chain's depth and top-k 8 unless the job says.
  auto e = ResolveTrees(s, kTreeEagle, 6);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->method, kTreeEagle);
  EXPECT_EQ(e->depth, 5);
  EXPECT_EQ(e->top_k, TreeSettings::kDefaultEagleTopK);
  s.tree_depth = 3;
  s.tree_top_k = 4;
  e = ResolveTrees(s, kTreeEagle, 6);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->depth, 3);
  EXPECT_EQ(e->top_k, 4);
  s.tree_depth = 6;
  e = ResolveTrees(s, kTreeEagle, 6);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("tree_depth: 6"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("chain of 5 drafts"), std::string::npos);
  // A DFlash job ignores EAGLE's settings (one job may score drafters of both families).
  EXPECT_TRUE(ResolveTrees(s, kTreeDDTree, 16).ok());
}

TEST(ValidateSpec, TreeSettings) {
  ScoreSpec s;
  s.drafter_path = "/d";
  s.prompts = {InputSequence::Tokens({1})};
  for (int32_t v : {0, 1, 64}) {
    s.tree_depth = v;
    s.tree_top_k = v;
    EXPECT_TRUE(ValidateSpec(s, {}).ok()) << v;
  }
  s.tree_depth = 65;
  s.tree_top_k = 1;
  EXPECT_NE(ValidateSpec(s, {}).message().find("tree_depth: 65"), std::string::npos);
  s.tree_depth = 1;
  s.tree_top_k = -1;
  EXPECT_NE(ValidateSpec(s, {}).message().find("tree_top_k: -1"), std::string::npos);
}

TEST(ScoreRunner, EagleDrafterGrowsEaglesTree) {
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, nullptr));
  DrafterSpec d = FakeDrafter();
  d.method = "eagle3";
  d.tree = kTreeEagle;  // the family row says which tree it drafts
  FakeBackend backend(d);
  ScoreRunner runner(&backend, pool.get(), {});
  Recorded r;
  std::atomic<bool> cancelled{false};
  ScoreSpec spec = FiveTokenPrompts();
  spec.tree_top_k = 3;
  ASSERT_TRUE(runner.Run(spec, Record(r), cancelled).ok());
  EXPECT_EQ(backend.last_trees.method, kTreeEagle);
  EXPECT_EQ(backend.last_trees.budgets, (std::vector<int32_t>{4, 8}));
  EXPECT_EQ(backend.last_trees.depth, d.block_size - 1);
  EXPECT_EQ(backend.last_trees.top_k, 3);
  EXPECT_EQ(r.summary.tree_method, kTreeEagle);
  EXPECT_EQ(r.summary.tree_depth, d.block_size - 1);
  EXPECT_EQ(r.summary.tree_top_k, 3);
  EXPECT_EQ(r.summary.ddtree_tau.size(), 2u);
  EXPECT_EQ(r.start.labels.method, "eagle3");
  // Deeper than the chain: refused before any prompt is fetched.
  spec.tree_depth = d.block_size;
  absl::Status s = runner.Run(spec, Record(r), cancelled);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tree_depth"), std::string::npos) << s;
}

TEST(ScoreRunner, SeveralExtractorsShareThePromptsAndGiveTheSameSummary) {
  FakeBackend b1, b3;
  auto one = ExtractorPool::FromEndpoints(Endpoints(1, nullptr));
  std::vector<FakeEndpoint*> raw;
  auto three = ExtractorPool::FromEndpoints(Endpoints(3, &raw));
  for (FakeEndpoint* e : raw) e->delay_ms = 5;  // so that all three get work
  Recorded r1, r3;
  std::atomic<bool> cancelled{false};
  ASSERT_TRUE(ScoreRunner(&b1, one.get(), {}).Run(FiveTokenPrompts(), Record(r1), cancelled).ok());
  ASSERT_TRUE(
      ScoreRunner(&b3, three.get(), {}).Run(FiveTokenPrompts(), Record(r3), cancelled).ok());
  EXPECT_EQ(AcceptanceSummaryToJson(r1.summary), AcceptanceSummaryToJson(r3.summary));
  int calls = 0, used = 0;
  for (FakeEndpoint* e : raw) {
    calls += e->generate_calls;
    used += e->generate_calls > 0;
  }
  EXPECT_EQ(calls, 5);
  EXPECT_GE(used, 2);
  EXPECT_EQ(r3.start.extractors, (std::vector<std::string>{"fake:1", "fake:2", "fake:3"}));
}

TEST(ScoreRunner, ContractMismatchStopsBeforeAnyWork) {
  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, &raw));
  DrafterSpec d = FakeDrafter();
  d.num_target_layers = 64;
  d.target_layer_ids = {1, 16, 31, 46, 61};
  d.fc_in_features = 5 * 4;
  FakeBackend backend(d);
  Recorded r;
  std::atomic<bool> cancelled{false};
  absl::Status s =
      ScoreRunner(&backend, pool.get(), {}).Run(FiveTokenPrompts(), Record(r), cancelled);
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("num_target_layers: drafter expects 64, extractor serves 3"),
            std::string::npos)
      << s;
  EXPECT_TRUE(r.order.empty());
  EXPECT_EQ(raw[0]->generate_calls, 0);
  EXPECT_EQ(raw[0]->get_tensors_calls, 0);
  EXPECT_EQ(backend.replays, 0);
}

TEST(ScoreRunner, ExtractorsOfDifferentTargetsAreRefused) {
  std::vector<std::unique_ptr<ExtractorEndpoint>> eps;
  eps.push_back(std::make_unique<FakeEndpoint>("a:1"));
  eps.push_back(std::make_unique<FakeEndpoint>("b:2", FakeContract(4)));
  auto pool = ExtractorPool::FromEndpoints(std::move(eps));
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  absl::Status s =
      ScoreRunner(&backend, pool.get(), {}).Run(FiveTokenPrompts(), Record(r), cancelled);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("num_layers: a:1 serves 3, b:2 serves 4"), std::string::npos) << s;
}

TEST(ScoreRunner, BehindDnsAnUnansweringAddressIsLeftOut) {
  for (bool dns : {false, true}) {
    std::vector<FakeEndpoint*> raw;
    auto eps = Endpoints(2, &raw);
    raw[0]->info_error = absl::UnavailableError("connection refused");
    auto pool = ExtractorPool::FromEndpoints(std::move(eps), dns);
    FakeBackend backend;
    Recorded r;
    std::atomic<bool> cancelled{false};
    ScoreRunnerOptions fast;  // a listed address is retried (the retry policy) before failing
    fast.fetch.retry.initial_backoff_s = 0.001;
    fast.fetch.retry.max_backoff_s = 0.002;
    absl::Status s =
        ScoreRunner(&backend, pool.get(), fast).Run(FiveTokenPrompts(), Record(r), cancelled);
    if (!dns) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
      EXPECT_NE(s.message().find("extractor fake:1 GetModelInfo: connection refused"),
                std::string::npos)
          << s;
      continue;
    }
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(r.start.extractors, (std::vector<std::string>{"fake:2"}));
    EXPECT_EQ(raw[0]->generate_calls, 0);
    EXPECT_EQ(raw[1]->generate_calls, 5);
  }
  // Not every error is a missing replica: a refusal still fails the job.
  std::vector<FakeEndpoint*> raw;
  auto eps = Endpoints(2, &raw);
  raw[1]->info_error = absl::PermissionDeniedError("no");
  auto pool = ExtractorPool::FromEndpoints(std::move(eps), true);
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  EXPECT_EQ(
      ScoreRunner(&backend, pool.get(), {}).Run(FiveTokenPrompts(), Record(r), cancelled).code(),
      absl::StatusCode::kPermissionDenied);
}

TEST(ScoreRunner, ErrorsNameThePromptAndTheExtractor) {
  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, &raw));
  raw[0]->fail_generate = absl::UnavailableError("connection refused");
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  ScoreRunnerOptions no_retry;
  no_retry.fetch.retry.max_attempts = 1;
  absl::Status s =
      ScoreRunner(&backend, pool.get(), no_retry).Run(FiveTokenPrompts(), Record(r), cancelled);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("(Generate on fake:1): connection refused"), std::string::npos) << s;

  ScoreSpec spec = FiveTokenPrompts();
  spec.prompts[2] = InputSequence::Tokens({1, 99});
  raw[0]->fail_generate = absl::OkStatus();
  s = ScoreRunner(&backend, pool.get(), {}).Run(spec, Record(r), cancelled);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompts[2] token 1 = 99 is outside the vocabulary [0, 16)"),
            std::string::npos)
      << s;

  backend.load_error = absl::NotFoundError("config.json: not found");
  s = ScoreRunner(&backend, pool.get(), {}).Run(FiveTokenPrompts(), Record(r), cancelled);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("drafter_path /drafters/tiny: config.json"), std::string::npos) << s;
}

TEST(ScoreRunner, TextPromptsAndDatasetsAreTokenizedByTheExtractor) {
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, nullptr));
  FakeBackend backend;
  const fs::path dir = TempDir("runner_dataset");
  WriteText(dir / "mix.jsonl",
            "{\"prompt\": \"abcd\"}\n{\"input_ids\": [1, 2]}\n{\"prompt\": \"z\"}\n");
  ScoreSpec spec = FiveTokenPrompts();
  spec.prompts.clear();
  spec.dataset_path = (dir / "mix.jsonl").string();
  spec.max_prompts = 2;
  Recorded r;
  std::atomic<bool> cancelled{false};
  ASSERT_TRUE(ScoreRunner(&backend, pool.get(), {}).Run(spec, Record(r), cancelled).ok());
  EXPECT_EQ(r.start.labels.dataset, "mix");
  ASSERT_EQ(r.prompts.size(), 2u);
  std::map<int64_t, int64_t> prompt_tokens;
  for (const auto& p : r.prompts) prompt_tokens[p.prompt_index] = p.acceptance.prompt_tokens;
  EXPECT_EQ(prompt_tokens[0], 4);  // "abcd": one id per byte in the fake tokenizer
  EXPECT_EQ(prompt_tokens[1], 2);
  fs::remove_all(dir);
}

TEST(ScoreRunner, TargetHeadIsCachedByDigestAcrossRestarts) {
  const fs::path cache = TempDir("cache");
  ScoreRunnerOptions o;
  o.head.cache_dir = cache.string();
  std::vector<std::string> log;
  o.log = [&](const std::string& l) { log.push_back(l); };
  std::atomic<bool> cancelled{false};
  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, &raw));
  {
    FakeBackend backend;
    Recorded r;
    ASSERT_TRUE(
        ScoreRunner(&backend, pool.get(), o).Run(FiveTokenPrompts(), Record(r), cancelled).ok());
    // A second job with the same scorer keeps the head in memory.
    ASSERT_TRUE(
        ScoreRunner(&backend, pool.get(), o).Run(FiveTokenPrompts(), Record(r), cancelled).ok());
    EXPECT_EQ(backend.heads_set, 1);
  }
  EXPECT_EQ(raw[0]->get_tensors_calls, 1);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("fetched from fake:1"), std::string::npos) << log.back();
  // A "restart": a fresh backend, the same cache directory.
  FakeBackend fresh;
  Recorded r;
  ASSERT_TRUE(
      ScoreRunner(&fresh, pool.get(), o).Run(FiveTokenPrompts(), Record(r), cancelled).ok());
  EXPECT_EQ(raw[0]->get_tensors_calls, 1);
  EXPECT_NE(log.back().find("from the cache"), std::string::npos) << log.back();
  EXPECT_EQ(fresh.head_shape, (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(fresh.head_first_byte,
            static_cast<std::byte>(7 + std::string("lm_head.weight").size()));

  // A corrupted cache file is noticed and the head fetched again.
  for (const auto& e : fs::directory_iterator(cache / "tensors")) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  FakeBackend third;
  ASSERT_TRUE(
      ScoreRunner(&third, pool.get(), o).Run(FiveTokenPrompts(), Record(r), cancelled).ok());
  EXPECT_EQ(raw[0]->get_tensors_calls, 2);
  fs::remove_all(cache);
}

TEST(ScoreRunner, LocalCheckpointHead) {
  const fs::path dir = TempDir("ckpt");
  WriteText(dir / "config.json",
            R"({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "vocab_size": 16,
                "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 3,
                "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 4,
                "tie_word_embeddings": true})");
  std::vector<float> embed(16 * 4, 0.5f);
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(embed.data()),
                                   embed.size() * 4);
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(),
                               {{"model.embed_tokens.weight", DType::kF32, {16, 4}, bytes}})
                  .ok());
  auto head = LoadCheckpointTargetHead(dir.string(), FakeContract());
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->embed_tokens.shape, (std::vector<int64_t>{16, 4}));
  EXPECT_EQ(head->lm_head.bytes.data(), head->embed_tokens.bytes.data());  // tied
  auto wrong = LoadCheckpointTargetHead(dir.string(), FakeContract(36));
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("num_layers: checkpoint has 3, extractor serves 36"),
            std::string::npos)
      << wrong.status();

  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, &raw));
  ScoreRunnerOptions o;
  o.head.target_checkpoint = dir.string();
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  ASSERT_TRUE(
      ScoreRunner(&backend, pool.get(), o).Run(FiveTokenPrompts(), Record(r), cancelled).ok());
  EXPECT_EQ(raw[0]->get_tensors_calls, 0);
  EXPECT_EQ(backend.heads_set, 1);
  fs::remove_all(dir);
}

TEST(ScoreRunner, CancelledJobStops) {
  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(2, &raw));
  for (FakeEndpoint* e : raw) e->delay_ms = 20;
  FakeBackend backend;
  std::atomic<bool> cancelled{false};
  ScoreEvents e;
  int prompts = 0;
  e.on_prompt = [&](const PromptScore&) {
    if (++prompts == 2) cancelled = true;
  };
  ScoreSpec spec = FiveTokenPrompts();
  for (int i = 0; i < 50; ++i) spec.prompts.push_back(InputSequence::Tokens({1}));
  absl::Status s = ScoreRunner(&backend, pool.get(), {}).Run(spec, e, cancelled);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(prompts, 2);
  EXPECT_LE(raw[0]->generate_calls + raw[1]->generate_calls, 2 + 2 * 2);  // in flight + prefetched
}

// --- retries and the results journal ------------------------------------------------------------

// Fails its first `failures` Generate calls with `error`, then answers like FakeEndpoint.
class FlakyEndpoint : public FakeEndpoint {
 public:
  FlakyEndpoint(std::string address, int failures, absl::Status error)
      : FakeEndpoint(std::move(address)), failures_(failures), error_(std::move(error)) {}
  absl::StatusOr<GenerateReply> Generate(const GenerateParams& p) override {
    if (failures_.fetch_sub(1) > 0) {
      ++failed_calls;
      return error_;
    }
    return FakeEndpoint::Generate(p);
  }
  std::atomic<int> failed_calls{0};

 private:
  std::atomic<int> failures_;
  absl::Status error_;
};

ScoreRunnerOptions FastRetries(int attempts) {
  ScoreRunnerOptions o;
  o.fetch.retry.max_attempts = attempts;
  o.fetch.retry.initial_backoff_s = 0.001;
  o.fetch.retry.max_backoff_s = 0.004;
  return o;
}

AcceptanceSummary Uninterrupted() {
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, nullptr));
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  EXPECT_TRUE(
      ScoreRunner(&backend, pool.get(), {}).Run(FiveTokenPrompts(), Record(r), cancelled).ok());
  return r.summary;
}

void ExpectSameSummary(const AcceptanceSummary& a, const AcceptanceSummary& b) {
  EXPECT_EQ(a.responses, b.responses);
  EXPECT_EQ(a.steps, b.steps);
  EXPECT_EQ(a.histogram, b.histogram);
  EXPECT_EQ(a.num_accepted_tokens_per_pos, b.num_accepted_tokens_per_pos);
  EXPECT_DOUBLE_EQ(a.tau_mean_of_means, b.tau_mean_of_means);
  EXPECT_DOUBLE_EQ(a.tau_pooled, b.tau_pooled);
}

TEST(ExtractorRetryPolicy, BackoffGrowsToItsCap) {
  ExtractorRetryPolicy p;
  EXPECT_DOUBLE_EQ(p.Backoff(1), 0.1);
  EXPECT_DOUBLE_EQ(p.Backoff(2), 0.2);
  EXPECT_DOUBLE_EQ(p.Backoff(10), 2.0);
  EXPECT_TRUE(IsRetryableExtractorError(absl::UnavailableError("Socket closed")));
  EXPECT_TRUE(IsRetryableExtractorError(absl::AbortedError("x")));
  EXPECT_FALSE(IsRetryableExtractorError(absl::InvalidArgumentError("x")));
  EXPECT_FALSE(IsRetryableExtractorError(absl::DataLossError("crc")));
  EXPECT_FALSE(IsRetryableExtractorError(absl::CancelledError("x")));
}

TEST(ScoreRunner, UnavailableGenerateIsRetriedAndTheSummaryIsUnchanged) {
  std::vector<std::unique_ptr<ExtractorEndpoint>> eps;
  auto flaky =
      std::make_unique<FlakyEndpoint>("fake:1", 3, absl::UnavailableError("Socket closed"));
  FlakyEndpoint* raw = flaky.get();
  eps.push_back(std::move(flaky));
  auto pool = ExtractorPool::FromEndpoints(std::move(eps));
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  std::vector<std::string> log;
  ScoreRunnerOptions o = FastRetries(6);
  o.log = [&](const std::string& l) { log.push_back(l); };
  absl::Status s =
      ScoreRunner(&backend, pool.get(), o).Run(FiveTokenPrompts(), Record(r), cancelled);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(raw->failed_calls, 3);
  EXPECT_EQ(raw->generate_calls, 5);
  EXPECT_EQ(r.prompts.size(), 5u);
  ExpectSameSummary(r.summary, Uninterrupted());
  bool logged = false;
  for (const std::string& l : log) {
    logged |= l.find("prompt 0: Generate on fake:1 failed (attempt 1 of 6 there), retrying") !=
              std::string::npos;
  }
  EXPECT_TRUE(logged);
}

TEST(ScoreRunner, AnotherExtractorTakesTheFailedPrompts) {
  std::vector<std::unique_ptr<ExtractorEndpoint>> eps;
  auto dead = std::make_unique<FlakyEndpoint>("fake:dead", 1 << 20,
                                              absl::UnavailableError("connection refused"));
  FlakyEndpoint* dead_raw = dead.get();
  eps.push_back(std::move(dead));
  auto alive = std::make_unique<FakeEndpoint>("fake:alive");
  alive->delay_ms = 20;  // the dead one gets prompts too
  eps.push_back(std::move(alive));
  auto pool = ExtractorPool::FromEndpoints(std::move(eps));
  FakeBackend backend;
  Recorded r;
  std::atomic<bool> cancelled{false};
  absl::Status s = ScoreRunner(&backend, pool.get(), FastRetries(4))
                       .Run(FiveTokenPrompts(), Record(r), cancelled);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_GE(dead_raw->failed_calls, 1);
  ExpectSameSummary(r.summary, Uninterrupted());
}

TEST(ScoreRunner, RetryBudgetAndPermanentErrors) {
  std::atomic<bool> cancelled{false};
  FakeBackend backend;
  Recorded r;
  {
    std::vector<std::unique_ptr<ExtractorEndpoint>> eps;
    auto e = std::make_unique<FlakyEndpoint>("fake:1", 1 << 20, absl::UnavailableError("gone"));
    FlakyEndpoint* raw = e.get();
    eps.push_back(std::move(e));
    auto pool = ExtractorPool::FromEndpoints(std::move(eps));
    absl::Status s = ScoreRunner(&backend, pool.get(), FastRetries(3))
                         .Run(FiveTokenPrompts(), Record(r), cancelled);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("failed 3 times, the retry budget): gone"), std::string::npos) << s;
    EXPECT_LE(raw->failed_calls, 3 * 5);
  }
  {
    std::vector<std::unique_ptr<ExtractorEndpoint>> eps;
    auto e = std::make_unique<FlakyEndpoint>(
        "fake:1", 1 << 20, absl::InvalidArgumentError("max_new_tokens: too many"));
    FlakyEndpoint* raw = e.get();
    eps.push_back(std::move(e));
    auto pool = ExtractorPool::FromEndpoints(std::move(eps));
    absl::Status s = ScoreRunner(&backend, pool.get(), FastRetries(3))
                         .Run(FiveTokenPrompts(), Record(r), cancelled);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().find("retry"), std::string::npos) << s;
    // The first prompt, one prefetched, and one more while the job stops; none retried.
    EXPECT_LE(raw->failed_calls, 3);
  }
}

TEST(ResultsJournal, KeepsLinesOfItsKeyAndCutsATornLine) {
  const fs::path dir = TempDir("journal");
  const std::string path = (dir / "job.jsonl").string();
  PromptScore a;
  a.prompt_index = 3;
  a.acceptance.step_lengths = {1, 4, 2};
  a.acceptance.ddtree_step_lengths[8] = {2, 4};
  a.acceptance.prompt_tokens = 5;
  a.acceptance.completion_tokens = 7;
  a.acceptance.predicted = PredictedAcceptance{{0, 3, 1}, {{0.5f}, {0.25f, 0.75f, 1.0f}, {}}, {}};
  a.acceptance.predicted->cut_step_lengths[0.3] = {1, 2, 2, 1};
  a.finish_reason = "max_new_tokens";
  {
    auto j = ResultsJournal::Open(path, "key-1");
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_TRUE((*j)->completed().empty());
    ASSERT_TRUE((*j)->Append(a).ok());
  }
  {
    std::ofstream out(path, std::ios::app);
    out << "{\"key\": \"key-1\", \"prompt_index\": 4, \"step_le";  // torn
  }
  {
    auto j = ResultsJournal::Open(path, "key-1");
    ASSERT_TRUE(j.ok()) << j.status();
    ASSERT_EQ((*j)->completed().size(), 1u);
    const PromptScore& b = (*j)->completed().at(3);
    EXPECT_TRUE(b.resumed);
    EXPECT_EQ(b.acceptance.step_lengths, a.acceptance.step_lengths);
    EXPECT_EQ(b.acceptance.ddtree_step_lengths, a.acceptance.ddtree_step_lengths);
    EXPECT_EQ(b.acceptance.prompt_tokens, 5);
    EXPECT_EQ(b.acceptance.completion_tokens, 7);
    ASSERT_TRUE(b.acceptance.predicted.has_value());
    EXPECT_EQ(b.acceptance.predicted->accepted, a.acceptance.predicted->accepted);
    EXPECT_EQ(b.acceptance.predicted->predicted, a.acceptance.predicted->predicted);
    EXPECT_EQ(b.acceptance.predicted->cut_step_lengths, a.acceptance.predicted->cut_step_lengths);
    EXPECT_EQ(b.finish_reason, "max_new_tokens");
    EXPECT_DOUBLE_EQ(b.tau, 7.0 / 3);
    EXPECT_EQ((*j)->ignored_lines(), 1);
    a.prompt_index = 4;
    ASSERT_TRUE((*j)->Append(a).ok());  // on a line of its own after the cut
  }
  auto j = ResultsJournal::Open(path, "key-1");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ((*j)->completed().size(), 2u);
  EXPECT_EQ((*j)->ignored_lines(), 0);
  auto other = ResultsJournal::Open(path, "key-2");  // a changed job: nothing reused
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE((*other)->completed().empty());
  EXPECT_EQ((*other)->ignored_lines(), 2);
  fs::remove_all(dir);
}

TEST(ScoreRunner, ResumesFromTheResultsJournal) {
  const fs::path dir = TempDir("resume");
  fs::create_directories(dir / "drafter");
  WriteText(dir / "drafter" / "config.json", "{}");
  ScoreSpec spec = FiveTokenPrompts();
  spec.drafter_path = (dir / "drafter").string();
  spec.job_id = "job-1";
  ScoreRunnerOptions o;
  o.journal.results_dir = (dir / "results").string();
  std::vector<FakeEndpoint*> raw;
  auto pool = ExtractorPool::FromEndpoints(Endpoints(1, &raw));
  FakeBackend backend;
  std::atomic<bool> cancelled{false};
  Recorded first;
  ASSERT_TRUE(ScoreRunner(&backend, pool.get(), o).Run(spec, Record(first), cancelled).ok());
  EXPECT_EQ(raw[0]->generate_calls, 5);
  ASSERT_TRUE(fs::exists(dir / "results" / "job-1.jsonl"));

  Recorded again;
  ASSERT_TRUE(ScoreRunner(&backend, pool.get(), o).Run(spec, Record(again), cancelled).ok());
  EXPECT_EQ(raw[0]->generate_calls, 5);  // nothing fetched again
  ASSERT_EQ(again.prompts.size(), 5u);
  for (const PromptScore& p : again.prompts) EXPECT_TRUE(p.resumed);
  ExpectSameSummary(again.summary, first.summary);

  // A changed drafter file changes the key: everything is scored again.
  WriteText(dir / "drafter" / "config.json", "{\"changed\": true}");
  Recorded changed;
  ASSERT_TRUE(ScoreRunner(&backend, pool.get(), o).Run(spec, Record(changed), cancelled).ok());
  EXPECT_EQ(raw[0]->generate_calls, 10);
  for (const PromptScore& p : changed.prompts) EXPECT_FALSE(p.resumed);
  fs::remove_all(dir);
}

TEST(ValidateSpec, JobId) {
  ScoreLimits o;
  ScoreSpec s = FiveTokenPrompts();
  for (const char* bad : {"../x", "a/b", "..", "sp ace"}) {
    s.job_id = bad;
    absl::Status v = ValidateSpec(s, o);
    EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(v.message().find("job_id"), std::string::npos) << v;
  }
  s.job_id = std::string(129, 'a');
  EXPECT_EQ(ValidateSpec(s, o).code(), absl::StatusCode::kInvalidArgument);
  s.job_id = "eval-2026.11_step-1200";
  EXPECT_TRUE(ValidateSpec(s, o).ok());
}

}  // namespace
}  // namespace specwire

namespace specwire {
namespace {

TEST(ValidateSpec, TextPromptBytes) {
  ScoreLimits o;
  o.max_text_bytes = 16;
  ScoreSpec s;
  s.drafter_path = "/d";
  s.prompts = {InputSequence::Text("short"), InputSequence::Text(std::string(17, 'x'))};
  absl::Status v = ValidateSpec(s, o);
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(v.message().find("prompts[1].text: 17 bytes exceed the limit of 16 (--max_text_bytes)"),
            std::string::npos)
      << v;
  s.prompts.pop_back();
  EXPECT_TRUE(ValidateSpec(s, o).ok());
}

}  // namespace
}  // namespace specwire
