// The Scorer service on an in-process loopback server, over the fakes (no torch, no weights).
#include "services/scorer/server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <filesystem>
#include <fstream>

#include "services/scorer/job/scorer_test_fakes.h"

namespace specwire {
namespace {

using testing::FakeBackend;
using testing::FakeDrafter;
using testing::FakeEndpoint;

struct Harness {
  explicit Harness(int64_t max_queue = 4, int delay_ms = 0, DrafterSpec drafter = FakeDrafter(),
                   ScoreLimits limits = ScoreLimits())
      : backend(std::move(drafter)) {
    std::vector<std::unique_ptr<ExtractorEndpoint>> eps;
    auto e = std::make_unique<FakeEndpoint>("fake:1");
    e->delay_ms = delay_ms;
    endpoint = e.get();
    eps.push_back(std::move(e));
    pool = ExtractorPool::FromEndpoints(std::move(eps));
    ScoreRunnerOptions options;
    options.limits = limits;
    runner = std::make_unique<ScoreRunner>(&backend, pool.get(), options);
    worker = std::make_unique<ScoreWorker>(runner.get(), max_queue, &metrics);
    service = std::make_unique<ScorerService>(worker.get(), &metrics, limits);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service.get());
    server = b.BuildAndStart();
    stub = v1::Scorer::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  ~Harness() {
    worker->Shutdown();
    server->Shutdown();
  }

  struct Stream {
    std::vector<v1::ScoreResponse> messages;
    grpc::Status status;
  };
  Stream Score(const v1::ScoreRequest& req, int cancel_after = -1) {
    grpc::ClientContext ctx;
    auto reader = stub->Score(&ctx, req);
    Stream s;
    v1::ScoreResponse m;
    while (reader->Read(&m)) {
      s.messages.push_back(m);
      if (static_cast<int>(s.messages.size()) == cancel_after) ctx.TryCancel();
    }
    s.status = reader->Finish();
    return s;
  }
  std::string Metrics() {
    return prometheus::TextSerializer().Serialize(metrics.registry()->Collect());
  }
  // The metrics once `sample` shows up (OnDone, which counts the request, may run just after the
  // client saw the status).
  std::string MetricsWith(const std::string& sample) {
    for (int i = 0; i < 200; ++i) {
      std::string text = Metrics();
      if (text.find(sample) != std::string::npos) return text;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Metrics();
  }

  FakeBackend backend;
  FakeEndpoint* endpoint = nullptr;
  std::unique_ptr<ExtractorPool> pool;
  std::unique_ptr<ScoreRunner> runner;
  ScorerMetrics metrics;
  std::unique_ptr<ScoreWorker> worker;
  std::unique_ptr<ScorerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Scorer::Stub> stub;
};

v1::ScoreRequest Request(int prompts = 3) {
  v1::ScoreRequest r;
  r.set_drafter_path("/drafters/tiny");
  for (int i = 0; i < prompts; ++i) {
    auto* ids = r.add_prompts()->mutable_tokens();
    ids->add_ids(i % 10);
    ids->add_ids(i % 10 + 2);
  }
  r.set_max_new_tokens(9);
  r.add_ddtree_budgets(8);
  r.set_dataset_label("unit");
  return r;
}

TEST(ScorerService, StreamsContractProgressResultsThenSummary) {
  Harness h;
  auto s = h.Score(Request(3));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_EQ(s.messages.size(), 1 + 1 + 3 * 2 + 1u);
  EXPECT_TRUE(s.messages[0].has_contract());
  EXPECT_EQ(s.messages[0].contract().num_layers(), 3);
  ASSERT_TRUE(s.messages[1].has_progress());
  EXPECT_EQ(s.messages[1].progress().prompts_done(), 0u);
  EXPECT_EQ(s.messages[1].progress().prompts_total(), 3u);
  std::vector<ResponseAcceptance> results;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(s.messages[2 + 2 * i].has_result());
    ASSERT_TRUE(s.messages[3 + 2 * i].has_progress());
    EXPECT_EQ(s.messages[3 + 2 * i].progress().prompts_done(), i + 1u);
    const PromptScore p = PromptScoreFromProto(s.messages[2 + 2 * i].result());
    EXPECT_EQ(p.acceptance.completion_tokens, 9);
    EXPECT_EQ(p.acceptance.ddtree_step_lengths.count(8), 1u);
    results.resize(std::max<size_t>(results.size(), p.prompt_index + 1));
    results[p.prompt_index] = p.acceptance;
  }
  ASSERT_TRUE(s.messages.back().has_summary());
  // The summary on the wire is acceptance.h's, field for field.
  EXPECT_EQ(AcceptanceSummaryToJson(SummaryFromProto(s.messages.back().summary())),
            AcceptanceSummaryToJson(Summarize(results, 4)));

