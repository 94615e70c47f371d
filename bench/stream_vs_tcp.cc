// specwire-bench-stream-vs-tcp: how close the Extract stream comes to what loopback TCP can carry.
//
// gRPC side: the real ExtractorService and Scheduler, in this process on a loopback port, over a
// fake ExtractorBackend whose "forward" returns precomputed fp32 states at once, so only the wire
// is timed: protobuf framing, crc32c on both ends, HTTP/2 flow control, and the client's
// reassembly (ExtractorClient → StateAssembler, one fresh buffer per state).
// TCP side: a plain socket pair moving the same bytes in the same chunk size (one send() per
// chunk, no framing), the receiver landing them in one fresh buffer per state, as the client does.
//
// Runs alternate (gRPC, TCP, gRPC, ...) so both see the same machine; medians are reported per
// chunk size. Last line: stream_vs_tcp_ratio=<gRPC / TCP bytes per second at the server's default
// chunk size, 1 MiB>.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/cpp/extractor_client.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "services/extractor/metrics.h"
#include "services/extractor/scheduler.h"
#include "services/extractor/server.h"
#include "services/extractor/work.h"

ABSL_FLAG(int64_t, total_mib, 256, "Hidden-state bytes per request (MiB), fp32.");
ABSL_FLAG(int64_t, hidden, 4096, "Hidden size of the fake target (a row is hidden x 4 bytes).");
ABSL_FLAG(int64_t, num_layers, 4,
          "Layers of the fake target, each a state per request; tokens = total / layers / row.");
ABSL_FLAG(
    std::string, chunk_bytes, "262144,1048576,4194304",
    "Chunk sizes to compare (comma-separated); 1048576 (the server's default) gives the ratio.");
ABSL_FLAG(int, reps, 5, "Timed runs per side and chunk size (after one warm-up run each).");

namespace specwire {
namespace {

constexpr int64_t kHeadlineChunk = 1 << 20;

// A target whose forward is free: every requested state is a view of one precomputed buffer.
class PrecomputedBackend final : public ExtractorBackend {
 public:
  PrecomputedBackend(int64_t num_layers, int64_t hidden, int64_t max_rows)
      : buffer_(std::make_shared<std::vector<float>>(max_rows * hidden)) {
    for (size_t i = 0; i < buffer_->size(); ++i)
      (*buffer_)[i] = static_cast<float>(i % 9973) * 1e-3f;
    contract_.architecture = "PrecomputedForBenchmark";
    contract_.num_layers = num_layers;
    contract_.hidden_size = hidden;
    contract_.vocab_size = 32000;
    contract_.compute_dtype = "float32";
    contract_.layer_types.assign(num_layers, "full_attention");
  }

  std::span<const std::byte> bytes(int64_t rows) const {
    return {reinterpret_cast<const std::byte*>(buffer_->data()),
            static_cast<size_t>(rows * contract_.hidden_size) * sizeof(float)};
  }

  const ExtractionContract& contract() const override { return contract_; }

  absl::StatusOr<std::vector<ExtractOutput>> ExtractBatch(
      const std::vector<const ExtractWork*>& works) override {
    std::vector<ExtractOutput> out;
    for (const ExtractWork* w : works) {
      if (w->wire_dtype != DType::kF32) return absl::InvalidArgumentError("dtype: fp32 only");
      ExtractOutput o;
      for (size_t s = 0; s < w->sequences.size(); ++s) {
        const int64_t rows = static_cast<int64_t>(w->sequences[s].size());
        if (rows * contract_.hidden_size > static_cast<int64_t>(buffer_->size())) {
          return absl::InvalidArgumentError("sequence longer than the precomputed buffer");
        }
        for (int64_t layer : w->selection.layer_ids) {
          HostState h;
          h.sequence_index = static_cast<uint32_t>(s);
          h.layer_id = static_cast<int32_t>(layer);
          h.hf_index = HfHiddenStatesIndex(StateTap::kLayerOutput, layer, contract_.num_layers);
          h.rows = rows;
          h.hidden = contract_.hidden_size;
          h.dtype = DType::kF32;
          h.owner = buffer_;
          h.bytes = bytes(rows);
          o.states.push_back(std::move(h));
        }
      }
      out.push_back(std::move(o));
    }
    return out;
  }
  absl::StatusOr<TensorBytes> GetTensor(const std::string& name) override {
    return absl::NotFoundError(name);
  }

