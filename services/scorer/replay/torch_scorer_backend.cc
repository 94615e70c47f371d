// The libtorch side of the scorer: the drafter (any family: drafters/registry.h) and
// AcceptanceReplay behind the plain types of job/scorer_backend.h, so neither the job runner nor
// the rpc code sees torch.
#include "services/scorer/job/scorer_backend.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/drafters/registry.h"
#include "services/scorer/replay/live_loop.h"
#include "services/scorer/replay/replay.h"

namespace specwire {
namespace {

// Identifies a drafter directory's contents cheaply: names, sizes and modification times of its
// files. A changed file (a re-trained drafter written to the same path) reloads the drafter.
std::string DirectoryStamp(const std::string& dir) {
  std::error_code ec;
  std::string stamp;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const auto size = e.file_size(ec);
    const auto mtime = e.last_write_time(ec).time_since_epoch().count();
    absl::StrAppend(&stamp, e.path().filename().string(), ":", size, ":", mtime, ";");
  }
  return stamp;
}

// A tensor over someone else's bytes (not copied; read only).
at::Tensor Borrow(std::span<const std::byte> bytes, const std::vector<int64_t>& shape,
                  DType dtype) {
  void* p = const_cast<std::byte*>(bytes.data());
  return at::from_blob(p, shape, at::TensorOptions().dtype(ToScalarType(dtype)));
}

class TorchScorerBackend : public ScorerBackend {
 public:
  TorchScorerBackend(at::ScalarType dtype, at::Device device) : dtype_(dtype), device_(device) {}

  absl::StatusOr<DrafterSpec> LoadDrafter(const std::string& dir) override {
    const std::string stamp = DirectoryStamp(dir);
    if (drafter_ && dir == drafter_dir_ && stamp == drafter_stamp_) return drafter_->spec();
    drafter_.reset();
    SW_ASSIGN_OR_RETURN(drafter_, specwire::LoadDrafter(dir, dtype_, device_));
    // The head is attached at the first replay: the job checks the drafter against the
    // extractor's contract first, and a misfit must be reported as that, not as a head error.
    head_on_drafter_ = false;
    drafter_dir_ = dir;
    drafter_stamp_ = stamp;
    return drafter_->spec();
  }

  absl::Status FitDrafterToTarget(DrafterSpec& spec, int64_t target_layers) override {
    if (!drafter_) return absl::FailedPreconditionError("no drafter loaded");
    SW_RETURN_IF_ERROR(drafter_->FitTargetLayers(target_layers));
    spec = drafter_->spec();
    return absl::OkStatus();
  }

  std::string target_head_key() const override { return head_key_; }

  absl::Status SetTargetHead(const TargetHead& head) override {
    at::Tensor embed, lm;
    SW_RETURN_IF_ERROR(RunGuarded("copying the target head", [&]() -> absl::Status {
      embed = Own(head.embed_tokens);
      lm = Own(head.lm_head);
      return absl::OkStatus();
    }));
    head_embed_ = embed;
    head_lm_ = lm;
    head_key_ = head.key;
    head_on_drafter_ = false;
    return absl::OkStatus();
  }

  absl::StatusOr<ResponseAcceptance> Replay(const Trajectory& t, const ReplayAsks& asks) override {
    SW_ASSIGN_OR_RETURN(std::vector<ResponseAcceptance> out, ReplayBatch({&t}, asks));
    return std::move(out.front());
  }

