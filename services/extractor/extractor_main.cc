// specwire-extractor: the extractor gRPC server.
//
// Loads one target at start-up (the model path is fixed here and never taken from a request),
// serves the Extractor service plus grpc.health.v1 and reflection, exports Prometheus metrics on
// their own address, and drains gracefully on SIGTERM / SIGINT: new calls are refused, queued and
// running ones finish (up to --drain_seconds).
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "common/server_flags.h"
#include "common/tokenizer.h"
#include "services/extractor/metrics.h"
#include "services/extractor/scheduler.h"
#include "services/extractor/server.h"
#include "services/extractor/torch_backend.h"

ABSL_FLAG(std::string, model, "", "Checkpoint directory (config.json, *.safetensors, tokenizer.json). Required.");
ABSL_FLAG(std::string, dtype, "bfloat16", "Compute dtype: float32 | bfloat16 | float16.");
ABSL_FLAG(std::string, device_map, "cpu",
          "Where layers run: cpu | cuda | cuda:0,cuda:1 (even split) | cuda:0=0-31,cuda:1=32-63.");
ABSL_FLAG(int, threads, 0, "Intra-op CPU threads for the engine (0: torch's default).");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (host:port).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus metrics address (host:port); empty disables the exporter.");
ABSL_FLAG(int64_t, max_batch_tokens, 16384,
          "Dynamic batching budget: padded tokens (sequences x longest) per forward pass.");
ABSL_FLAG(int64_t, max_queue, 64, "Requests waiting for the engine at most; more get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_concurrent_streams, 64, "Open Extract/Generate/GetTensors streams at most.");
ABSL_FLAG(int64_t, max_sequences_per_request, 256, "Sequences (or prompts) per request at most.");
ABSL_FLAG(int64_t, max_tokens_per_sequence, 32768, "Tokens per sequence at most.");
ABSL_FLAG(int64_t, max_tokens_per_request, 262144, "Tokens per request (all sequences) at most.");
ABSL_FLAG(int64_t, max_new_tokens, 4096, "Generate: max_new_tokens at most.");
ABSL_FLAG(int64_t, default_chunk_bytes, 1 << 20, "Hidden-state chunk size when the request gives none.");
ABSL_FLAG(int64_t, max_chunk_bytes, 4 << 20, "Largest chunk a request may ask for (also caps messages).");
ABSL_FLAG(int, drain_seconds, 30, "On SIGTERM: seconds to let running calls finish before stopping.");

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

int Fail(const std::string& msg) {
  std::cerr << "specwire-extractor: " << msg << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace specwire;
  absl::SetProgramUsageMessage(
      "specwire-extractor --model DIR [flags]\n"
      "Serves hidden states and greedy completions of one target over gRPC (specwire.v1.Extractor),\n"
      "plus grpc.health.v1 and reflection. Metrics: Prometheus text format on --metrics_listen.");
  // --help lists this file's flags (absl would otherwise match files by the program's name).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return file.find("extractor_main") != absl::string_view::npos || IsSharedServerFlagsFile(file);
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_model).empty()) return Fail("--model is required (see --help)");
  // Certificates and the token are read before the slow start-up work, so that a wrong path
  // fails at once.
  const ServerSecurityOptions security = ServerSecurityFromFlags();
  auto credentials = MakeServerCredentials(security);
  if (!credentials.ok()) return Fail(credentials.status().ToString());

  BackendOptions bo;
  bo.model_dir = absl::GetFlag(FLAGS_model);
  bo.dtype = absl::GetFlag(FLAGS_dtype);
  bo.device_map = absl::GetFlag(FLAGS_device_map);
  bo.threads = absl::GetFlag(FLAGS_threads);
  auto backend = LoadTorchBackend(bo);
  if (!backend.ok()) return Fail(backend.status().ToString());

  std::unique_ptr<Tokenizer> tokenizer;
  const auto tok_path = std::filesystem::path(bo.model_dir) / "tokenizer.json";
  if (std::filesystem::exists(tok_path)) {
    auto t = Tokenizer::FromFile(tok_path.string());
    if (!t.ok()) return Fail(absl::StrCat("tokenizer.json: ", t.status().ToString()));
    tokenizer = std::move(*t);
  }

  ExtractorMetrics metrics;
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!absl::GetFlag(FLAGS_metrics_listen).empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(absl::GetFlag(FLAGS_metrics_listen));
      exposer->RegisterCollectable(metrics.registry());
    } catch (const std::exception& e) {
      return Fail(absl::StrCat("metrics listener ", absl::GetFlag(FLAGS_metrics_listen), ": ", e.what()));
    }
  }

  SchedulerOptions so;
  so.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  so.max_queue = absl::GetFlag(FLAGS_max_queue);
  Scheduler scheduler(backend->get(), so);
  scheduler.set_batch_observer([&](int requests, int64_t tokens) {
    metrics.Batch(requests, tokens);
    metrics.SetQueueDepth(scheduler.queue_depth());
  });

  ExtractorLimits limits;
  limits.max_sequences_per_request = absl::GetFlag(FLAGS_max_sequences_per_request);
  limits.max_tokens_per_sequence = absl::GetFlag(FLAGS_max_tokens_per_sequence);
  limits.max_tokens_per_request = absl::GetFlag(FLAGS_max_tokens_per_request);
  limits.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  limits.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  limits.default_chunk_bytes = absl::GetFlag(FLAGS_default_chunk_bytes);
  limits.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  ExtractorService service(backend->get(), &scheduler, tokenizer.get(), &metrics, limits);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), *credentials, &port);
  builder.RegisterService(&service);
  // Requests are small; responses are bounded by the chunk limit plus framing.
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(static_cast<int>(limits.max_chunk_bytes + (1 << 20)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail(absl::StrCat("cannot listen on ", absl::GetFlag(FLAGS_listen)));
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus("specwire.v1.Extractor", true);

  const auto& c = (*backend)->contract();
  std::cout << "specwire-extractor: serving " << c.architecture << " (" << c.num_layers
            << " layers, " << c.compute_dtype << ", " << c.source_layout << " layout) on port "
            << port << (exposer ? absl::StrCat(", metrics on ", absl::GetFlag(FLAGS_metrics_listen)) : "")
            << " [" << DescribeServerSecurity(security) << "]" << std::endl;

  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));

  std::cout << "specwire-extractor: draining" << std::endl;
  server->GetHealthCheckService()->SetServingStatus(false);
  scheduler.Drain();
  server->Shutdown(std::chrono::system_clock::now() +
                   std::chrono::seconds(absl::GetFlag(FLAGS_drain_seconds)));
  scheduler.Shutdown();
  std::cout << "specwire-extractor: stopped" << std::endl;
  return 0;
}
