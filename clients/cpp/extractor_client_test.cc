// ExtractorClient against in-process servers on loopback: a scripted service that sends exactly
// the messages a test lists (to break the stream on purpose), and the real ExtractorService over a
// fake backend (to check the whole path end to end).
#include "clients/cpp/extractor_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/wire.h"
#include "proto/specwire/v1/extractor.grpc.pb.h"
#include "services/extractor/metrics.h"
#include "services/extractor/scheduler.h"
#include "services/extractor/server.h"

namespace specwire {
namespace {

constexpr int64_t kHidden = 4;

ExtractionContract TinyContract() {
  ExtractionContract c;
  c.architecture = "TinyForTest";
  c.model_type = "tiny";
  c.source_layout = "text";
  c.num_layers = 3;
  c.hidden_size = kHidden;
  c.vocab_size = 100;
  c.layer_types = {"full_attention", "full_attention", "linear_attention"};
  c.compute_dtype = "float32";
  c.devices = {"cpu", "cpu", "cpu"};
  c.skipped = {{"mtp.", 2, "multi-token prediction head"}};
  c.weights_digest = "xxh3-128:00";
  c.specwire_version = "test";
  return c;
}

// rows x kHidden fp32 values start, start + 1, ...
std::vector<std::byte> Matrix(int64_t rows, float start) {
  std::vector<float> v(rows * kHidden);
  std::iota(v.begin(), v.end(), start);
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

v1::HiddenStateChunk Chunk(uint32_t seq, int32_t layer, int64_t rows,
                           const std::vector<std::byte>& m, int64_t row_start, int64_t row_count) {
  v1::HiddenStateChunk c;
  c.set_sequence_index(seq);
  c.mutable_state()->set_tap(v1::TAP_LAYER_OUTPUT);
  c.mutable_state()->set_layer_id(layer);
  c.set_hf_hidden_states_index(layer + 1);
  c.set_token_start(static_cast<uint32_t>(row_start));
  c.set_token_count(static_cast<uint32_t>(row_count));
  c.set_sequence_length(static_cast<uint32_t>(rows));
  c.set_hidden_size(kHidden);
  c.set_dtype(v1::WIRE_DTYPE_F32);
  auto bytes =
      std::span<const std::byte>(m).subspan(row_start * kHidden * 4, row_count * kHidden * 4);
  c.set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  c.set_crc32c(Crc32c(bytes));
  return c;
}

// Sends the listed messages, then finishes with `status`.
class ScriptedExtractor final : public v1::Extractor::Service {
 public:
  std::vector<v1::ExtractResponse> extract;
  std::vector<v1::GenerateResponse> generate;
  std::vector<v1::TensorChunk> tensors;
  grpc::Status status = grpc::Status::OK;

  grpc::Status GetModelInfo(grpc::ServerContext*, const v1::GetModelInfoRequest*,
                            v1::ExtractionContract* out) override {
    ContractToProto(TinyContract(), out);
    return status;
  }
  grpc::Status Extract(grpc::ServerContext*, const v1::ExtractRequest*,
                       grpc::ServerWriter<v1::ExtractResponse>* w) override {
    for (const auto& m : extract) w->Write(m);
    return status;
  }
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateResponse>* w) override {
    for (const auto& m : generate) w->Write(m);
    return status;
  }
  grpc::Status GetTensors(grpc::ServerContext*, const v1::GetTensorsRequest*,
                          grpc::ServerWriter<v1::TensorChunk>* w) override {
    for (const auto& m : tensors) w->Write(m);
    return status;
  }
};

// A server on a free loopback port for one test.
class LoopbackServer {
 public:
  explicit LoopbackServer(grpc::Service* service) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(service);
    server_ = b.BuildAndStart();
  }
  ~LoopbackServer() { server_->Shutdown(); }
  ExtractorClientOptions options() const {
    ExtractorClientOptions o;
    o.target = absl::StrCat("127.0.0.1:", port_);
    o.timeout_seconds = 30;
    return o;
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class ScriptedTest : public ::testing::Test {
 protected:
  ScriptedTest() {
    v1::ExtractResponse m;
    ContractToProto(TinyContract(), m.mutable_contract());
    service_.extract.push_back(m);
  }
  void Sequence(uint32_t seq, std::vector<int32_t> ids) {
    v1::ExtractResponse m;
    m.mutable_sequence()->set_sequence_index(seq);
    for (int32_t id : ids) m.mutable_sequence()->add_token_ids(id);
    service_.extract.push_back(m);
  }
  void Add(const v1::HiddenStateChunk& c) {
    v1::ExtractResponse m;
    *m.mutable_chunk() = c;
    service_.extract.push_back(m);
    ++chunks_;
    bytes_ += c.data().size();
  }
  void Trailer() {
    v1::ExtractResponse m;
    m.mutable_trailer()->set_chunks(chunks_);
    m.mutable_trailer()->set_bytes(bytes_);
    m.mutable_trailer()->set_request_id("r1");
    service_.extract.push_back(m);
  }
  absl::StatusOr<ExtractReply> Call(int sequences = 1) {
    LoopbackServer server(&service_);
    ExtractorClient client(server.options());
    ExtractParams p;
    for (int i = 0; i < sequences; ++i) p.sequences.push_back(InputSequence::Tokens({1, 2, 3}));
    p.states.layer_ids = {0, 2};
    p.dtype = DType::kF32;
    return client.Extract(p);
  }

  ScriptedExtractor service_;
  uint64_t chunks_ = 0, bytes_ = 0;
};

TEST_F(ScriptedTest, ReassemblesStatesFromChunks) {
  const auto a = Matrix(3, 0), b = Matrix(3, 100);
  Sequence(0, {1, 2, 3});
  Add(Chunk(0, 0, 3, a, 0, 2));
  Add(Chunk(0, 0, 3, a, 2, 1));
  Add(Chunk(0, 2, 3, b, 0, 3));
  Trailer();
  auto reply = Call();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->contract, TinyContract());
  EXPECT_EQ(reply->token_ids, (std::vector<std::vector<int64_t>>{{1, 2, 3}}));
  ASSERT_EQ(reply->states.size(), 2u);
  EXPECT_EQ(reply->states[0].TensorName(), "seq.0.layer.0");
  EXPECT_EQ(reply->states[0].hf_hidden_states_index, 1);
  EXPECT_EQ(reply->states[0].rows, 3);
  EXPECT_EQ(reply->states[0].hidden, kHidden);
  EXPECT_EQ(reply->states[0].dtype, DType::kF32);
  EXPECT_EQ(reply->states[0].bytes, a);
  EXPECT_EQ(reply->states[1].TensorName(), "seq.0.layer.2");
  EXPECT_EQ(reply->states[1].bytes, b);
  EXPECT_EQ(reply->totals.request_id, "r1");
  EXPECT_EQ(reply->totals.chunks, 3u);
}

TEST_F(ScriptedTest, StreamWithoutTrailerIsIncomplete) {
  const auto a = Matrix(3, 0);
  Sequence(0, {1, 2, 3});
  Add(Chunk(0, 0, 3, a, 0, 3));
  auto reply = Call();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(reply.status().message().find("trailer"), absl::string_view::npos) << reply.status();
}

TEST_F(ScriptedTest, ServerErrorWinsOverMissingTrailer) {
  Sequence(0, {1, 2, 3});
  service_.status = grpc::Status(grpc::RESOURCE_EXHAUSTED, "queue is full");
  auto reply = Call();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reply.status().message(), "queue is full");
}

TEST_F(ScriptedTest, CrcMismatchIsDataLoss) {
  const auto a = Matrix(3, 0);
  Sequence(0, {1, 2, 3});
  auto c = Chunk(0, 0, 3, a, 0, 3);
  c.set_crc32c(c.crc32c() ^ 1);
  Add(c);
  Trailer();
  auto reply = Call();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(reply.status().message().find("seq.0.layer.0"), absl::string_view::npos);
}

TEST_F(ScriptedTest, PartlySentStateAtTrailerIsDataLoss) {
  const auto a = Matrix(3, 0);
  Sequence(0, {1, 2, 3});
  Add(Chunk(0, 0, 3, a, 0, 2));
  Trailer();
  EXPECT_EQ(Call().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(ScriptedTest, TrailerTotalsMustMatch) {
  const auto a = Matrix(3, 0);
  Sequence(0, {1, 2, 3});
  Add(Chunk(0, 0, 3, a, 0, 3));
  bytes_ += 1;
  Trailer();
  auto reply = Call();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(reply.status().message().find("trailer counts"), absl::string_view::npos);
}

TEST_F(ScriptedTest, RowsMustMatchTheSequence) {
  const auto a = Matrix(2, 0);
  Sequence(0, {1, 2, 3});
  Add(Chunk(0, 0, 2, a, 0, 2));  // 2 rows for a 3-token sequence
  Trailer();
  EXPECT_EQ(Call().status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(ScriptedTest, ContractMustComeFirst) {
  service_.extract.clear();
  Sequence(0, {1, 2, 3});
  Trailer();
  auto reply = Call();
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(reply.status().message().find("contract"), absl::string_view::npos);
}

TEST_F(ScriptedTest, SinkErrorCancelsTheCall) {
  const auto a = Matrix(3, 0);
  Sequence(0, {1, 2, 3});
  Add(Chunk(0, 0, 3, a, 0, 3));
  Add(Chunk(0, 2, 3, a, 0, 3));
  Trailer();
  LoopbackServer server(&service_);
  ExtractorClient client(server.options());
  ExtractParams p;
  p.sequences.push_back(InputSequence::Tokens({1, 2, 3}));
  p.states.layer_ids = {0, 2};
  int seen = 0;
  auto reply = client.Extract(p, [&](ReceivedState&&) {
    ++seen;
    return absl::AbortedError("enough");
  });
  EXPECT_EQ(reply.status(), absl::AbortedError("enough"));
  EXPECT_EQ(seen, 1);
}

TEST(ExtractorClientTest, GenerateStatesCoverPromptAndCompletion) {
  ScriptedExtractor service;
  v1::GenerateResponse m;
  ContractToProto(TinyContract(), m.mutable_contract());
  service.generate.push_back(m);
  m.Clear();
  auto* c = m.mutable_completion();
  c->add_prompt_token_ids(5);
  c->add_prompt_token_ids(6);
  c->add_completion_token_ids(7);
  c->set_finish_reason("max_new_tokens");
  service.generate.push_back(m);
  const auto a = Matrix(3, 7);
  m.Clear();
  *m.mutable_chunk() = Chunk(0, 1, 3, a, 0, 3);
  service.generate.push_back(m);
  m.Clear();
  m.mutable_trailer()->set_chunks(1);
  m.mutable_trailer()->set_bytes(a.size());
  service.generate.push_back(m);

  LoopbackServer server(&service);
  ExtractorClient client(server.options());
  GenerateParams p;
  p.prompts.push_back(InputSequence::Tokens({5, 6}));
  p.max_new_tokens = 1;
  p.states.layer_ids = {1};
  auto reply = client.Generate(p);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->completions.size(), 1u);
  EXPECT_EQ(reply->completions[0].completion_token_ids, std::vector<int64_t>{7});
  EXPECT_EQ(reply->completions[0].finish_reason, "max_new_tokens");
  ASSERT_EQ(reply->states.size(), 1u);
  EXPECT_EQ(reply->states[0].TensorName(), "seq.0.layer.1");
  EXPECT_EQ(reply->states[0].bytes, a);
}

TEST(ExtractorClientTest, GetTensorsChecksTheDigest) {
  ScriptedExtractor service;
  const auto bytes = Matrix(2, 0);  // a [2, 4] fp32 tensor in two chunks
  for (int half = 0; half < 2; ++half) {
    v1::TensorChunk c;
    c.set_name("lm_head.weight");
    c.add_shape(2);
    c.add_shape(kHidden);
    c.set_dtype(v1::WIRE_DTYPE_F32);
    c.set_offset(half * 16);
    c.set_total_bytes(bytes.size());
    auto piece = std::span<const std::byte>(bytes).subspan(half * 16, 16);
    c.set_data(reinterpret_cast<const char*>(piece.data()), piece.size());
    c.set_crc32c(Crc32c(piece));
    c.set_digest(DigestBytes(bytes));
    service.tensors.push_back(c);
  }
  {
    LoopbackServer server(&service);
    ExtractorClient client(server.options());
    auto t = client.GetTensors({"lm_head.weight"});
    ASSERT_TRUE(t.ok()) << t.status();
    const ReceivedTensor& r = t->at("lm_head.weight");
    EXPECT_EQ(r.shape, (std::vector<int64_t>{2, kHidden}));
    EXPECT_EQ(r.dtype, DType::kF32);
    EXPECT_EQ(r.bytes, bytes);
    EXPECT_EQ(client.GetTensors({"lm_head.weight", "other"}).status().code(),
              absl::StatusCode::kDataLoss);
  }
  for (auto& c : service.tensors) c.set_digest("xxh3-128:0");
  LoopbackServer server(&service);
  ExtractorClient client(server.options());
  EXPECT_EQ(client.GetTensors({"lm_head.weight"}).status().code(), absl::StatusCode::kDataLoss);
}

TEST(ExtractorClientTest, UnreachableServerIsUnavailable) {
  ExtractorClientOptions o;
  o.target = "127.0.0.1:1";
  ExtractorClient client(o);
  EXPECT_EQ(client.Info().status().code(), absl::StatusCode::kUnavailable);
}

// The real service: every state of every sequence arrives intact and named as specwire-extract
// names them, whatever the chunk size.
class FakeBackend final : public ExtractorBackend {
 public:
  const ExtractionContract& contract() const override { return contract_; }
  absl::StatusOr<std::vector<ExtractOutput>> ExtractBatch(
      const std::vector<const ExtractWork*>& works) override {
    std::vector<ExtractOutput> out;
    for (const ExtractWork* w : works) {
      ExtractOutput o;
      for (size_t s = 0; s < w->sequences.size(); ++s) {
        const int64_t rows = static_cast<int64_t>(w->sequences[s].size());
        auto add = [&](StateTap tap, int64_t layer) {
          // Values depend on (sequence, state) so a mix-up shows.
          auto bytes = std::make_shared<std::vector<std::byte>>(Matrix(
              rows, static_cast<float>(1000 * s + 10 * (layer + 2) + static_cast<int>(tap))));
          HostState h;
          h.sequence_index = static_cast<uint32_t>(s);
          h.tap = tap;
          h.layer_id = static_cast<int32_t>(layer);
          h.hf_index = HfHiddenStatesIndex(tap, layer, contract_.num_layers);
          h.rows = rows;
          h.hidden = kHidden;
          h.dtype = DType::kF32;
          h.bytes = *bytes;
          h.owner = bytes;
          o.states.push_back(std::move(h));
        };
        if (w->selection.embedding) add(StateTap::kEmbedding, -1);
        for (int64_t l : w->selection.layer_ids) add(StateTap::kLayerOutput, l);
        if (w->selection.final_norm) add(StateTap::kFinalNorm, -1);
      }
      out.push_back(std::move(o));
    }
    return out;
  }
  absl::StatusOr<TensorBytes> GetTensor(const std::string& name) override {
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\""));
  }

 private:
  ExtractionContract contract_ = TinyContract();
};

TEST(ExtractorClientTest, EndToEndThroughTheRealService) {
  FakeBackend backend;
  Scheduler scheduler(&backend, SchedulerOptions{});
  ExtractorMetrics metrics;
  ExtractorService service(&backend, &scheduler, nullptr, &metrics, ExtractorLimits{});
  LoopbackServer server(&service);
  ExtractorClient client(server.options());

  auto info = client.Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(*info, TinyContract());

  ExtractParams p;
  p.sequences = {InputSequence::Tokens({1, 2, 3, 4, 5}), InputSequence::Tokens({6, 7})};
  p.states.layer_ids = {2, 0};
  p.states.embedding = true;
  p.states.final_norm = true;
  p.dtype = DType::kF32;
  p.max_chunk_bytes = 2 * kHidden * 4;  // two rows a chunk: several chunks per state
  auto reply = client.Extract(p);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->token_ids, (std::vector<std::vector<int64_t>>{{1, 2, 3, 4, 5}, {6, 7}}));
  std::vector<std::string> names;
  for (const auto& s : reply->states) {
    names.push_back(s.TensorName());
    const float start = 1000.0f * s.sequence_index + 10.0f * (s.layer_id + 2) +
                        (s.state == "embedding"    ? 1
                         : s.state == "final_norm" ? 2
                                                   : 0);
    EXPECT_EQ(s.bytes, Matrix(s.rows, start)) << s.TensorName();
  }
  EXPECT_EQ(names, (std::vector<std::string>{"seq.0.embedding", "seq.0.layer.2", "seq.0.layer.0",
                                             "seq.0.final_norm", "seq.1.embedding", "seq.1.layer.2",
                                             "seq.1.layer.0", "seq.1.final_norm"}));
  EXPECT_EQ(reply->totals.chunks, 16u);  // per state: 3 chunks (5 rows) or 1 (2 rows)

  p.states.layer_ids = {7};
  auto bad = client.Extract(p);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("layers.layer_ids[0] = 7"), absl::string_view::npos);
}

}  // namespace
}  // namespace specwire
