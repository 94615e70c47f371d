#include "services/scorer/report/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "nlohmann/json.hpp"
#include "services/scorer/report/reconcile_command.h"
#include "services/scorer/job/scorer_test_fakes.h"

namespace specwire {
namespace {

using json = nlohmann::json;

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A three-prompt report, block size 4, DDTree budgets 4 and 16.
ScoreReport SampleReport() {
  std::vector<ResponseAcceptance> rs(3);
  rs[0].step_lengths = {1, 4, 2, 3};
  rs[0].ddtree_step_lengths = {{4, {2, 4, 4}}, {16, {4, 4, 2}}};
  rs[1].step_lengths = {1, 1, 1};
  rs[1].ddtree_step_lengths = {{4, {2, 1}}, {16, {3}}};
  rs[2].step_lengths = {4, 4};
  rs[2].ddtree_step_lengths = {{4, {4, 4}}, {16, {4, 4}}};
  ScoreReport r;
  r.mode = "in-process";
  r.endpoint = "127.0.0.1:5001";
  r.extractors = {"127.0.0.1:5001"};
  r.drafter_path = "/drafters/<tiny&co>";
  r.max_new_tokens = 10;
  r.ddtree_budgets = {4, 16};
  r.labels = {"<tiny&co>", "gsm8k", "dflash"};
  r.contract = testing::FakeContract();
  r.drafter = testing::FakeDrafter(r.drafter_path);
  r.drafter_loaded = true;
  for (size_t i = 0; i < rs.size(); ++i) {
    rs[i].prompt_tokens = 5;
    rs[i].completion_tokens = 10;
    PromptScore p;
    p.prompt_index = static_cast<int64_t>(i);
    p.acceptance = rs[i];
    p.tau = MeanStepLength(rs[i].step_lengths);
    p.finish_reason = "max_new_tokens";
    r.prompts.push_back(p);
  }
  r.summary = Summarize(rs, 4);
  r.seconds = 1.5;
  r.created = "2026-01-01T00:00:00Z";
  return r;
}

TEST(ReportHtml, SelfContainedWithEveryChart) {
  const std::string html = ReportToHtml(SampleReport());
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>\n<html lang=\"en\">"));
  EXPECT_TRUE(html.ends_with("</html>\n"));
  EXPECT_EQ(Count(html, "<svg "), 5u);
  EXPECT_EQ(Count(html, "</svg>"), 5u);
  for (const char* id :
       {"id=\"per-position-acceptance\"", "id=\"tau-histogram\"", "id=\"ddtree-budget-curve\"",
        "id=\"tau-by-token-window\"", "id=\"capacity-speedup\""}) {
    EXPECT_EQ(Count(html, id), 1u) << id;
  }
  // Nothing fetched from elsewhere: no scripts, stylesheets, images or links.
  for (const char* banned : {"<script", "<link", "<img", "src=", "href=", "@import", "url("}) {
    EXPECT_EQ(html.find(banned), std::string::npos) << banned;
  }
  // Balanced structure.
  for (const char* tag : {"section", "table", "tr", "figure", "figcaption", "svg", "details", "pre",
                          "head", "body", "style", "title"}) {
    EXPECT_EQ(Count(html, absl::StrCat("<", tag, ">")) + Count(html, absl::StrCat("<", tag, " ")),
              Count(html, absl::StrCat("</", tag, ">")))
        << tag;
  }
  // User-controlled text is escaped.
  EXPECT_EQ(html.find("<tiny&co>"), std::string::npos);
  EXPECT_NE(html.find("&lt;tiny&amp;co&gt;"), std::string::npos);
  EXPECT_EQ(html.find("nan"), std::string::npos);
  EXPECT_NE(html.find(testing::FakeContract().weights_digest), std::string::npos);
}

TEST(ReportHtml, ChartsHaveOneMarkPerValue) {
  const AcceptanceSummary s = SampleReport().summary;
  const std::string pos = PerPositionSvg(s);
  EXPECT_EQ(Count(pos, "<rect class=\"bar\""), 3u);  // positions 1..B-1
  const std::string hist = TauHistogramSvg(s);
  EXPECT_EQ(Count(hist, "<rect class=\"bar\""), 4u);  // lengths 1..B
  EXPECT_NE(hist.find("length 4: 3 steps (33.3%)"), std::string::npos) << hist;
  const std::string dd = DDTreeCurveSvg(s);
  EXPECT_EQ(Count(dd, "<circle class=\"point\""), 2u);
  EXPECT_EQ(Count(dd, "<polyline"), 1u);
  EXPECT_EQ(Count(dd, "class=\"dflash\""), 1u);
  EXPECT_NE(dd.find("DDTree-16"), std::string::npos);
}