 private:
  ExtractionContract contract_;
  std::shared_ptr<std::vector<float>> buffer_;
};

// CPU seconds of the whole process (both ends of the wire run here).
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Wall and CPU seconds of one run.
struct RunTime {
  double wall = 0;
  double cpu = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One Extract call. The states are dropped as they complete (the sink), so
// memory stays at one state.
absl::StatusOr<RunTime> TimeGrpc(ExtractorClient& client, const ExtractParams& params,
                                 int64_t expect_bytes, std::span<const std::byte> check) {
  int64_t received = 0;
  bool checked = false;
  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  auto reply = client.Extract(params, [&](ReceivedState&& s) {
    received += static_cast<int64_t>(s.bytes.size());
    if (!checked) {
      checked = true;
      if (s.bytes.size() != check.size() ||
          std::memcmp(s.bytes.data(), check.data(), check.size()) != 0) {
        return absl::DataLossError("received state differs from the source");
      }
    }
    return absl::OkStatus();
  });
  const RunTime time{std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                     ProcessCpuSeconds() - cpu0};
  if (!reply.ok()) return reply.status();
  if (received != expect_bytes) {
    return absl::InternalError(absl::StrCat("received ", received, " of ", expect_bytes, " bytes"));
  }
  return time;
}

// Loopback TCP: a sender thread writes `states` copies of `source` in `chunk` pieces, this thread
// receives each state into a fresh buffer. Timed from connect to the last byte.
absl::StatusOr<RunTime> TimeTcp(std::span<const std::byte> source, int64_t states, int64_t chunk) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (listener >= 0) close(listener);
    return absl::InternalError(absl::StrCat("tcp listener: ", std::strerror(errno)));
  }
  std::atomic<bool> send_ok{true};
  std::thread sender([&] {
    const int conn = accept(listener, nullptr, nullptr);
    if (conn < 0) {
      send_ok = false;
      return;
    }
    for (int64_t s = 0; s < states && send_ok; ++s) {
      for (size_t off = 0; off < source.size() && send_ok; off += chunk) {
        const size_t n = std::min<size_t>(chunk, source.size() - off);
        for (size_t sent = 0; sent < n;) {
          const ssize_t k = send(conn, source.data() + off + sent, n - sent, MSG_NOSIGNAL);
          if (k <= 0) {
            send_ok = false;
            break;
          }
          sent += static_cast<size_t>(k);
        }
      }
    }
    close(conn);
  });