  const std::string text = h.MetricsWith("specwire_scorer_requests_total{code=\"OK\"");
  const AcceptanceSummary sum = Summarize(results, 4);
  EXPECT_NE(text.find(absl::StrCat("specwire_spec_decode_num_drafts_total{dataset=\"unit\",drafter="
                                   "\"tiny\",method=\"dflash\"} ",
                                   sum.num_drafts)),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("specwire_spec_decode_num_accepted_tokens_per_pos_total{dataset=\"unit\","
                      "drafter=\"tiny\",method=\"dflash\",position=\"1\"}"),
            std::string::npos);
  EXPECT_NE(text.find("specwire_spec_decode_mean_acceptance_length{dataset=\"unit\",drafter="
                      "\"tiny\",kind=\"pooled\",method=\"dflash\"}"),
            std::string::npos);
  EXPECT_NE(text.find("specwire_spec_decode_ddtree_mean_acceptance_length{budget=\"8\""),
            std::string::npos);
  EXPECT_NE(text.find("specwire_scorer_requests_total{code=\"OK\",method=\"Score\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("specwire_scorer_prompts_scored_total{dataset=\"unit\",drafter=\"tiny\","
                      "method=\"dflash\"} 3"),
            std::string::npos);
}

TEST(ScorerService, ContractMismatchIsAFailedPreconditionBeforeAnyMessage) {
  DrafterSpec d = FakeDrafter();
  d.num_target_layers = 64;
  d.target_layer_ids = {1, 16, 31, 46, 61};
  Harness h(4, 0, d);
  auto s = h.Score(Request());
  EXPECT_EQ(s.status.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_NE(
      s.status.error_message().find("num_target_layers: drafter expects 64, extractor serves 3"),
      std::string::npos)
      << s.status.error_message();
  EXPECT_TRUE(s.messages.empty());
  EXPECT_EQ(h.endpoint->generate_calls, 0);
  const std::string sample =
      "specwire_scorer_requests_total{code=\"FAILED_PRECONDITION\",method=\"Score\"} 1";
  EXPECT_NE(h.MetricsWith(sample).find(sample), std::string::npos);
}

TEST(ScorerService, InvalidRequests) {
  Harness h;
  v1::ScoreRequest r = Request();
  r.clear_drafter_path();
  EXPECT_EQ(h.Score(r).status.error_code(), grpc::INVALID_ARGUMENT);
  r = Request();
  r.clear_prompts();
  EXPECT_EQ(h.Score(r).status.error_code(), grpc::INVALID_ARGUMENT);
  r = Request();
  r.set_dataset_path("/x.jsonl");
  EXPECT_EQ(h.Score(r).status.error_code(), grpc::INVALID_ARGUMENT);
  r = Request();
  r.add_ddtree_budgets(0);
  auto s = h.Score(r);
  EXPECT_EQ(s.status.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(s.status.error_message().find("ddtree_budgets[1]"), std::string::npos);
}

// A dataset longer than --max_prompts is refused after reading one prompt past the limit: the
// malformed line further down is never reached.
TEST(ScorerService, DatasetOverThePromptLimitIsRefusedWithoutReadingItAll) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "dataset_limit";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "long.jsonl").string();
  {
    std::ofstream f(path);
    for (int i = 0; i < 5; ++i) f << "{\"input_ids\": [1, 2, " << i << "]}\n";
    f << "this line is not JSON\n";
  }
  ScoreLimits options;
  options.max_prompts = 3;
  Harness h(4, 0, FakeDrafter(), options);
  v1::ScoreRequest r = Request();
  r.clear_prompts();
  r.set_dataset_path(path);
  auto s = h.Score(r);
  EXPECT_EQ(s.status.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(s.status.error_message().find("more than 3 prompts"), std::string::npos)
      << s.status.error_message();
  r.set_max_prompts(2);  // the request's own cap: the first two only
  auto ok = h.Score(r);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

TEST(ScorerService, QueueFullIsResourceExhausted) {
  Harness h(/*max_queue=*/0);
  auto s = h.Score(Request());
  EXPECT_EQ(s.status.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(s.messages.empty());
}

TEST(ScorerService, CancelStopsTheJobAndFreesTheWorker) {
  Harness h(4, /*delay_ms=*/30);
  auto s = h.Score(Request(40), /*cancel_after=*/3);  // contract, progress 0, first result
  EXPECT_EQ(s.status.error_code(), grpc::CANCELLED);
  // The worker takes the next job (the cancelled one stopped after the calls in flight).
  h.endpoint->delay_ms = 0;
  auto next = h.Score(Request(2));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_LT(h.endpoint->generate_calls, 40);
  const std::string sample =
      "specwire_scorer_requests_total{code=\"CANCELLED\",method=\"Score\"} 1";
  EXPECT_NE(h.MetricsWith(sample).find(sample), std::string::npos) << h.Metrics();
}

TEST(ScorerService, ProtoRoundTrips) {
  ScoreSpec spec;
  spec.drafter_path = "/d";
  spec.prompts = {InputSequence::Tokens({1, 2}), InputSequence::Text("hi")};
  spec.max_new_tokens = 7;
  spec.ddtree_budgets = {8, 32};
  spec.labels = {"a", "b", "c"};
  spec.max_prompts = 3;
  v1::ScoreRequest req;
  SpecToProto(spec, &req);
  ScoreSpec back = SpecFromProto(req);
  EXPECT_EQ(back.drafter_path, "/d");
  EXPECT_EQ(back.prompts[0].token_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(back.prompts[1].is_text);
  EXPECT_EQ(back.ddtree_budgets, (std::vector<int32_t>{8, 32}));
  EXPECT_EQ(back.labels, spec.labels);
  // Proto defaults.
  v1::ScoreRequest empty;
  EXPECT_EQ(SpecFromProto(empty).max_new_tokens, 256);
  EXPECT_EQ(SpecFromProto(empty).ddtree_budgets, (std::vector<int32_t>{8}));

  ExtractionContract c = testing::FakeContract();
  c.skipped.push_back({"mtp.", 3, "MTP head"});
  v1::ExtractionContract pc;
  ContractToProto(c, &pc);
  EXPECT_EQ(ContractFromProto(pc), c);
}

}  // namespace
}  // namespace specwire
