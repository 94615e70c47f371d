#include "services/extractor/torch_backend.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/memory_policy.h"
#include "common/models/cpu_threads.h"
#include "common/models/kernel_set.h"
#include "common/models/target_session.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "common/models/engine.h"

namespace specwire {
namespace {

// A host tensor's bytes, kept alive by a shared_ptr that owns the tensor.
HostState ToHostState(at::Tensor t, uint32_t seq, StateTap tap, int32_t layer_id,
                      int64_t num_layers) {
  t = t.contiguous();
  auto owner = std::make_shared<at::Tensor>(t);
  HostState s;
  s.sequence_index = seq;
  s.tap = tap;
  s.layer_id = layer_id;
  s.hf_index = HfHiddenStatesIndex(tap, layer_id, num_layers);
  s.rows = t.size(0);
  s.hidden = t.size(1);
  s.dtype = FromScalarType(t.scalar_type()).value();
  s.bytes = std::span<const std::byte>(static_cast<const std::byte*>(owner->data_ptr()), owner->nbytes());
  s.owner = std::move(owner);
  return s;
}

// States of one sequence, in a fixed order: embedding, layers ascending, final norm.
void AppendStates(const SequenceStates& st, const StateSelection& want, uint32_t seq,
                  int64_t num_layers, at::ScalarType dtype, std::vector<HostState>& out) {
  if (want.embedding) {
    out.push_back(ToHostState(st.embedding.to(dtype), seq, StateTap::kEmbedding, 0, num_layers));
  }
  std::vector<int64_t> ids = want.layer_ids;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  for (int64_t id : ids) {
    out.push_back(ToHostState(st.layers.at(id).to(dtype), seq, StateTap::kLayerOutput,
                              static_cast<int32_t>(id), num_layers));
  }
  if (want.final_norm) {
    out.push_back(ToHostState(st.final_norm.to(dtype), seq, StateTap::kFinalNorm, 0, num_layers));
  }
}

// One prompt's generation: GreedySequence behind the rpc side's interface.
class TorchSequence final : public GenerationSequence {
 public:
  explicit TorchSequence(std::unique_ptr<GreedySequence> s) : seq(std::move(s)) {}
  int64_t pending_prompt_tokens() const override { return seq->pending_prompt_tokens(); }
  bool decoding() const override { return seq->decoding(); }
  bool finished() const override { return seq->finished(); }
  void Cancel() override { seq->Cancel(); }
  const std::vector<int64_t>& prompt() const override { return seq->prompt(); }
  CompletionOutput completion() const override {
    return {seq->result().tokens, seq->result().finish_reason};
  }
  std::unique_ptr<GreedySequence> seq;
};

// States of a session's rows ([1, rows, H] captures), in AppendStates' order.
std::vector<HostState> SessionStates(const CapturedStates& c, const StateSelection& want,
                                     int64_t num_layers, at::ScalarType dtype) {
  SequenceStates st;
  if (c.embedding.defined()) st.embedding = c.embedding.select(0, 0).to(at::kCPU);
  for (const auto& [id, t] : c.layers) st.layers[id] = t.select(0, 0).to(at::kCPU);
  if (c.final_norm.defined()) st.final_norm = c.final_norm.select(0, 0).to(at::kCPU);
  std::vector<HostState> out;
  AppendStates(st, want, 0, num_layers, dtype, out);
  return out;
}

class TorchLiveSession final : public LiveSession {
 public:
  TorchLiveSession(std::unique_ptr<TargetSession> s, StateSelection selection, DType dtype,
                   int64_t num_layers)
      : session_(std::move(s)),
        selection_(std::move(selection)),
        dtype_(ToScalarType(dtype)),
        num_layers_(num_layers) {}

