// specwire-scorer: the scorer gRPC server.
//
// Scores DFlash drafters (given per request as a directory on this host) against the target that
// one or more extractors serve (--extractor, fixed here), streams per-prompt results and the
// summary (specwire.v1.Scorer), exports vLLM-compatible acceptance counters and service metrics
// to Prometheus on their own address, and drains gracefully on SIGTERM / SIGINT.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/security.h"
#include "common/server_flags.h"
#include "common/status.h"
#include "services/scorer/metrics.h"
#include "services/scorer/score_job.h"
#include "services/scorer/scorer_backend.h"
#include "services/scorer/server.h"
#include "services/scorer/submit_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50061",
          "gRPC listen address (host:port; port 0 picks one).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9465",
          "Prometheus metrics address (host:port); empty disables the exporter.");
ABSL_FLAG(std::string, extractor, "",
          "The extractor(s) serving the target. Required. host:port, a comma list of them "
          "(prompts are spread over all), or dns:///name:port (every address of the name, "
          "resolved again for each job). All must serve the same target.");
ABSL_FLAG(std::string, dtype, "float32", "Drafter compute dtype: float32 | bfloat16 | float16.");
ABSL_FLAG(std::string, wire_dtype, "auto",
          "Dtype of the features on the wire: fp32 | bf16 | auto (fp32 for a float32 drafter, "
          "bf16 otherwise).");
ABSL_FLAG(std::string, device, "cpu", "Where the drafter runs: cpu | cuda | cuda:N.");
ABSL_FLAG(int, threads, 0, "Intra-op CPU threads for the drafter (0: torch's default).");
ABSL_FLAG(std::string, cache_dir, "",
          "Where the target's embed_tokens / lm_head fetched from the extractor are kept "
          "(safetensors keyed by tensor digest), so a restart does not fetch them again. "
          "Default: $XDG_CACHE_HOME/specwire or ~/.cache/specwire; \"none\" disables the cache.");
ABSL_FLAG(std::string, target_checkpoint, "",
          "Read embed_tokens / lm_head from this local target checkpoint directory instead of "
          "the extractor's GetTensors (its config must match the extractor's contract).");
ABSL_FLAG(std::string, data_root, "",
          "If set, drafter_path and dataset_path of requests must lie under this directory.");