TEST(ReportHtml, EmptyJobRenders) {
  ScoreReport r;
  r.summary = Summarize({}, 16);
  const std::string html = ReportToHtml(r);
  EXPECT_EQ(Count(html, "<svg "), 3u);
  EXPECT_NE(html.find("no tree budgets scored"), std::string::npos);
  EXPECT_EQ(html.find("nan"), std::string::npos);
  EXPECT_EQ(html.find("inf"), std::string::npos);
}

TEST(ReportJson, EverySummaryFieldStepsContractAndDrafterConfig) {
  const ScoreReport r = SampleReport();
  json j = json::parse(ReportToJson(r));
  const json summary = json::parse(AcceptanceSummaryToJson(r.summary));
  EXPECT_EQ(j["summary"], summary);
  for (const char* key :
       {"tau_mean_of_means", "tau_pooled", "histogram", "per_position_acceptance", "num_drafts",
        "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos", "acceptance_rate",
        "ddtree_tau", "block_size", "responses", "steps"}) {
    EXPECT_TRUE(j["summary"].contains(key)) << key;
  }
  ASSERT_EQ(j["prompts"].size(), 3u);
  EXPECT_EQ(j["prompts"][0]["step_lengths"], json({1, 4, 2, 3}));
  EXPECT_EQ(j["prompts"][0]["ddtree_step_lengths"]["16"], json({4, 4, 2}));
  EXPECT_EQ(j["prompts"][1]["tau"], 1.0);
  EXPECT_EQ(j["contract"]["num_layers"], 3);
  EXPECT_EQ(j["contract"]["weights_digest"], r.contract.weights_digest);
  EXPECT_EQ(j["drafter"]["config"]["dflash_config"]["mask_token_id"], 15);  // parsed config.json
  EXPECT_EQ(j["drafter"]["target_layer_ids"], json({0, 2}));
  EXPECT_EQ(j["labels"]["drafter"], "<tiny&co>");
  EXPECT_EQ(j["request"]["ddtree_budgets"], json({4, 16}));
}

TEST(SummaryTable, TauDDTreeAndPositions) {
  const std::string t = SummaryTable(SampleReport());
  EXPECT_NE(t.find("tau (mean of means)"), std::string::npos) << t;
  EXPECT_NE(t.find("tau (pooled)"), std::string::npos);
  EXPECT_NE(t.find("DDTree-4 tau"), std::string::npos);
  EXPECT_NE(t.find("DDTree-16 tau"), std::string::npos);
  EXPECT_NE(t.find("pos  1"), std::string::npos);
  EXPECT_NE(t.find("pos  3"), std::string::npos);
  EXPECT_EQ(t.find("pos  4"), std::string::npos);
}

// Both compute dtypes in every report; a pair that differs is said in the table, the JSON and
// the HTML; a report made through the scorer service (the drafter not loaded here) still has
// the drafter's dtype it was told.
TEST(Report, BothComputeDtypesAndANoteWhenTheyDiffer) {
  ScoreReport same = SampleReport();
  EXPECT_EQ(SummaryTable(same).find("note:"), std::string::npos);
  auto js = nlohmann::json::parse(ReportToJson(same));
  EXPECT_EQ(js["settings"]["target_dtype"], "float32");
  EXPECT_EQ(js["settings"]["drafter_dtype"], "float32");
  EXPECT_EQ(js["settings"]["dtype_note"], "");

  ScoreReport r = SampleReport();
  r.contract.compute_dtype = "bfloat16";
  r.drafter_loaded = false;  // as the scorer service reports it: what the wire carries
  r.drafter = DrafterSpec{};
  r.drafter.method = "dflash";
  r.drafter.dtype = "float32";
  r.drafter.device = "cpu";
  const std::string t = SummaryTable(r);
  EXPECT_NE(t.find("dtype bfloat16 target / float32 drafter"), std::string::npos) << t;
  EXPECT_NE(t.find("note: the target computes in bfloat16"), std::string::npos) << t;
  auto j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["settings"]["target_dtype"], "bfloat16");
  EXPECT_EQ(j["settings"]["drafter_dtype"], "float32");
  EXPECT_NE(j["settings"]["dtype_note"].get<std::string>().find("float32"), std::string::npos);
  EXPECT_EQ(j["drafter"]["dtype"], "float32");
  const std::string html = ReportToHtml(r);
  EXPECT_NE(html.find("float32 / cpu"), std::string::npos);
  EXPECT_NE(html.find("the target computes in bfloat16"), std::string::npos);
}

