// specwire-bench-grpc-extract: extraction throughput through a running specwire-extractor.
//
// `--concurrency` client threads share one ExtractorClient (one channel, as a training data loader
// would) and each sends `--requests` Extract calls back to back, so the server's queue holds
// several requests and its dynamic batching can merge them. One repetition is the wall time until
// every call of every thread has finished; states are fully received, crc-checked and reassembled
// by the client, then dropped.
//
// Prints one JSON line per run (the same shape as specwire-bench-extract's) for a driver to
// compare: bench/grpc_vs_inprocess.py. Token ids follow specwire-bench-extract's pattern.
#include <atomic>
#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "clients/cpp/extractor_client.h"
#include "clients/cpp/extractor_connection_flags.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "common/wire.h"
#include "nlohmann/json.hpp"

// The extractor: --extractor (default 127.0.0.1:50051), --extractor_timeout (default 600 s), TLS
// and token as every client (clients/cpp/extractor_connection_flags.h).
ABSL_FLAG(std::string, wire_dtype, "bf16",
          "Wire dtype: bf16 | fp32 | auto (the server's compute dtype, which the in-process "
          "comparison holds its states in).");
ABSL_FLAG(int64_t, seq_len, 512, "Tokens per sequence.");
ABSL_FLAG(int, concurrency, 4, "Client threads, each with its own stream at a time.");
ABSL_FLAG(int, requests, 1, "Extract calls per thread per repetition (one sequence each).");
ABSL_FLAG(int, reps, 3, "Timed repetitions.");
ABSL_FLAG(int, warmup, 1, "Untimed repetitions first.");
ABSL_FLAG(std::string, layers, "all",
          "all (embedding, every layer, final norm: specwire-bench-extract's capture) | 0,5,...");

namespace specwire {
namespace {

int Fail(const std::string& msg) {
  std::cerr << "specwire-bench-grpc-extract: " << msg << "\n";
  return 1;
}

int Run() {
  KeepFreedMemoryForReuse();  // as the services do
  auto connection =
      ExtractorConnectionFromFlags({.address = "127.0.0.1:50051", .timeout_seconds = 600});
  if (!connection.ok()) return Fail(connection.status().ToString());
  ExtractorClient client(connection->client);
  auto contract = client.Info();
  if (!contract.ok()) return Fail(absl::StrCat("GetModelInfo: ", contract.status().ToString()));

  ExtractParams base;
  auto wire = ParseWireDType(absl::GetFlag(FLAGS_wire_dtype), contract->compute_dtype);
  if (!wire.ok()) return Fail(wire.status().ToString());
  base.dtype = *wire;
  const std::string dtype = base.dtype == DType::kF32 ? "fp32" : "bf16";
  const std::string layers = absl::GetFlag(FLAGS_layers);
  if (layers == "all") {
    for (int64_t i = 0; i < contract->num_layers; ++i) {
      base.states.layer_ids.push_back(static_cast<int32_t>(i));
    }
    base.states.embedding = true;
    base.states.final_norm = true;
  } else {
    for (absl::string_view s : absl::StrSplit(layers, ',')) {
      int32_t id;
      if (!absl::SimpleAtoi(s, &id)) return Fail("--layers: all or comma-separated layer ids");
      base.states.layer_ids.push_back(id);
    }
  }

  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  const int C = absl::GetFlag(FLAGS_concurrency), K = absl::GetFlag(FLAGS_requests);
  const int reps = absl::GetFlag(FLAGS_reps), warmup = absl::GetFlag(FLAGS_warmup);
  if (T <= 0 || C <= 0 || K <= 0 || reps <= 0 || warmup < 0) return Fail("bad flag value");
  // Request b carries sequence b of specwire-bench-extract's pattern.
  std::vector<ExtractParams> requests(static_cast<size_t>(C) * K, base);
  for (size_t b = 0; b < requests.size(); ++b) {
    std::vector<int64_t> ids;
    for (int64_t t = 0; t < T; ++t)
      ids.push_back((t * 7919 + b * 104729 + 13) % contract->vocab_size);
    requests[b].sequences = {InputSequence::Tokens(std::move(ids))};
    requests[b].request_id = absl::StrCat("bench-", b);
  }

  std::vector<double> times, compute, queue;
  int64_t bytes_per_rep = 0;
  for (int r = 0; r < warmup + reps; ++r) {
    absl::Mutex mu;
    absl::Status first_error;
    int64_t bytes = 0;
    double compute_s = 0, queue_s = 0;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < C; ++c) {
      threads.emplace_back([&, c] {
        for (int k = 0; k < K; ++k) {
          int64_t received = 0;
          auto reply =
              client.Extract(requests[static_cast<size_t>(c) * K + k], [&](ReceivedState&& s) {
                received += static_cast<int64_t>(s.bytes.size());
                return absl::OkStatus();
              });
          absl::MutexLock lock(&mu);
          if (!reply.ok()) {
            if (first_error.ok()) first_error = reply.status();
            return;
          }
          bytes += received;
          compute_s += reply->totals.compute_seconds;
          queue_s += reply->totals.queue_seconds;
        }
      });
    }
    for (auto& t : threads) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!first_error.ok()) return Fail(absl::StrCat("Extract: ", first_error.ToString()));
    if (r >= warmup) {
      times.push_back(seconds);
      compute.push_back(compute_s / (C * K));
      queue.push_back(queue_s / (C * K));
    }
    bytes_per_rep = bytes;
  }
  nlohmann::json line = {{"impl", "grpc"},
                         {"dtype", dtype},
                         {"seq_len", T},
                         {"concurrency", C},
                         {"sequences_per_rep", C * K},
                         {"bytes_per_rep", bytes_per_rep},
                         {"times_s", times},
                         {"mean_compute_s", compute},
                         {"mean_queue_s", queue}};
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  const std::vector<std::string> args = specwire::ParseCommandLineFlags(
      argc, argv,
      "specwire-bench-grpc-extract --extractor H:P [--wire_dtype bf16|fp32|auto] [--seq_len 512] "
      "[--concurrency 4] [--requests 1] [--reps 3]");
  if (!args.empty()) return specwire::Fail("unexpected argument " + args[0]);
  return specwire::Run();
}