ABSL_FLAG(int64_t, max_queue, 16,
          "Score jobs waiting at most (one runs at a time); more get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_prompts, 100000, "Prompts per job at most.");
ABSL_FLAG(int64_t, max_new_tokens, 4096, "max_new_tokens of a job at most.");
ABSL_FLAG(int64_t, max_ddtree_budget, 4096, "DDTree node budget at most.");
ABSL_FLAG(int64_t, max_ddtree_budgets, 16, "DDTree budgets per job at most.");
ABSL_FLAG(int64_t, prefetch, 1, "Trajectories fetched ahead of the replay, per extractor.");
ABSL_FLAG(bool, extractor_tls, false,
          "Connect to the extractor(s) with TLS; implied by --extractor_tls_ca and "
          "--extractor_tls_client_cert.");
ABSL_FLAG(std::string, extractor_tls_ca, "",
          "PEM CA that signed the extractors' certificates (default: system roots).");
ABSL_FLAG(std::string, extractor_tls_client_cert, "",
          "PEM client certificate presented to the extractors (mTLS).");
ABSL_FLAG(std::string, extractor_tls_client_key, "", "PEM key of --extractor_tls_client_cert.");
ABSL_FLAG(std::string, extractor_tls_server_name, "",
          "Name to check the extractors' certificates against (default: the host).");
ABSL_FLAG(std::string, extractor_auth_token_file, "",
          "Bearer token sent to the extractors; else $SPECWIRE_AUTH_TOKEN, else the file named "
          "by $SPECWIRE_AUTH_TOKEN_FILE.");
ABSL_FLAG(double, extractor_timeout, 0, "Deadline of each extractor call in seconds (0: none).");
ABSL_FLAG(int, extractor_attempts, 6,
          "Attempts per prompt when an extractor call fails with UNAVAILABLE / ABORTED (the "
          "extractor went away); backoff 0.1 s doubling up to 2 s. 1: no retry.");
ABSL_FLAG(std::string, results_dir, "",
          "Keep each completed prompt of a job that has a job_id in <dir>/<job_id>.jsonl "
          "(fsync'ed), so the same job submitted again after a restart resumes. Empty: off.");
ABSL_FLAG(int, drain_seconds, 30, "On SIGTERM: seconds to let queued and running jobs finish.");
// Continuous evaluation (services/scorer/watch.h): on when --eval_sets is given.
ABSL_FLAG(std::string, eval_sets, "",
          "Eval sets every new drafter checkpoint is scored on (watch and push modes): "
          "label=path.jsonl or path.jsonl (label: the file's stem), comma-separated.");
ABSL_FLAG(int64_t, eval_max_prompts, 0, "Eval sets: score the first N prompts (0: all).");
ABSL_FLAG(int64_t, eval_max_new_tokens, 256, "Eval sets: greedy completion budget per prompt.");
ABSL_FLAG(std::string, eval_ddtree, "8", "Eval sets: DDTree budgets, comma-separated.");
ABSL_FLAG(std::string, eval_db, "",
          "SQLite results database of continuous evaluation, keyed (run, step, dataset) "
          "(default <cache_dir>/eval.sqlite).");
ABSL_FLAG(std::string, watch_dir, "",
          "Score every drafter checkpoint (a subdirectory with config.json + *.safetensors, "
          "step from its name checkpoint-N / step_N / N or trainer_state.json) appearing here.");
ABSL_FLAG(std::string, watch_run, "", "Run label of --watch_dir (default: its name).");
ABSL_FLAG(double, watch_poll_seconds, 5, "Seconds between scans of --watch_dir.");
ABSL_FLAG(int, watch_stable_polls, 1,
          "Scans a checkpoint's files must stay unchanged (names, sizes, mtimes) before it is "
          "read.");
ABSL_FLAG(std::string, watch_marker, "",
          "If set, only checkpoints holding a file of this name (written last by the trainer) "
          "are read.");
ABSL_FLAG(std::string, baseline_drafter, "",
          "A reference drafter scored once on the eval sets as run \"baseline\", step 0.");
ABSL_FLAG(std::string, upload_dir, "",
          "Where SubmitDrafter stores uploaded checkpoints (default <cache_dir>/uploads).");
ABSL_FLAG(int64_t, max_upload_bytes, int64_t{8} << 30, "SubmitDrafter: bytes per upload at most.");

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

int Fail(const std::string& msg) {
  std::cerr << "specwire-scorer: " << msg << std::endl;
  return 2;
}

std::string DefaultCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) {
    return absl::StrCat(x, "/specwire");
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && *h) {
    return absl::StrCat(h, "/.cache/specwire");
  }
  return "";
}