// An EAGLE-3 job's budgets are EAGLE's top-k tree: named so in every table and chart, carried
// through the JSON summary, and costed at one drafter forward per level.
TEST(Report, EagleTreeIsNamedAndCosted) {
  ScoreReport r = SampleReport();
  r.drafter.method = "eagle3";
  r.summary.tree_method = kTreeEagle;
  r.summary.tree_depth = 3;
  r.summary.tree_top_k = 2;
  const std::string t = SummaryTable(r);
  EXPECT_NE(t.find("EAGLE-tree-4 tau"), std::string::npos) << t;
  EXPECT_EQ(t.find("DDTree"), std::string::npos) << t;
  const std::string html = ReportToHtml(r);
  EXPECT_NE(html.find("EAGLE tree (depth 3, top-k 2): τ by node budget"), std::string::npos);
  EXPECT_NE(html.find("<th>EAGLE-tree-16 τ</th>"), std::string::npos);
  EXPECT_EQ(html.find("DDTree-"), std::string::npos);
  auto back = AcceptanceSummaryFromJson(AcceptanceSummaryToJson(r.summary));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tree_method, kTreeEagle);
  EXPECT_EQ(back->tree_depth, 3);
  EXPECT_EQ(back->tree_top_k, 2);
  // Chains and trees of an autoregressive drafter: k drafts cost k drafter forwards, a tree its
  // depth, whatever --plan_autoregressive says.
  const CapacityPlan plan = ReportCapacity(r);
  ASSERT_EQ(plan.draft_lengths.size(), 3u);
  EXPECT_TRUE(plan.options.autoregressive);
  EXPECT_DOUBLE_EQ(plan.draft_lengths[2].step_cost, 1 + 0.01 * 3 + 0.1 * 3);
  ASSERT_EQ(plan.tree_budgets.size(), 2u);
  EXPECT_DOUBLE_EQ(plan.tree_budgets[1].step_cost, 1 + 0.01 * 16 + 0.1 * 3);
  // A summary written before trees were named reads as DDTree.
  nlohmann::json j = nlohmann::json::parse(AcceptanceSummaryToJson(SampleReport().summary));
  j.erase("tree");
  auto old = AcceptanceSummaryFromJson(j.dump());
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->tree_method, kTreeDDTree);
}

// A response whose first completion token is a stop token has no steps: no τ (null, "no steps"),
// left out of the means; positions no step reached are "no data", never 0.
TEST(ReportJson, AResponseWithoutStepsAndUnreachedPositions) {
  ScoreReport r = SampleReport();
  std::vector<ResponseAcceptance> rs(2);
  rs[0].step_lengths = {1, 2, 1};  // position 2 reached once, position 3 never
  r.prompts.resize(2);
  r.prompts[0].acceptance = rs[0];
  r.prompts[0].tau = MeanStepLength(rs[0].step_lengths);
  r.prompts[1].prompt_index = 1;
  r.prompts[1].acceptance = rs[1];
  r.prompts[1].finish_reason = "stop_token";
  r.summary = Summarize(rs, 4);
  const json j = json::parse(ReportToJson(r));
  EXPECT_TRUE(j["prompts"][1]["tau"].is_null());
  EXPECT_DOUBLE_EQ(j["prompts"][0]["tau"].get<double>(), 4.0 / 3);
  EXPECT_DOUBLE_EQ(j["summary"]["tau_mean_of_means"].get<double>(), 4.0 / 3);
  EXPECT_EQ(j["summary"]["per_position_reached"], json::parse("[3, 1, 0]"));
  EXPECT_TRUE(j["summary"]["per_position_acceptance"][2].is_null());
  const std::string table = SummaryTable(r);
  EXPECT_NE(table.find("pos  3  no data (0 / 0)"), std::string::npos) << table;
  EXPECT_NE(table.find("pos  2  0.0000  (0 / 1)"), std::string::npos) << table;
  const std::string html = ReportToHtml(r);
  EXPECT_NE(html.find("no steps"), std::string::npos);
  EXPECT_NE(html.find("no data"), std::string::npos);
  // Every τ line of the table names its settings.
  EXPECT_NE(table.find("settings: max_new_tokens 10, block size 4"), std::string::npos) << table;
}