  absl::StatusOr<VerifyOutput> Verify(const VerifyWork& work) override {
    BindIntraOpThreads();
    VerifyDraft draft;
    draft.tokens = work.tokens;
    draft.parents = work.parents;
    draft.rule = work.rule == DraftRule::kDraftDistribution ? VerifyRule::kDraftDistribution
                                                            : VerifyRule::kArgmaxDraft;
    VerifyOutput out;
    SW_RETURN_IF_ERROR(RunGuarded("session verify", [&]() -> absl::Status {
      if (draft.rule == VerifyRule::kDraftDistribution && !work.draft_probs.empty()) {
        const int64_t k = static_cast<int64_t>(work.tokens.size());
        const int64_t n = static_cast<int64_t>(work.draft_probs.size());
        draft.draft_q = at::from_blob(const_cast<float*>(work.draft_probs.data()), {n},
                                      at::kFloat)
                            .view({k > 0 && n % k == 0 ? k : 1, k > 0 && n % k == 0 ? n / k : n});
      }
      SW_ASSIGN_OR_RETURN(VerifyOutcome v, session_->Verify(draft));
      out.position = v.position;
      out.accepted = v.accepted;
      out.accepted_tokens = std::move(v.accepted_tokens);
      out.path = std::move(v.path);
      out.next_token = v.next_token;
      out.target_argmax = std::move(v.target_argmax);
      out.states = SessionStates(v.states, selection_, num_layers_, dtype_);
      return absl::OkStatus();
    }));
    if (work.commit_accepted) {
      SW_ASSIGN_OR_RETURN(out.committed, Commit(out.accepted));
    }
    return out;
  }

  absl::StatusOr<SessionCommitted> Commit(int64_t accepted) override {
    BindIntraOpThreads();
    SessionCommitted out;
    const int64_t before = session_->rollback_tokens();
    SW_RETURN_IF_ERROR(RunGuarded("session commit", [&]() -> absl::Status {
      return session_->Commit(accepted);
    }));
    out.tokens = session_->cached_tokens();
    out.next_token = session_->pending_token();
    out.rollback_tokens = session_->rollback_tokens() - before;
    return out;
  }

  int64_t bytes() const override { return session_->bytes(); }

 private:
  std::unique_ptr<TargetSession> session_;
  StateSelection selection_;
  at::ScalarType dtype_;
  int64_t num_layers_;
};

class TorchBackend : public ExtractorBackend {
 public:
  explicit TorchBackend(std::unique_ptr<ExtractionEngine> engine)
      : engine_(std::move(engine)), cache_cost_(MeasureCacheCost(engine_->model())) {}

  const ExtractionContract& contract() const override { return engine_->contract(); }
  int64_t vocab_size() const override { return engine_->config().vocab_size; }
  int64_t num_layers() const override { return engine_->config().num_layers; }
  std::vector<int64_t> eos_token_ids() const override { return engine_->config().eos_token_ids; }

  absl::StatusOr<std::vector<ExtractOutput>> ExtractBatch(
      const std::vector<const ExtractWork*>& works) override {
    // Every sequence of every request in one engine call (per sequence or padded: the engine's
    // batch layout), capturing the union of what they asked for; each request then takes its
    // own states in its own wire dtype.
    BindIntraOpThreads();
    std::vector<std::vector<int64_t>> all;
    StateSelection united;
    bool same_dtype = true;
    for (const ExtractWork* w : works) {
      all.insert(all.end(), w->sequences.begin(), w->sequences.end());
      united.layer_ids.insert(united.layer_ids.end(), w->selection.layer_ids.begin(),
                              w->selection.layer_ids.end());
      united.embedding |= w->selection.embedding;
      united.final_norm |= w->selection.final_norm;
      same_dtype &= w->wire_dtype == works.front()->wire_dtype;
    }
    std::sort(united.layer_ids.begin(), united.layer_ids.end());
    united.layer_ids.erase(std::unique(united.layer_ids.begin(), united.layer_ids.end()),
                           united.layer_ids.end());
    const at::ScalarType out_dtype =
        same_dtype ? ToScalarType(works.front()->wire_dtype) : at::kFloat;
    SW_ASSIGN_OR_RETURN(std::vector<SequenceStates> states,
                        engine_->Extract(all, CaptureOf(united), out_dtype));
    std::vector<ExtractOutput> outputs(works.size());
    absl::Status status = RunGuarded("extract", [&]() -> absl::Status {
      size_t next = 0;
      for (size_t w = 0; w < works.size(); ++w) {
        const at::ScalarType dtype = ToScalarType(works[w]->wire_dtype);
        for (size_t i = 0; i < works[w]->sequences.size(); ++i) {
          AppendStates(states[next++], works[w]->selection, static_cast<uint32_t>(i), num_layers(),
                       dtype, outputs[w].states);
        }
      }
      return absl::OkStatus();
    });
    SW_RETURN_IF_ERROR(status);
    return outputs;
  }