absl::StatusOr<specwire::ContinuousEvalConfig> ContinuousEvalConfigFromFlags(
    const specwire::ScoreRunnerOptions& ro) {
  using namespace specwire;
  ContinuousEvalConfig c;
  SW_ASSIGN_OR_RETURN(c.eval_sets, ParseEvalSets(absl::GetFlag(FLAGS_eval_sets)));
  c.evaluator.max_prompts = absl::GetFlag(FLAGS_eval_max_prompts);
  c.evaluator.max_new_tokens = absl::GetFlag(FLAGS_eval_max_new_tokens);
  c.evaluator.ddtree_budgets.clear();
  for (absl::string_view b :
       absl::StrSplit(absl::GetFlag(FLAGS_eval_ddtree), ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(b, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--eval_ddtree: \"", std::string(b), "\" is not an integer"));
    }
    c.evaluator.ddtree_budgets.push_back(v);
  }
  c.evaluator.log = ro.log;
  const std::string base = ro.cache_dir.empty() ? "." : ro.cache_dir;
  c.db_path = absl::GetFlag(FLAGS_eval_db);
  if (c.db_path.empty()) c.db_path = absl::StrCat(base, "/eval.sqlite");
  c.watch_dir = absl::GetFlag(FLAGS_watch_dir);
  c.watch.run = absl::GetFlag(FLAGS_watch_run);
  if (!c.watch.run.empty()) SW_RETURN_IF_ERROR(ValidateRunName(c.watch.run, "--watch_run"));
  c.watch.stable_polls = std::max(1, absl::GetFlag(FLAGS_watch_stable_polls));
  c.watch.marker = absl::GetFlag(FLAGS_watch_marker);
  c.poll_seconds = std::max(0.05, absl::GetFlag(FLAGS_watch_poll_seconds));
  c.baseline_drafter = absl::GetFlag(FLAGS_baseline_drafter);
  c.submit.upload_dir = absl::GetFlag(FLAGS_upload_dir);
  if (c.submit.upload_dir.empty()) c.submit.upload_dir = absl::StrCat(base, "/uploads");
  c.submit.max_upload_bytes = absl::GetFlag(FLAGS_max_upload_bytes);
  c.limits = ro;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace specwire;
  absl::SetProgramUsageMessage(
      "specwire-scorer --extractor ADDR[,ADDR...] [flags]\n"
      "Scores DFlash drafters against the target the extractor(s) serve (specwire.v1.Scorer),\n"
      "plus grpc.health.v1 and reflection. Metrics: Prometheus text format on --metrics_listen.");
  // --help lists this file's flags (absl would otherwise match files by the program's name).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return file.find("scorer_main") != absl::string_view::npos || IsSharedServerFlagsFile(file);
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_extractor).empty()) return Fail("--extractor is required (see --help)");
  // Certificates and the token are read before the slow start-up work, so that a wrong path
  // fails at once.
  const ServerSecurityOptions security = ServerSecurityFromFlags();
  auto credentials = MakeServerCredentials(security);
  if (!credentials.ok()) return Fail(credentials.status().ToString());

  TorchScorerOptions to;
  to.dtype = absl::GetFlag(FLAGS_dtype);
  to.device = absl::GetFlag(FLAGS_device);
  to.threads = absl::GetFlag(FLAGS_threads);
  auto backend = MakeTorchScorerBackend(to);
  if (!backend.ok()) return Fail(backend.status().ToString());

  ExtractorClientOptions co;
  co.timeout_seconds = absl::GetFlag(FLAGS_extractor_timeout);
  ClientSecurityFiles extractor_security;
  extractor_security.tls = absl::GetFlag(FLAGS_extractor_tls);
  extractor_security.ca_file = absl::GetFlag(FLAGS_extractor_tls_ca);
  extractor_security.cert_file = absl::GetFlag(FLAGS_extractor_tls_client_cert);
  extractor_security.key_file = absl::GetFlag(FLAGS_extractor_tls_client_key);
  extractor_security.server_name = absl::GetFlag(FLAGS_extractor_tls_server_name);
  extractor_security.token_file = absl::GetFlag(FLAGS_extractor_auth_token_file);
  extractor_security.flag_prefix = "--extractor_";
  auto client_security = LoadClientSecurity(extractor_security);
  if (!client_security.ok()) return Fail(client_security.status().ToString());
  co.security = *std::move(client_security);
  auto pool = ExtractorPool::Create(absl::GetFlag(FLAGS_extractor), co);
  if (!pool.ok()) return Fail(pool.status().ToString());

  ScoreRunnerOptions ro;
  ro.target_checkpoint = absl::GetFlag(FLAGS_target_checkpoint);
  ro.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (ro.cache_dir.empty()) ro.cache_dir = DefaultCacheDir();
  if (ro.cache_dir == "none") ro.cache_dir.clear();
  const std::string wire = absl::GetFlag(FLAGS_wire_dtype);
  if (wire == "fp32" || wire == "float32" ||
      (wire == "auto" && (to.dtype == "float32" || to.dtype == "fp32"))) {
    ro.wire_dtype = DType::kF32;
  } else if (wire == "bf16" || wire == "bfloat16" || wire == "auto") {
    ro.wire_dtype = DType::kBF16;
  } else {
    return Fail(absl::StrCat("--wire_dtype \"", wire, "\" is not one of fp32, bf16, auto"));
  }
  ro.prefetch_per_extractor = absl::GetFlag(FLAGS_prefetch);
  ro.max_prompts = absl::GetFlag(FLAGS_max_prompts);
  ro.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  ro.max_ddtree_budget = absl::GetFlag(FLAGS_max_ddtree_budget);
  ro.max_ddtree_budgets = absl::GetFlag(FLAGS_max_ddtree_budgets);
  ro.data_root = absl::GetFlag(FLAGS_data_root);
  ro.retry.max_attempts = std::max(1, absl::GetFlag(FLAGS_extractor_attempts));
  ro.results_dir = absl::GetFlag(FLAGS_results_dir);
  auto log_mu = std::make_shared<std::mutex>();
  ro.log = [log_mu](const std::string& line) {
    std::lock_guard<std::mutex> lock(*log_mu);
    std::cout << "specwire-scorer: " << line << std::endl;
  };
  ScoreRunner runner(backend->get(), pool->get(), ro);

  ScorerMetrics metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(absl::GetFlag(FLAGS_metrics_listen));
      exposer->RegisterCollectable(metrics.registry());
    } catch (const std::exception& e) {
      return Fail(
          absl::StrCat("metrics listener ", absl::GetFlag(FLAGS_metrics_listen), ": ", e.what()));
    }
  }

  ScoreWorker worker(&runner, absl::GetFlag(FLAGS_max_queue), &metrics);
  ScorerService service(&worker, &metrics, ro);
  std::unique_ptr<ContinuousEval> eval;
  if (!absl::GetFlag(FLAGS_eval_sets).empty()) {
    auto c = ContinuousEvalConfigFromFlags(ro);
    if (!c.ok()) return Fail(c.status().ToString());
    auto started = ContinuousEval::Start(*std::move(c), &worker, &metrics);
    if (!started.ok()) return Fail(started.status().ToString());
    eval = *std::move(started);
  } else if (!absl::GetFlag(FLAGS_watch_dir).empty()) {
    return Fail("--watch_dir needs --eval_sets (the eval sets to score checkpoints on)");
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &port);
  builder.RegisterService(&service);
  if (eval) builder.RegisterService(eval->service());
  builder.SetMaxReceiveMessageSize(256 << 20);  // inline prompts
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen)));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus("specwire.v1.Scorer", true);

  std::cout << "specwire-scorer: serving against extractor " << absl::GetFlag(FLAGS_extractor)
            << " (drafter " << to.dtype << " on " << to.device << ") on port " << port
            << (exposer ? absl::StrCat(", metrics on ", absl::GetFlag(FLAGS_metrics_listen)) : "")
            << " [" << DescribeServerSecurity(security) << "]" << std::endl;

  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));

  std::cout << "specwire-scorer: draining" << std::endl;
  server->GetHealthCheckService()->SetServingStatus(false);
  // Jobs first: a stream finishes only when its job ends, and Shutdown waits for the streams.
  if (eval) eval->RequestStop();
  worker.Drain(absl::GetFlag(FLAGS_drain_seconds));
  worker.Shutdown();
  if (eval) eval->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::cout << "specwire-scorer: stopped" << std::endl;
  return 0;
}
