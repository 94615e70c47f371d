// specwire-extractor: the extractor gRPC server.
//
// Loads one target at start-up (the model path is fixed here and never taken from a request),
// serves the Extractor service plus grpc.health.v1 and reflection, exports Prometheus metrics on
// their own address, and drains gracefully on SIGTERM / SIGINT: new calls are refused, queued and
// running ones finish (up to --drain_seconds). Start-up and shutdown are the steps every server
// shares (common/rpc/server_startup.h).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/command_line.h"
#include "common/models/kernel_set.h"
#include "common/rpc/security.h"
#include "common/rpc/server_flags.h"
#include "common/rpc/server_startup.h"
#include "common/tokenizer/tokenizer.h"
#include "common/models/batch_layout.h"
#include "common/models/target_flags.h"
#include "services/extractor/metrics.h"
#include "services/extractor/scheduler.h"
#include "services/extractor/server.h"
#include "services/extractor/torch_backend.h"

ABSL_FLAG(std::string, model, "",
          "Checkpoint directory (config.json, *.safetensors, tokenizer.json). Required.");
ABSL_FLAG(std::string, cpu_binding, "auto",
          "Where the engine's intra-op threads run: auto (cores when --threads takes every CPU "
          "this process may use, else none) | none (the kernel places them) | cores (thread i on "
          "the i-th CPU this process may use) | CPU ids and ranges, e.g. 0-3,8 (one instance of "
          "several on a host).");
ABSL_FLAG(int64_t, canary_tokens, 80,
          "Tokens of the canary input run at load: every tap's statistics go into the contract "
          "(its canary fingerprint, which specwire-cli fingerprint prints and compares); 0: none.");
ABSL_FLAG(int64_t, max_batch_tokens, 16384,
          "Dynamic batching budget: padded tokens (sequences x longest) per forward pass.");
ABSL_FLAG(int64_t, max_running_sequences, 64,
          "Continuous batching: generation sequences admitted at once (each decoding step "
          "serves all of them); a request waits until its prompts fit.");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{4} << 30,
          "Continuous batching: bytes the admitted sequences' caches may hold in all (each "
          "reserves prompt + max_new_tokens positions); a request waits until it fits, one that "
          "never can gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_concurrent_streams, 64, "Open Extract/Generate/GetTensors streams at most.");
ABSL_FLAG(int64_t, max_sequences_per_request, 256, "Sequences (or prompts) per request at most.");
ABSL_FLAG(int64_t, max_tokens_per_sequence, 32768, "Tokens per sequence at most.");
ABSL_FLAG(int64_t, max_tokens_per_request, 262144, "Tokens per request (all sequences) at most.");
ABSL_FLAG(int64_t, max_streams_per_peer, 0,
          "Open Extract/Generate/GetTensors streams from one client address (any port) at most; "
          "0: no cap beyond --max_concurrent_streams.");
ABSL_FLAG(int64_t, max_sessions, 16,
          "Live verification sessions (the Session method) open at once; one more is refused "
          "with RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_session_tokens, 16384,
          "Positions one session may hold: prompt + max_new_tokens + max_draft_tokens + 1.");
ABSL_FLAG(int64_t, session_cache_bytes, int64_t{4} << 30,
          "Cache bytes all open sessions may hold together (each reserves its whole capacity, "
          "prompt + max_new_tokens + max_draft_tokens + 1 positions, when it opens); an open "
          "that does not fit is refused with RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, session_idle_seconds, 300,
          "A session that sends no request for this long is closed (DEADLINE_EXCEEDED) and its "
          "state freed; 0: never.");
ABSL_FLAG(int64_t, default_chunk_bytes, 1 << 20,
          "Hidden-state chunk size when the request gives none.");
ABSL_FLAG(int64_t, max_chunk_bytes, 4 << 20,
          "Largest chunk a request may ask for (also caps messages).");

