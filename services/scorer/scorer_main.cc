// specwire-scorer: the scorer gRPC server.
//
// Scores drafters of any family (given per request as a directory on this host) against the target that
// one or more extractors serve (--extractor, fixed here), streams per-prompt results and the
// summary (specwire.v1.Scorer), exports vLLM-compatible acceptance counters and service metrics
// to Prometheus on their own address, and drains gracefully on SIGTERM / SIGINT. Its flags come
// from the shared modules (server, extractor connection, runner, continuous evaluation) plus the
// limits a service puts on jobs and the upload settings of push mode, which are its own.
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "clients/cpp/extractor_connection_flags.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "common/rpc/security.h"
#include "common/rpc/server_flags.h"
#include "common/rpc/server_startup.h"
#include "common/status.h"
#include "services/scorer/eval/eval_flags.h"
#include "services/scorer/metrics.h"
#include "services/scorer/runner_flags.h"
#include "services/scorer/job/score_job.h"
#include "services/scorer/score_worker.h"
#include "services/scorer/job/scorer_backend.h"
#include "services/scorer/server.h"
#include "services/scorer/eval/submit_service.h"

// The limits a job may ask for. Not --max_prompts / --max_new_tokens: those are what one job asks
// for in specwire-score (and every client binary).
ABSL_FLAG(int64_t, max_prompts_per_job, 100000, "Prompts per job at most.");
ABSL_FLAG(int64_t, max_ddtree_budget, 4096, "DDTree node budget at most.");
ABSL_FLAG(int64_t, max_ddtree_budgets, 16, "DDTree budgets per job at most.");
ABSL_FLAG(std::string, data_root, "",
          "If set, drafter_path and dataset_path of requests must lie under this directory.");
// Push mode (specwire.v1.CheckpointScorer, on when --eval_sets is given).
ABSL_FLAG(std::string, upload_dir, "",
          "Where SubmitDrafter stores uploaded checkpoints (default <cache_dir>/uploads).");
ABSL_FLAG(int64_t, max_upload_bytes, int64_t{8} << 30, "SubmitDrafter: bytes per upload at most.");