  const double cpu0 = ProcessCpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status status;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    status = absl::InternalError(absl::StrCat("tcp connect: ", std::strerror(errno)));
  }
  for (int64_t s = 0; s < states && status.ok(); ++s) {
    std::vector<std::byte> state(source.size());  // as StateAssembler: one buffer per state
    for (size_t off = 0; off < state.size() && status.ok(); off += chunk) {
      const size_t n = std::min<size_t>(chunk, state.size() - off);
      for (size_t got = 0; got < n;) {
        const ssize_t k = recv(fd, state.data() + off + got, n - got, 0);
        if (k <= 0) {
          status = absl::InternalError("tcp: connection closed early");
          break;
        }
        got += static_cast<size_t>(k);
      }
    }
    if (s == 0 && status.ok() && std::memcmp(state.data(), source.data(), source.size()) != 0) {
      status = absl::DataLossError("tcp: received state differs from the source");
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (fd >= 0) close(fd);
  sender.join();
  const RunTime time{wall, ProcessCpuSeconds() - cpu0};
  close(listener);
  if (!status.ok()) return status;
  if (!send_ok) return absl::InternalError("tcp: send failed");
  return time;
}

int Run() {
  KeepFreedMemoryForReuse();  // as the services do; both sides of the comparison run under it
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  const int64_t layers = absl::GetFlag(FLAGS_num_layers);
  const int64_t row_bytes = hidden * 4;
  const int64_t rows = (absl::GetFlag(FLAGS_total_mib) << 20) / layers / row_bytes;
  const int64_t total = rows * row_bytes * layers;
  const int reps = absl::GetFlag(FLAGS_reps);
  std::vector<int64_t> chunks;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_chunk_bytes), ',')) {
    int64_t c;
    if (!absl::SimpleAtoi(s, &c) || c <= 0) {
      std::cerr << "--chunk_bytes: bad value\n";
      return 2;
    }
    chunks.push_back(c);
  }
  if (rows <= 0 || reps <= 0) {
    std::cerr << "--total_mib too small for --hidden x --num_layers, or --reps < 1\n";
    return 2;
  }

  PrecomputedBackend backend(layers, hidden, rows);
  Scheduler scheduler(&backend, SchedulerOptions{});
  ExtractorMetrics metrics;
  ExtractorLimits limits;
  limits.max_chunk_bytes = *std::max_element(chunks.begin(), chunks.end());
  ExtractorService service(&backend, &scheduler, nullptr, &metrics, limits);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(static_cast<int>(limits.max_chunk_bytes + (1 << 20)));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    std::cerr << "cannot start the loopback server\n";
    return 1;
  }
  ExtractorClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", port);
  ExtractorClient client(co);

  std::printf("stream_vs_tcp: %.0f MiB fp32 per run (%lld states of [%lld, %lld]), median of %d\n",
              total / 1048576.0, static_cast<long long>(layers), static_cast<long long>(rows),
              static_cast<long long>(hidden), reps);
  // CPU s/GiB: process CPU time (sender + receiver) per GiB moved; less sensitive than MiB/s to
  // other load on the machine.
  std::printf("%-10s %11s %11s %7s %15s %15s\n", "chunk", "grpc MiB/s", "tcp MiB/s", "ratio",
              "grpc CPU s/GiB", "tcp CPU s/GiB");
  double headline = -1;
  for (int64_t chunk : chunks) {
    ExtractParams p;
    p.sequences.push_back(InputSequence::Tokens(std::vector<int64_t>(rows, 1)));
    for (int64_t l = 0; l < layers; ++l) p.states.layer_ids.push_back(static_cast<int32_t>(l));
    p.dtype = DType::kF32;
    p.max_chunk_bytes = static_cast<uint32_t>(chunk);
    std::vector<double> grpc_s, tcp_s, grpc_cpu, tcp_cpu;
    for (int r = 0; r < reps + 1; ++r) {  // run 0 warms up
      auto g = TimeGrpc(client, p, total, backend.bytes(rows));
      if (!g.ok()) {
        std::cerr << "grpc: " << g.status() << "\n";
        return 1;
      }
      auto t = TimeTcp(backend.bytes(rows), layers, chunk);
      if (!t.ok()) {
        std::cerr << t.status() << "\n";
        return 1;
      }
      if (r > 0) {
        grpc_s.push_back(g->wall);
        tcp_s.push_back(t->wall);
        grpc_cpu.push_back(g->cpu);
        tcp_cpu.push_back(t->cpu);
      }
    }
    const double mib = total / 1048576.0;
    const double g = mib / Median(grpc_s), t = mib / Median(tcp_s);
    const double gib = total / 1073741824.0;
    std::printf("%-10s %11.0f %11.0f %7.2f %15.2f %15.2f\n",
                absl::StrCat(chunk >> 10, " KiB").c_str(), g, t, g / t, Median(grpc_cpu) / gib,
                Median(tcp_cpu) / gib);
    if (chunk == kHeadlineChunk) headline = g / t;
  }
  server->Shutdown();
  scheduler.Shutdown();
  if (headline < 0) {
    std::printf("(no %lld-byte run: the ratio needs --chunk_bytes to include it)\n",
                static_cast<long long>(kHeadlineChunk));
    return 1;
  }
  std::printf("stream_vs_tcp_ratio=%.3f\n", headline);
  return 0;
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  const std::vector<std::string> args = specwire::ParseCommandLineFlags(
      argc, argv,
      "specwire-bench-stream-vs-tcp [--total_mib 256] [--chunk_bytes 262144,1048576,4194304]\n"
      "Hidden-state bytes/s through the Extract stream vs raw loopback TCP.");
  if (!args.empty()) {
    std::cerr << "specwire-bench-stream-vs-tcp: unexpected argument " << args[0] << "\n";
    return 2;
  }
  return specwire::Run();
}