  absl::StatusOr<std::unique_ptr<GenerationSequence>> StartSequence(
      const std::vector<int64_t>& prompt, const GenerateWork& work) override {
    GenerateOptions opts;
    opts.max_new_tokens = work.max_new_tokens;
    opts.stop_token_ids = work.stop_token_ids;
    opts.use_config_eos = work.use_model_eos;
    SW_ASSIGN_OR_RETURN(std::unique_ptr<GreedySequence> s,
                        GreedySequence::Start(engine_->model(), prompt, opts));
    return std::unique_ptr<GenerationSequence>(new TorchSequence(std::move(s)));
  }

  absl::Status PrefillChunk(GenerationSequence& sequence) override {
    BindIntraOpThreads();
    return RunGuarded("generate (prefill)", [&]() -> absl::Status {
      static_cast<TorchSequence&>(sequence).seq->PrefillChunk();
      return absl::OkStatus();
    });
  }

  absl::Status DecodeStep(const std::vector<GenerationSequence*>& sequences) override {
    std::vector<GreedySequence*> batch;
    for (GenerationSequence* s : sequences) batch.push_back(static_cast<TorchSequence*>(s)->seq.get());
    BindIntraOpThreads();
    return RunGuarded("generate (decode)", [&]() -> absl::Status {
      specwire::DecodeStep(engine_->model(), batch);
      return absl::OkStatus();
    });
  }

  int64_t SequenceBytes(int64_t tokens) const override { return cache_cost_.Bytes(tokens); }

  absl::StatusOr<std::unique_ptr<LiveSession>> OpenSession(const SessionWork& work,
                                                           SessionOpenOutput* opened) override {
    BindIntraOpThreads();
    TargetSessionOptions options;
    options.max_new_tokens = work.max_new_tokens;
    options.max_draft_tokens = work.max_draft_tokens;
    options.sampling = {work.temperature, work.top_p, work.top_k};
    options.seed = work.seed;
    options.capture = CaptureOf(work.selection);
    std::unique_ptr<LiveSession> live;
    SW_RETURN_IF_ERROR(RunGuarded("session open", [&]() -> absl::Status {
      SW_ASSIGN_OR_RETURN(std::unique_ptr<TargetSession> s,
                          TargetSession::Open(engine_->model(), work.prompt, options));
      opened->next_token = s->pending_token();
      opened->capacity = s->capacity();
      opened->states = SessionStates(s->prompt_states(), work.selection, num_layers(),
                                     ToScalarType(work.wire_dtype));
      live = std::make_unique<TorchLiveSession>(std::move(s), work.selection, work.wire_dtype,
                                                num_layers());
      return absl::OkStatus();
    }));
    return live;
  }

  absl::StatusOr<TensorBytes> GetTensor(const std::string& name) override {
    return engine_->StoredTensor(name);
  }

 private:
  std::unique_ptr<ExtractionEngine> engine_;
  CacheCost cache_cost_;  // of one sequence's cache
};

}  // namespace

absl::StatusOr<std::unique_ptr<ExtractorBackend>> LoadTorchBackend(const BackendOptions& options) {
  if (options.threads > 0) at::set_num_threads(options.threads);
  KeepFreedMemoryForReuse();
  SW_ASSIGN_OR_RETURN(CpuBinding binding, ParseCpuBinding(options.cpu_binding, options.threads));
  SetCpuBinding(std::move(binding));
  BindIntraOpThreads();  // the canary's forward runs on this thread
  LoadOptions load;
  SW_ASSIGN_OR_RETURN(load.dtype, ParseComputeDtype(options.dtype));
  if (options.batch_layout != "auto") {  // refused before the model loads
    SW_RETURN_IF_ERROR(ParseBatchLayout(options.batch_layout, "--batch_layout").status());
  }
  load.device_map = options.device_map;
  load.canary_tokens = options.canary_tokens;
  SW_ASSIGN_OR_RETURN(load.kernels, ParseKernelSet(options.kernels, "--kernels"));
  SW_ASSIGN_OR_RETURN(auto engine, ExtractionEngine::Load(options.model_dir, load));
  SW_RETURN_IF_ERROR(engine->SetBatchLayout(options.batch_layout, "--batch_layout"));
  return std::unique_ptr<ExtractorBackend>(new TorchBackend(std::move(engine)));
}

}  // namespace specwire