namespace {

int Fail(const std::string& msg) {
  std::cerr << "specwire-scorer: " << msg << std::endl;
  return 2;
}

// The eval flags (shared with specwire-score --watch_dir) plus the service's own defaults, push
// settings and limits.
absl::StatusOr<specwire::ContinuousEvalConfig> ContinuousEvalConfigFromFlags(
    const specwire::ScoreRunnerOptions& ro) {
  using namespace specwire;
  SW_ASSIGN_OR_RETURN(ContinuousEvalOptions o, ContinuousEvalOptionsFromFlags());
  ContinuousEvalConfig c;
  c.eval_sets = o.evaluator.eval_sets;
  c.evaluator = std::move(o.evaluator);
  c.evaluator.log = ro.log;
  const std::string base = ro.head.cache_dir.empty() ? "." : ro.head.cache_dir;
  c.db_path = o.db_path.empty() ? absl::StrCat(base, "/eval.sqlite") : o.db_path;
  c.watch_dir = o.watch.dir;
  c.watch = std::move(o.watch);
  c.poll_seconds = o.poll_seconds;
  c.baseline_drafter = o.baseline_drafter;
  c.submit.upload_dir = absl::GetFlag(FLAGS_upload_dir);
  if (c.submit.upload_dir.empty()) c.submit.upload_dir = absl::StrCat(base, "/uploads");
  c.submit.max_upload_bytes = absl::GetFlag(FLAGS_max_upload_bytes);
  c.limits = ro.limits;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace specwire;
  ParseCommandLineFlags(
      argc, argv,
      "specwire-scorer --extractor ADDR[,ADDR...] [flags]\n"
      "Scores drafters (any family specwire reads) against the target the extractor(s) serve (specwire.v1.Scorer),\n"
      "plus grpc.health.v1 and reflection. Metrics: Prometheus text format on --metrics_listen.");
  // The drafter's forwards and the hidden-state streams it reads allocate the same sizes again
  // and again.
  KeepFreedMemoryForReuse();
  // The server's flags, certificates and token are read before the slow start-up work, so that
  // a wrong path fails at once.
  auto parsed_server_flags =
      ServerOptionsFromFlags({"127.0.0.1:50061", "127.0.0.1:9465", /*max_queue=*/16});
  if (!parsed_server_flags.ok()) return Fail(parsed_server_flags.status().ToString());
  const ServerFlagOptions& server_flags = *parsed_server_flags;
  auto extractors = ExtractorConnectionFromFlags({});
  if (!extractors.ok()) return Fail(extractors.status().ToString());
  if (extractors->address.empty()) return Fail("--extractor is required (see --help)");
  auto ro = RunnerOptionsFromFlags();
  if (!ro.ok()) return Fail(ro.status().ToString());
  ro->limits.max_prompts = absl::GetFlag(FLAGS_max_prompts_per_job);
  ro->limits.max_new_tokens = server_flags.max_new_tokens_limit;
  ro->limits.max_ddtree_budget = absl::GetFlag(FLAGS_max_ddtree_budget);
  ro->limits.max_ddtree_budgets = absl::GetFlag(FLAGS_max_ddtree_budgets);
  ro->limits.data_root = absl::GetFlag(FLAGS_data_root);
  ro->limits.max_text_bytes = server_flags.max_text_bytes;
  auto log_mu = std::make_shared<std::mutex>();
  ro->log = [log_mu](const std::string& line) {
    std::lock_guard<std::mutex> lock(*log_mu);
    std::cout << "specwire-scorer: " << line << std::endl;
  };

  const TorchScorerOptions drafter = DrafterOptionsFromFlags();
  auto backend = MakeTorchScorerBackend(drafter);
  if (!backend.ok()) return Fail(backend.status().ToString());
  auto pool = ExtractorPool::Create(extractors->address, extractors->client);
  if (!pool.ok()) return Fail(pool.status().ToString());
  ScoreRunner runner(backend->get(), pool->get(), *ro);

  ScorerMetrics metrics;
  // Health says NOT_SERVING while the job queue is full (the server is known once started;
  // declared before the worker, which outlives nothing it calls).
  std::atomic<RunningServer*> running{nullptr};
  ScoreWorker worker(&runner, server_flags.max_queue, &metrics);
  worker.set_capacity_observer([&running](bool has_room) {
    if (RunningServer* s = running.load()) s->SetServing(has_room);
  });
  ScorerService service(&worker, &metrics, ro->limits, server_flags.stream_idle_seconds);
  auto eval_config = ContinuousEvalConfigFromFlags(*ro);
  if (!eval_config.ok()) return Fail(eval_config.status().ToString());
  std::unique_ptr<ContinuousEval> eval;
  if (!eval_config->eval_sets.empty()) {
    auto started = ContinuousEval::Start(*std::move(eval_config), &worker, &metrics);
    if (!started.ok()) return Fail(started.status().ToString());
    eval = *std::move(started);
  } else if (!eval_config->watch_dir.empty()) {
    return Fail("--watch_dir needs --eval_sets (the eval sets to score checkpoints on)");
  }

  ServerStartOptions start = ServerStartOptions::FromFlags(server_flags);
  start.services = {&service};
  start.service_names = {"specwire.v1.Scorer"};
  if (eval) {
    start.services.push_back(eval->service());
    start.service_names.push_back("specwire.v1.CheckpointScorer");
  }
  start.metrics = {metrics.registry()};
  start.health_service = "specwire.v1.Scorer";
  // Inline prompts: 64 MiB of token ids is ~16M tokens; a larger request is refused by gRPC
  // (RESOURCE_EXHAUSTED) before it is held.
  start.max_receive_message_bytes = 64 << 20;
  auto server = RunningServer::Start(std::move(start));
  if (!server.ok()) return Fail(std::string(server.status().message()));
  running.store(server->get());

  std::cout << "specwire-scorer: serving against extractor " << extractors->address << " (drafter "
            << drafter.dtype << " on " << drafter.device << ") on " << (*server)->Describe() << " ["
            << DescribeServerSecurity(server_flags.security) << "]" << std::endl;

  WaitForStopSignal();
  std::cout << "specwire-scorer: draining" << std::endl;
  (*server)->BeginDrain();
  // Jobs first: a stream finishes only when its job ends, and Stop waits for the streams.
  if (eval) eval->RequestStop();
  worker.Drain(server_flags.drain_seconds);
  worker.Shutdown();
  if (eval) eval->Stop();
  (*server)->Stop(std::chrono::system_clock::now() + std::chrono::seconds(5));
  running.store(nullptr);
  std::cout << "specwire-scorer: stopped" << std::endl;
  return 0;
}
