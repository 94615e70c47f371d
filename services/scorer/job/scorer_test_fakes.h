// Fakes of the scorer's two injected parts (tests only): an extractor endpoint that makes up
// deterministic trajectories, and a drafter backend whose acceptance is a function of the
// trajectory. Neither needs weights or torch.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "services/scorer/job/score_job.h"

namespace specwire::testing {

inline ExtractionContract FakeContract(int64_t num_layers = 3, int64_t hidden = 4,
                                       int64_t vocab = 16) {
  ExtractionContract c;
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.source_layout = "text";
  c.num_layers = num_layers;
  c.hidden_size = hidden;
  c.vocab_size = vocab;
  c.layer_types.assign(num_layers, "full_attention");
  c.compute_dtype = "float32";
  c.devices.assign(num_layers, "cpu");
  c.weights_digest = "xxh3-128:00000000000000000000000000000fa4e";
  c.specwire_version = "test";
  return c;
}

inline DrafterSpec FakeDrafter(const std::string& path = "/drafters/tiny") {
  DrafterSpec d;
  d.path = path;
  d.config_json =
      R"({"block_size": 4, "dflash_config": {"mask_token_id": 15, "target_layer_ids": [0, 2]}})";
  d.block_size = 4;
  d.num_layers = 1;
  d.hidden_size = 4;
  d.target_hidden_size = 4;
  d.fc_in_features = 8;
  d.num_target_layers = 3;
  d.target_layer_ids = {0, 2};
  d.mask_token_id = 15;
  d.vocab_size = 16;
  d.dtype = "float32";
  d.device = "cpu";
  return d;
}

class FakeEndpoint : public ExtractorEndpoint {
 public:
  explicit FakeEndpoint(std::string address, ExtractionContract contract = FakeContract())
      : address_(std::move(address)), contract_(std::move(contract)) {}

  std::string address() const override { return address_; }
  absl::StatusOr<ExtractionContract> Info() override {
    if (!info_error.ok()) return info_error;
    return contract_;
  }
  absl::StatusOr<std::vector<std::vector<int64_t>>> Tokenize(const std::vector<std::string>& texts,
                                                             bool) override {
    std::vector<std::vector<int64_t>> out;
    for (const auto& t : texts) {
      std::vector<int64_t> ids;
      for (unsigned char ch : t) ids.push_back(ch % contract_.vocab_size);
      out.push_back(ids);
    }
    return out;
  }
  // Completion: (last + 1) mod 7, max_new_tokens of them; states of zeros (F32).
  absl::StatusOr<GenerateReply> Generate(const GenerateParams& p) override {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++generate_calls;
      requested_states = p.states;
      wire_dtype = p.dtype;
    }
    if (!fail_generate.ok()) return fail_generate;
    GenerateReply r;
    r.contract = contract_;
    ReceivedCompletion c;
    c.prompt_token_ids = p.prompts.at(0).token_ids;
    int64_t last = c.prompt_token_ids.back();
    for (uint32_t i = 0; i < p.max_new_tokens; ++i) {
      last = (last + 1) % 7;
      c.completion_token_ids.push_back(last);
    }
    c.finish_reason = "max_new_tokens";
    const int64_t T =
        static_cast<int64_t>(c.prompt_token_ids.size() + c.completion_token_ids.size());
    auto state = [&](std::string name, int32_t layer) {
      ReceivedState s;
      s.state = std::move(name);
      s.layer_id = layer;
      s.rows = T;
      s.hidden = contract_.hidden_size;
      s.dtype = DType::kF32;
      s.bytes.assign(static_cast<size_t>(T * s.hidden * 4), std::byte{0});
      return s;
    };
    for (int32_t id : p.states.layer_ids) r.states.push_back(state(absl::StrCat("layer.", id), id));
    if (p.states.final_norm) r.states.push_back(state("final_norm", -1));
    r.completions.push_back(std::move(c));
    return r;
  }
  absl::StatusOr<std::map<std::string, ReceivedTensor>> GetTensors(
      const std::vector<std::string>& names) override {
    ++get_tensors_calls;
    std::map<std::string, ReceivedTensor> out;
    for (const auto& n : names) {
      ReceivedTensor t;
      t.name = n;
      t.shape = {contract_.vocab_size, contract_.hidden_size};
      t.dtype = DType::kF32;
      t.bytes.resize(static_cast<size_t>(contract_.vocab_size * contract_.hidden_size * 4));
      for (size_t i = 0; i < t.bytes.size(); ++i)
        t.bytes[i] = static_cast<std::byte>(i * 7 + n.size());
      t.digest = DigestBytes(t.bytes);
      out[n] = std::move(t);
    }
    return out;
  }