// specwire-score --reconcile: the flags onto the reconciliation's options.
TEST(ReconcileCommand, MapsTheFlagsAndPassesTheRestAsIs) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sw-reconcile-map";
  std::filesystem::create_directories(dir);
  ReconcileRequest r;
  r.served_dir = dir.string();
  r.drafter = "d";
  r.target = "t";
  auto got = ReconcileArguments(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"--served", dir.string(), "--drafter", "d",
                                             "--target", "t"}));
  r.extractor = "127.0.0.1:1";
  r.prompts_file = "p.json";
  r.max_tokens = 48;
  r.bootstrap_resamples = 0;
  r.bootstrap_seed = 7;
  r.json_out = "r.json";
  r.html_out = "r.html";
  r.score_binary = "/b/specwire-score";
  r.replay_binary = "/b/specwire-replay";
  r.passthrough = {"--diagnose", "always", "--metrics_after=a.prom"};
  got = ReconcileArguments(r);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{
                      "--served", dir.string(), "--drafter", "d", "--target", "t",
                      "--extractor", "127.0.0.1:1", "--prompts", "p.json", "--max_tokens", "48",
                      "--bootstrap_resamples", "0", "--seed", "7", "--json", "r.json", "--html",
                      "r.html", "--score", "/b/specwire-score", "--replay", "/b/specwire-replay",
                      "--diagnose", "always", "--metrics_after=a.prom"}));
  std::filesystem::remove_all(dir);
}

TEST(ReconcileCommand, RefusesNamingTheFlag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "sw-reconcile-bad";
  std::filesystem::create_directories(dir);
  ReconcileRequest ok;
  ok.served_dir = dir.string();
  ok.drafter = "d";
  ok.target = "t";
  struct Case {
    std::function<void(ReconcileRequest&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](ReconcileRequest& r) { r.drafter.clear(); }, "--reconcile needs --drafter"},
      {[](ReconcileRequest& r) { r.target.clear(); }, "--reconcile needs --target_checkpoint"},
      {[](ReconcileRequest& r) { r.served_dir += "/missing"; }, "/missing\": not a directory"},
      {[](ReconcileRequest& r) { r.passthrough = {"--json=x"}; },
       "--json after \"--\" is given by specwire-score's --json_out"},
      {[](ReconcileRequest& r) { r.passthrough = {"--target", "x"}; },
       "--target after \"--\" is given by specwire-score's --target_checkpoint"},
      {[](ReconcileRequest& r) { r.passthrough = {"--served", "x"}; }, "--reconcile"},
      {[](ReconcileRequest& r) { r.passthrough = {"--replay=x"}; },
       "--replay after \"--\": specwire-score runs itself"},
  };
  for (const Case& c : cases) {
    ReconcileRequest r = ok;
    c.change(r);
    const auto got = ReconcileArguments(r);
    ASSERT_FALSE(got.ok()) << c.message;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(c.message), std::string::npos) << got.status();
  }
  // --drive records into the directory: it need not exist yet.
  ReconcileRequest drive = ok;
  drive.served_dir = (dir / "new").string();
  drive.passthrough = {"--drive", "http://127.0.0.1:1", "--served_model", "m"};
  EXPECT_TRUE(ReconcileArguments(drive).ok());
  std::filesystem::remove_all(dir);
}

TEST(ReconcileCommand, PythonCandidatesAndTheirRefusal) {
  // $SPECWIRE_PYTHON alone when set.
  EXPECT_EQ(ReconcilePythonCandidates("/x/build/services/scorer/specwire-score", "/opt/py",
                                      "/usr/bin"),
            std::vector<std::string>{"/opt/py"});
  // Else the checkout's virtualenv above the binary, then PATH.
  const std::filesystem::path root = std::filesystem::temp_directory_path() / "sw-reconcile-py";
  std::filesystem::create_directories(root / ".venv" / "bin");
  std::filesystem::create_directories(root / "build" / "services" / "scorer");
  std::filesystem::create_directories(root / "path");
  for (const auto& p : {root / ".venv" / "bin" / "python", root / "path" / "python3"}) {
    std::ofstream(p) << "#!/bin/sh\nexit 1\n";
    std::filesystem::permissions(p, std::filesystem::perms::owner_all);
  }
  const std::vector<std::string> got = ReconcilePythonCandidates(
      (root / "build" / "services" / "scorer" / "specwire-score").string(), nullptr,
      (root / "path").c_str());
  EXPECT_EQ(got, (std::vector<std::string>{(root / ".venv" / "bin" / "python").string(),
                                           (root / "path" / "python3").string()}));
  // Neither imports the client (both exit 1): refused naming both and the way out.
  const auto found = FindReconcilePython(got);
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(found.status().message().find(got[0] + ", " + got[1]), std::string::npos);
  EXPECT_NE(found.status().message().find("SPECWIRE_PYTHON"), std::string::npos);
  EXPECT_FALSE(FindReconcilePython({(root / "absent").string()}).ok());
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace specwire