  absl::StatusOr<std::vector<ResponseAcceptance>> ReplayBatch(
      const std::vector<const Trajectory*>& batch, const ReplayAsks& asks) override {
    const TreeSettings& trees = asks.trees;
    const std::vector<SamplingSetting>& sampling = asks.sampling;
    SW_RETURN_IF_ERROR(AttachHead());
    for (size_t b = 0; b < batch.size(); ++b) {
      absl::Status st = CheckTrajectory(*batch[b], !sampling.empty());
      if (!st.ok()) {
        return batch.size() == 1 ? st : Annotate(st, absl::StrCat("trajectory ", b, " of the batch"));
      }
    }
    std::vector<ResponseAcceptance> out;
    SW_RETURN_IF_ERROR(RunGuarded("acceptance replay", [&]() -> absl::Status {
      std::vector<at::Tensor> features;
      std::vector<ReplayInput> inputs;
      for (const Trajectory* t : batch) {
        std::vector<at::Tensor> parts;
        for (const FeatureState& s : t->states)
          parts.push_back(Borrow(s.bytes, {s.rows, s.hidden}, s.dtype));
        // [T, n × H]: the states of target_layer_ids concatenated in that order (dflash's
        // extract_context_feature); cat copies, so the wire bytes may go after this.
        features.push_back(at::cat(parts, -1).to(device_, dtype_));
      }
      for (size_t b = 0; b < batch.size(); ++b) {
        inputs.push_back(ReplayInput{&batch[b]->tokens, &features[b], batch[b]->prompt_len,
                                     batch[b]->max_length});
      }
      ReplayOptions options;
      options.max_batch = static_cast<int32_t>(std::max<size_t>(batch.size(), 1));
      // DDTree reads a DFlash block's parallel marginals (ResolveTrees gives DFlash2 no tree).
      if (trees.method == kTreeDDTree) options.ddtree_budgets = trees.budgets;
      else options.ddtree_budgets.clear();
      std::unique_ptr<BlockDrafter> block = drafter_->Chain();
      // The trajectories replay in lockstep: one drafter forward for all their blocks.
      out = AcceptanceReplay(block.get()).RunBatch(inputs, options);
      // A family's own tree (EAGLE's top-k tree): its own loop per budget, each step advancing by
      // the tree's acceptance.
      if (trees.method == kTreeEagle) {
        ReplayOptions tree_options = options;
        tree_options.ddtree_budgets.clear();
        for (int32_t budget : trees.budgets) {
          std::unique_ptr<BlockDrafter> tree = drafter_->Tree(trees, budget);
          if (!tree) break;
          std::vector<ResponseAcceptance> r = AcceptanceReplay(tree.get()).RunBatch(inputs, tree_options);
          for (size_t b = 0; b < batch.size(); ++b) {
            out[b].ddtree_step_lengths[budget] = std::move(r[b].step_lengths);
          }
        }
      }
      for (size_t b = 0; b < batch.size() && !sampling.empty(); ++b) {
        const Trajectory& t = *batch[b];
        const FeatureState& f = *t.final_norm;
        at::Tensor normed = Borrow(f.bytes, {f.rows, f.hidden}, f.dtype).to(device_, dtype_);
        out[b].sampled = TeacherForcedAcceptance(block.get(), t.tokens, features[b], t.prompt_len,
                                                 t.max_length, out[b].step_lengths, normed,
                                                 head_lm_, sampling);
      }
      // The chain's replay recorded the family's own acceptance prediction (DSpark's
      // confidence head); each cutoff's adaptive verify length is a loop of its own.
      for (size_t b = 0; b < batch.size() && !asks.predicted_cutoffs.empty(); ++b) {
        if (!out[b].predicted) continue;
        const Trajectory& t = *batch[b];
        out[b].predicted->cut_step_lengths =
            CutoffStepLengths(block.get(), t.tokens, features[b], t.prompt_len, t.max_length,
                              asks.predicted_cutoffs);
      }
      return absl::OkStatus();
    }));
    return out;
  }

  absl::StatusOr<LiveResult> Live(const LiveStart& start, LiveTarget& target,
                                  const LiveSettings& settings) override {
    SW_RETURN_IF_ERROR(AttachHead());
    SW_RETURN_IF_ERROR(
        Annotate(CheckStates(start.states, static_cast<int64_t>(start.prompt.size())),
                 "the session's prompt states"));
    std::unique_ptr<BlockDrafter> block = drafter_->Chain();
    absl::StatusOr<LiveResult> out = absl::InternalError("live loop did not run");
    SW_RETURN_IF_ERROR(RunGuarded("live loop", [&]() -> absl::Status {
      out = RunLiveLoop(block.get(), start, target, settings,
                        [&](const std::vector<FeatureState>& states) {
                          const absl::Status fits =
                              CheckStates(states, states.empty() ? 0 : states.front().rows);
                          TORCH_CHECK(fits.ok(), "verified states: ", fits.message());
                          std::vector<at::Tensor> parts;
                          for (const FeatureState& f : states) {
                            parts.push_back(Borrow(f.bytes, {f.rows, f.hidden}, f.dtype));
                          }
                          return at::cat(parts, -1).to(device_, dtype_);
                        });
      return absl::OkStatus();
    }));
    return out;
  }

