// The extractor's request validation (ExtractorService::ValidateExtract / ValidateGenerate) on
// arbitrary wire bytes: the first byte picks the RPC, the rest is parsed as its request message.
// Validation returns the work or an error naming the field; work it accepts respects every limit.
#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/stubs/logging.h"
#include "services/extractor/server.h"

namespace specwire {
namespace {

// A backend with a fixed geometry. Validation must never run the engine: reaching one of its
// operations is a finding.
class FakeBackend final : public ExtractorBackend {
 public:
  explicit FakeBackend(int64_t vocab) : vocab_(vocab) {}
  const ExtractionContract& contract() const override { return contract_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t num_layers() const override { return 6; }
  absl::StatusOr<std::vector<ExtractOutput>> ExtractBatch(
      const std::vector<const ExtractWork*>&) override {
    FUZZ_CHECK(false, "validation ran ExtractBatch");
    return absl::InternalError("unreachable");
  }
  absl::StatusOr<std::unique_ptr<GenerationSequence>> StartSequence(
      const std::vector<int64_t>&, const GenerateWork&) override {
    FUZZ_CHECK(false, "validation ran StartSequence");
    return absl::InternalError("unreachable");
  }
  absl::StatusOr<TensorBytes> GetTensor(const std::string&) override {
    FUZZ_CHECK(false, "validation ran GetTensor");
    return absl::InternalError("unreachable");
  }

 private:
  int64_t vocab_;
  ExtractionContract contract_;
};

// Small limits, so that the fuzzer reaches each of them.
ExtractorLimits Limits() {
  ExtractorLimits l;
  l.max_sequences_per_request = 8;
  l.max_tokens_per_sequence = 64;
  l.max_tokens_per_request = 128;
  l.max_new_tokens = 32;
  return l;
}

void CheckCode(const absl::Status& s) {
  fuzz::CheckError(s);
  FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument ||
                 s.code() == absl::StatusCode::kFailedPrecondition ||
                 s.code() == absl::StatusCode::kResourceExhausted,
             "code %d: %s", static_cast<int>(s.code()), std::string(s.message()).c_str());
}

void CheckSequences(const std::vector<std::vector<int64_t>>& seqs, int64_t vocab) {
  const ExtractorLimits l = Limits();
  FUZZ_CHECK(!seqs.empty() && static_cast<int64_t>(seqs.size()) <= l.max_sequences_per_request,
             "%zu sequences", seqs.size());
  int64_t total = 0;
  for (const auto& s : seqs) {
    FUZZ_CHECK(!s.empty() && static_cast<int64_t>(s.size()) <= l.max_tokens_per_sequence,
               "sequence of %zu tokens", s.size());
    for (int64_t id : s)
      FUZZ_CHECK(id >= 0 && id < vocab, "token %lld", static_cast<long long>(id));
    total += static_cast<int64_t>(s.size());
  }
  FUZZ_CHECK(total <= l.max_tokens_per_request, "%lld tokens", static_cast<long long>(total));
}

void CheckSelection(const StateSelection& sel, int64_t num_layers) {
  std::set<int64_t> seen;
  for (int64_t id : sel.layer_ids) {
    FUZZ_CHECK(id >= 0 && id < num_layers, "layer %lld", static_cast<long long>(id));
    FUZZ_CHECK(seen.insert(id).second, "layer %lld twice", static_cast<long long>(id));
  }
}

}  // namespace
}  // namespace specwire

// Parsing arbitrary bytes makes protobuf log every invalid UTF-8 string; the fuzzer's output
// should show findings only.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace specwire;
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    auto t = Tokenizer::FromJson(fuzz::ReadFileOrDie(fuzz::DataPath("qwen_style.json")));
    FUZZ_CHECK(t.ok(), "tokenizer: %s", std::string(t.status().message()).c_str());
    return *std::move(t);
  }();
  static FakeBackend backend(tokenizer->vocab_size());
  // Validation touches neither the scheduler nor the metrics.
  static ExtractorService with_tokenizer(&backend, nullptr, tokenizer.get(), nullptr, Limits());
  static ExtractorService without_tokenizer(&backend, nullptr, nullptr, nullptr, Limits());
  if (size == 0) return 0;
  const ExtractorService& service = (data[0] & 2) ? without_tokenizer : with_tokenizer;
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const int n = static_cast<int>(size - 1);

  if (data[0] & 1) {
    v1::GenerateRequest request;
    if (!request.ParseFromArray(bytes, n)) return 0;
    auto work = service.ValidateGenerate(request);
    if (!work.ok()) {
      CheckCode(work.status());
      return 0;
    }
    CheckSequences(work->prompts, backend.vocab_size());
    CheckSelection(work->selection, backend.num_layers());
    FUZZ_CHECK(work->max_new_tokens >= 1 && work->max_new_tokens <= Limits().max_new_tokens,
               "max_new_tokens %lld", static_cast<long long>(work->max_new_tokens));
    for (int64_t id : work->stop_token_ids) {
      FUZZ_CHECK(id >= 0 && id < backend.vocab_size(), "stop id %lld", static_cast<long long>(id));
    }
  } else {
    v1::ExtractRequest request;
    if (!request.ParseFromArray(bytes, n)) return 0;
    auto work = service.ValidateExtract(request);
    if (!work.ok()) {
      CheckCode(work.status());
      return 0;
    }
    CheckSequences(work->sequences, backend.vocab_size());
    CheckSelection(work->selection, backend.num_layers());
    FUZZ_CHECK(!work->selection.empty(), "empty selection accepted");
  }
  return 0;
}