  std::atomic<int> generate_calls{0};
  std::atomic<int> get_tensors_calls{0};
  int delay_ms = 0;
  absl::Status fail_generate;
  absl::Status info_error;
  StateSelection requested_states;
  DType wire_dtype = DType::kBF16;

 private:
  std::mutex mu_;
  std::string address_;
  ExtractionContract contract_;
};

// Step lengths from the trajectory: 1 + (token at the step's start mod block_size), cut at the
// end, so every prompt has its own mix of lengths; DDTree-N adds one more where it can.
class FakeBackend : public ScorerBackend {
 public:
  explicit FakeBackend(DrafterSpec spec = FakeDrafter()) : spec_(std::move(spec)) {}

  absl::StatusOr<DrafterSpec> LoadDrafter(const std::string& dir) override {
    ++loads;
    if (!load_error.ok()) return load_error;
    DrafterSpec s = spec_;
    s.path = dir;
    return s;
  }
  std::string target_head_key() const override { return head_key_; }
  absl::Status SetTargetHead(const TargetHead& head) override {
    head_key_ = head.key;
    head_shape = head.embed_tokens.shape;
    head_first_byte = head.lm_head.bytes.empty() ? std::byte{0} : head.lm_head.bytes[1];
    ++heads_set;
    return absl::OkStatus();
  }
  absl::StatusOr<ResponseAcceptance> Replay(const Trajectory& t, const ReplayAsks& asks) override {
    const TreeSettings& trees = asks.trees;
    const std::vector<SamplingSetting>& sampling = asks.sampling;
    ++replays;
    last_states = t.states.size();
    last_had_final_norm = t.final_norm.has_value();
    ResponseAcceptance r;
    const int64_t B = spec_.block_size, T = static_cast<int64_t>(t.tokens.size());
    auto run = [&](int extra) {
      std::vector<int32_t> out;
      for (int64_t start = t.prompt_len; start + 1 < T;) {
        const int64_t len =
            std::min<int64_t>({1 + (t.tokens[start] % B) + extra, B, T - 1 - start});
        out.push_back(static_cast<int32_t>(len));
        start += len;
      }
      return out;
    };
    r.step_lengths = run(0);
    last_trees = trees;
    for (int32_t b : trees.budgets) r.ddtree_step_lengths[b] = run(b > 4 ? 1 : 0);
    // Teacher-forced stand-in: τ_prob of a block is its greedy length scaled by 1 / (1 + T).
    for (const SamplingSetting& x : sampling) {
      for (const char* rule : {kRuleArgmaxDraft, kRuleDraftDistribution}) {
        SampledAcceptance a;
        a.setting = x;
        a.rule = rule;
        for (int32_t len : r.step_lengths) a.block_tau.push_back(len / (1 + x.temperature));
        a.alpha_sum.assign(B - 1, 0.5 * static_cast<double>(r.step_lengths.size()));
        a.alpha_blocks.assign(B - 1, static_cast<int64_t>(r.step_lengths.size()));
        r.sampled.push_back(a);
      }
    }
    return r;
  }

  TreeSettings last_trees;
  std::atomic<int> loads{0};
  std::atomic<int> replays{0};
  int heads_set = 0;
  size_t last_states = 0;
  bool last_had_final_norm = false;
  std::vector<int64_t> head_shape;
  std::byte head_first_byte{0};
  absl::Status load_error;

 private:
  DrafterSpec spec_;
  std::string head_key_;
};

}  // namespace specwire::testing