namespace {

int Fail(const std::string& msg) {
  std::cerr << "specwire-extractor: " << msg << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace specwire;
  ParseCommandLineFlags(
      argc, argv,
      "specwire-extractor --model DIR [flags]\n"
      "Serves hidden states and greedy completions of one target over gRPC "
      "(specwire.v1.Extractor),\n"
      "plus grpc.health.v1 and reflection. Metrics: Prometheus text format on --metrics_listen.");
  if (absl::GetFlag(FLAGS_model).empty()) return Fail("--model is required (see --help)");
  // The server's flags, certificates and token are read before the slow start-up work, so that
  // a wrong path fails at once.
  auto parsed_server_flags =
      ServerOptionsFromFlags({"127.0.0.1:50051", "127.0.0.1:9464", /*max_queue=*/64});
  if (!parsed_server_flags.ok()) return Fail(parsed_server_flags.status().ToString());
  const ServerFlagOptions& server_flags = *parsed_server_flags;

  auto target = TargetFlagsFromFlags("bfloat16");
  if (!target.ok()) return Fail(target.status().ToString());
  BackendOptions bo;
  bo.model_dir = absl::GetFlag(FLAGS_model);
  bo.dtype = target->dtype;
  bo.device_map = target->device_map;
  bo.threads = target->threads;
  bo.cpu_binding = absl::GetFlag(FLAGS_cpu_binding);
  bo.batch_layout = target->batch_layout;
  bo.kernels = target->kernels;
  bo.canary_tokens = absl::GetFlag(FLAGS_canary_tokens);
  if (bo.canary_tokens < 0) return Fail("--canary_tokens must not be negative");
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
  SchedulerOptions so;
  so.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  so.max_queue = server_flags.max_queue;
  so.max_running_sequences = absl::GetFlag(FLAGS_max_running_sequences);
  so.max_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  if (so.max_running_sequences < 1 || so.max_cache_bytes < 1) {
    return Fail("--max_running_sequences and --kv_cache_bytes must be positive");
  }
  Scheduler scheduler(backend->get(), so);
  scheduler.set_batch_observer([&](int requests, int64_t tokens) {
    metrics.Batch(requests, tokens);
    metrics.SetQueueDepth(scheduler.queue_depth());
    metrics.SetGeneration(scheduler.running_sequences(), scheduler.reserved_cache_bytes());
  });
  scheduler.set_decode_observer([&](int sequences) {
    metrics.DecodeStep(sequences);
    metrics.SetGeneration(scheduler.running_sequences(), scheduler.reserved_cache_bytes());
  });

  ExtractorLimits limits;
  limits.max_sequences_per_request = absl::GetFlag(FLAGS_max_sequences_per_request);
  limits.max_tokens_per_sequence = absl::GetFlag(FLAGS_max_tokens_per_sequence);
  limits.max_tokens_per_request = absl::GetFlag(FLAGS_max_tokens_per_request);
  limits.max_new_tokens = server_flags.max_new_tokens_limit;
  limits.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  limits.default_chunk_bytes = absl::GetFlag(FLAGS_default_chunk_bytes);
  limits.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  limits.max_text_bytes = server_flags.max_text_bytes;
  limits.max_streams_per_peer = absl::GetFlag(FLAGS_max_streams_per_peer);
  limits.stream_idle_seconds = server_flags.stream_idle_seconds;
  limits.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  limits.max_session_tokens = absl::GetFlag(FLAGS_max_session_tokens);
  limits.session_idle_seconds = absl::GetFlag(FLAGS_session_idle_seconds);
  limits.session_cache_bytes = absl::GetFlag(FLAGS_session_cache_bytes);
  limits.max_send_message_bytes = limits.max_chunk_bytes + (1 << 20);
  ExtractorService service(backend->get(), &scheduler, tokenizer.get(), &metrics, limits);

  ServerStartOptions start = ServerStartOptions::FromFlags(server_flags);
  start.services = {&service};
  start.service_names = {"specwire.v1.Extractor"};
  start.metrics = {metrics.registry()};
  start.health_service = "specwire.v1.Extractor";
  // Requests are small; responses are bounded by the chunk limit plus framing.
  start.max_receive_message_bytes = 64 << 20;
  start.max_send_message_bytes = static_cast<int>(limits.max_send_message_bytes);
  // Health says NOT_SERVING while every stream slot is taken (the server is known once started).
  std::atomic<RunningServer*> running{nullptr};
  service.set_capacity_observer([&running](bool has_room) {
    if (RunningServer* s = running.load()) s->SetServing(has_room);
  });
  auto server = RunningServer::Start(std::move(start));
  if (!server.ok()) return Fail(std::string(server.status().message()));
  running.store(server->get());

  const auto& c = (*backend)->contract();
  std::cout << "specwire-extractor: serving " << c.architecture << " (" << c.num_layers
            << " layers, " << c.compute_dtype << ", " << c.source_layout << " layout) on "
            << (*server)->Describe() << " [" << DescribeServerSecurity(server_flags.security) << "]"
            << std::endl;

  WaitForStopSignal();
  std::cout << "specwire-extractor: draining" << std::endl;
  (*server)->BeginDrain();
  service.BeginDrain();
  scheduler.Drain();
  (*server)->Stop(std::chrono::system_clock::now() +
                  std::chrono::seconds(server_flags.drain_seconds));
  running.store(nullptr);
  scheduler.Shutdown();
  std::cout << "specwire-extractor: stopped" << std::endl;
  return 0;
}