 private:
  // The current drafter, with the current head attached (at its first use).
  absl::Status AttachHead() {
    if (!drafter_) return absl::FailedPreconditionError("no drafter loaded");
    if (!head_embed_.defined()) return absl::FailedPreconditionError("no target head set");
    if (!head_on_drafter_) {
      SW_RETURN_IF_ERROR(drafter_->SetTargetHead(head_embed_, head_lm_));
      head_on_drafter_ = true;
    }
    return absl::OkStatus();
  }

  // One state per drafter target layer, each [rows, target hidden] in its bytes.
  absl::Status CheckStates(const std::vector<FeatureState>& states, int64_t rows) const {
    const size_t layers = drafter_->spec().target_layer_ids.size();
    const int64_t width = drafter_->spec().target_hidden_size;
    if (layers == 0) return absl::FailedPreconditionError("the drafter's target layers are not resolved");
    if (states.size() != layers) {
      return absl::InvalidArgumentError(absl::StrCat("trajectory has ", states.size(),
                                                     " states, the drafter uses ", layers));
    }
    for (const FeatureState& s : states) {
      if (s.rows != rows || s.hidden != width ||
          static_cast<int64_t>(s.bytes.size()) !=
              s.rows * s.hidden * static_cast<int64_t>(DTypeSize(s.dtype))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "state of target layer ", s.layer_id, " is [", s.rows, ", ", s.hidden, "] (",
            s.bytes.size(), " bytes), expected [", rows, ", ", width, "]"));
      }
    }
    return absl::OkStatus();
  }

  // The trajectory's states fit the drafter (and its final-norm state the target's lm_head when
  // sampling settings are asked for). INVALID_ARGUMENT naming the state.
  absl::Status CheckTrajectory(const Trajectory& t, bool sampling) const {
    const int64_t T = static_cast<int64_t>(t.tokens.size());
    SW_RETURN_IF_ERROR(CheckStates(t.states, T));
    if (sampling) {
      if (!t.final_norm) {
        return absl::InvalidArgumentError("trajectory lacks the final-norm state the sampling "
                                          "settings need");
      }
      const FeatureState& f = *t.final_norm;
      if (f.rows != T || f.hidden != head_lm_.size(1) ||
          static_cast<int64_t>(f.bytes.size()) !=
              f.rows * f.hidden * static_cast<int64_t>(DTypeSize(f.dtype))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "final-norm state is [", f.rows, ", ", f.hidden, "] (", f.bytes.size(),
            " bytes), expected [", T, ", ", head_lm_.size(1), "] (the target's lm_head)"));
      }
    }
    return absl::OkStatus();
  }

  // A copy in the drafter's dtype and device that this backend owns (never a view of `h`).
  at::Tensor Own(const HeldTensor& h) const {
    at::Tensor t = Borrow(h.bytes, h.shape, h.dtype);
    if (t.scalar_type() == dtype_ && device_.is_cpu()) return t.clone();
    return t.to(device_, dtype_);
  }

  at::ScalarType dtype_;
  at::Device device_;
  std::unique_ptr<Drafter> drafter_;  // the current drafter, of any family
  std::string drafter_dir_;
  std::string drafter_stamp_;
  at::Tensor head_embed_, head_lm_;  // owned copies, shared with the drafter
  std::string head_key_;
  bool head_on_drafter_ = false;  // the current drafter has the current head
};

}  // namespace

absl::StatusOr<std::unique_ptr<ScorerBackend>> MakeTorchScorerBackend(
    const TorchScorerOptions& options) {
  if (options.threads > 0) at::set_num_threads(options.threads);
  SW_ASSIGN_OR_RETURN(at::ScalarType dtype, ParseComputeDtype(options.dtype));
  SW_ASSIGN_OR_RETURN(at::Device device, ParseDevice(options.device));
  return std::unique_ptr<ScorerBackend>(new TorchScorerBackend(dtype, device));
}

}  // namespace specwire
