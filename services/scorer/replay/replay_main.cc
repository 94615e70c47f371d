// specwire-replay: the acceptance replay offline, with the target run in-process (the extraction
// engine) instead of behind the extractor service. Used by the parity tier, the benchmarks and
// the GPU checks. One --drafter path for every drafter family (services/scorer/drafters/
// registry.h): the family is read from the checkpoint's own declaration.
//
//   specwire-replay [replay] --drafter DIR --target_checkpoint DIR
//                            (--tokens IDS | --tokens_file F | --trajectories_file F)
//                            [--max_new_tokens N] [--ddtree 8,32] [--tree D,K,N] [--live] ...
//   specwire-replay draft    --drafter DIR [--target_checkpoint DIR] --cases F.safetensors
//                            --out F.safetensors
//   specwire-replay ddtree   --cases F.json
//   specwire-replay features --drafter DIR --target_checkpoint DIR --cases F.safetensors
//
// replay prints one JSON object: per response the trajectory, the family's step lengths and each
// tree's; the summary (acceptance.h); and the in-process time of the replay alone (drafting +
// acceptance, without target generation and feature extraction).
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint.h"
#include "common/command_line.h"
#include "common/memory_policy.h"
#include "common/models/kernel_set.h"
#include "common/models/torch_util.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "common/models/engine.h"
#include "common/models/target_flags.h"
#include "common/request_flags.h"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/acceptance/statistics.h"
#include "services/scorer/drafters/registry.h"
#include "services/scorer/replay/ddtree.h"
#include "services/scorer/replay/in_process_target.h"
#include "services/scorer/replay/live_loop.h"
#include "services/scorer/replay/replay.h"
#include "services/scorer/replay/score_flags.h"

ABSL_FLAG(std::string, drafter, "",
          "The drafter: a checkpoint directory (config.json + safetensors) of any family "
          "specwire reads; its config.json declares which (DFlash, DFlash2, DSpark, Domino, "
          "EAGLE-3, P-EAGLE, MTP, XPress). \"mtp\": the --target_checkpoint's own multi-token-prediction head "
          "(its mtp.* tensors; the same as naming the target's directory).");
ABSL_FLAG(std::string, target_checkpoint, "",
          "Target checkpoint (Hugging Face CausalLM directory), run in-process.");
ABSL_FLAG(std::string, trajectories_file, "",
          "replay: JSON list of {\"prompt\": [...], \"completion\": [...]} instead.");
ABSL_FLAG(std::string, ddtree, "8",
          "replay: DDTree node budgets, comma-separated, or \"none\" (families whose tree is "
          "DDTree: DFlash's block marginals).");
ABSL_FLAG(int64_t, reps, 1, "replay: run the replay N times; timing reports the median.");
ABSL_FLAG(int64_t, batch, 16, "replay: responses replayed in lockstep per drafter forward.");
ABSL_FLAG(bool, full_logits, false,
          "replay: all B-1 rows of logits per block, like dflash's loop (default: stop at each "
          "block's first mismatch).");
ABSL_FLAG(std::string, tree, "",
          "replay: the family's own tree instead of its chain (EAGLE's top-k tree), as "
          "depth,top_k,total_tokens.");
ABSL_FLAG(std::string, tree_dump, "",
          "replay --tree: write every step's tree (tokens, parents, levels, scores, kept) here "
          "as JSON.");
ABSL_FLAG(int64_t, block, 0,
          "replay: drafts per step + 1 (0: the family's block; a chain may take any length, a "
          "block only up to its own).");
ABSL_FLAG(bool, live, false,
          "replay (--tokens / --tokens_file): also run the real loop on each prompt with the target in "
          "this process (a target session: draft, verify, commit, roll back), greedy, and "
          "report its step lengths (equal to the replay's) and its cost beside the replay's.");
ABSL_FLAG(std::string, cases, "",
          "draft / features: safetensors with case.{i}.* tensors and metadata \"cases\"; "
          "ddtree: JSON {\"budgets\": [...], \"cases\": [{\"log_probs\", \"truth\"}]}.");
ABSL_FLAG(std::string, out, "", "draft: output safetensors.");
ABSL_FLAG(std::string, last_layer_state, "family",
          "replay: which state the drafter's id of the target's last layer reads: "
          "family (its family's convention: after the final norm for z-lab's DFlash, as "
          "transformers' hidden_states[L]; the layer's own output for EAGLE-3 and speculators' "
          "formats), final_norm, or layer (before the norm, as vLLM's capture) — to score a "
          "drafter as another stack feeds it.");

namespace specwire {
namespace {

using json = nlohmann::json;

constexpr char kUsage[] = R"(specwire-replay [COMMAND] [flags]

Commands (every drafter family; --drafter's config.json says which):
  replay (default)  greedy trajectories of the target, their features, and the family's
                    acceptance replay (its chain or block, and DDTree or its own tree); prints
                    JSON (responses, summary, timing); --live runs the real loop beside it
  draft             the drafter on given context features (parity tests): case.{i}.features
                    [T, n × H], optional case.{i}.tokens [T] or [T + 1] (I64: the trajectory, which
                    supplies each context row's next token, the anchor and teacher forcing);
                    metadata cases = [{"steps": [{"context_end": e, "len": l, "anchor": a}]}]
                    (anchor defaults to tokens[e]); each step drafts the block after the rows
                    [0, e) and writes its logits (the target's vocabulary) and the family's own
                    tensors (hidden states, draft-vocabulary logits, ...) to --out
  ddtree            DDTree acceptance on given log-prob tables (JSON in, JSON out)
  features          the family's replay of the same trajectories on two sets of context
                    features (canonical and foreign, e.g. from another stack): both τ and the
                    paired Δτ with its bootstrap interval, as JSON (specwire_client.audit uses it)

The commands eagle3-replay and eagle3-draft are now replay and draft.)";

absl::StatusOr<json> ReadJson(const std::string& path, const std::string& flag) {
  SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded())
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": invalid JSON"));
  return j;
}

// A --cases file: safetensors whose metadata "cases" is a JSON list.
struct CasesFile {
  std::unique_ptr<SafetensorsFile> file;
  json cases;
};

absl::StatusOr<CasesFile> OpenCases(const std::string& path) {
  CasesFile c;
  SW_ASSIGN_OR_RETURN(c.file, SafetensorsFile::Open(path));
  auto meta = c.file->metadata().find("cases");
  if (meta == c.file->metadata().end()) {
    return absl::InvalidArgumentError("--cases: metadata key \"cases\" missing");
  }
  c.cases = json::parse(meta->second, nullptr, false);
  if (c.cases.is_discarded() || !c.cases.is_array()) {
    return absl::InvalidArgumentError("--cases: metadata \"cases\" must be a JSON list");
  }
  return c;
}

// The target (when given) and the drafter, wired together: the drafter runs on the target's
// output device, its layers fitted to the target, checked against its contract and given its
// embedding and lm_head.
struct Models {
  std::unique_ptr<ExtractionEngine> engine;  // null when no --target_checkpoint was given
  std::unique_ptr<Drafter> drafter;
  const DrafterSpec& spec() const { return drafter->spec(); }
};

absl::StatusOr<Models> LoadModels(bool need_target) {
  std::string dir = absl::GetFlag(FLAGS_drafter);
  const std::string target = absl::GetFlag(FLAGS_target_checkpoint);
  if (dir.empty()) return absl::InvalidArgumentError("--drafter is required");
  if (dir == "mtp") {
    if (target.empty()) {
      return absl::InvalidArgumentError(
          "--drafter=mtp drafts with the target's own MTP head: give --target_checkpoint");
    }
    dir = target;
  }
  if (need_target && target.empty()) {
    return absl::InvalidArgumentError("--target_checkpoint is required");
  }
  SW_ASSIGN_OR_RETURN(const TargetFlags flags, TargetFlagsFromFlags("float32"));
  SW_ASSIGN_OR_RETURN(const LoadOptions load, TargetLoadOptions(flags));
  Models m;
  at::Device device = at::kCPU;
  if (!target.empty()) {
    SW_ASSIGN_OR_RETURN(m.engine, ExtractionEngine::Load(target, load));
    SW_RETURN_IF_ERROR(m.engine->SetBatchLayout(flags.batch_layout, "--batch_layout"));
    device = m.engine->model().output_device();
  }
  SW_ASSIGN_OR_RETURN(m.drafter, LoadDrafter(dir, load.dtype, device));
  if (m.engine) {
    SW_RETURN_IF_ERROR(m.drafter->FitTargetLayers(m.engine->config().num_layers));
    SW_RETURN_IF_ERROR(CheckDrafterContract(m.spec(), m.engine->contract()));
    SW_RETURN_IF_ERROR(m.drafter->SetTargetHead(m.engine->model().embed_tokens(),
                                                m.engine->model().lm_head()));
  } else if (m.spec().needs_target_head) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--target_checkpoint is required: the ", m.spec().method,
        " drafter drafts with the target's embedding and lm_head"));
  }
  return m;
}

// Whether the drafter's id of the target's last layer reads the final norm's output: its family's
// convention unless --last_layer_state overrides it.
absl::StatusOr<bool> LastLayerIsFinalNorm(const DrafterSpec& drafter) {
  const std::string v = absl::GetFlag(FLAGS_last_layer_state);
  if (v == "family") return drafter.last_layer_is_final_norm;
  if (v == "final_norm") return true;
  if (v == "layer") return false;
  return absl::InvalidArgumentError(absl::StrCat(
      "--last_layer_state: \"", v, "\" is not one of family, final_norm, layer"));
}

// The drafter's context features of each sequence, [T, n × H]: the target states of
// target_layer_ids concatenated in that order. dflash's extract_context_feature reads HF
// hidden_states[id + 1]; for the last layer that is the final-norm output (transformers puts it
// there), so id = L − 1 maps to the final_norm tap where the family reads it so; otherwise (EAGLE-3,
// speculators' DFlash) to the last layer's own output, as vLLM captures it.
absl::StatusOr<std::vector<at::Tensor>> ContextFeatures(
    ExtractionEngine& engine, const DrafterSpec& drafter,
    const std::vector<std::vector<int64_t>>& sequences, at::ScalarType dtype) {
  SW_ASSIGN_OR_RETURN(const bool final_norm, LastLayerIsFinalNorm(drafter));
  const int64_t L = final_norm ? engine.config().num_layers : -1;
  CaptureSpec capture;
  for (int64_t id : drafter.target_layer_ids) {
    if (id == L - 1) {
      capture.final_norm = true;
    } else if (std::find(capture.layers.begin(), capture.layers.end(), id) ==
               capture.layers.end()) {
      capture.layers.push_back(id);
    }
  }
  SW_ASSIGN_OR_RETURN(std::vector<SequenceStates> states,
                      engine.Extract(sequences, capture, dtype));
  std::vector<at::Tensor> out;
  for (const SequenceStates& s : states) {
    std::vector<at::Tensor> parts;
    for (int64_t id : drafter.target_layer_ids) {
      parts.push_back(id == L - 1 ? s.final_norm : s.layers.at(id));
    }
    out.push_back(at::cat(parts, -1));  // [T, n × H]
  }
  return out;
}

// A block drafter with another block length (--block): a chain drafts any length.
class ResizedBlocks : public BlockDrafter {
 public:
  ResizedBlocks(std::unique_ptr<BlockDrafter> inner, int32_t block)
      : inner_(std::move(inner)), block_(block) {}
  int32_t block_size() const override { return block_; }
  bool conditions_on_drafts() const override { return inner_->conditions_on_drafts(); }
  std::unique_ptr<DraftSession> NewSession(int64_t capacity) override {
    return inner_->NewSession(capacity);
  }
  void AppendContext(const std::vector<DraftSession*>& s, const std::vector<at::Tensor>& f,
                     const std::vector<std::vector<int64_t>>& n) override {
    inner_->AppendContext(s, f, n);
  }
  at::Tensor DraftLogits(const std::vector<DraftSession*>& s, const std::vector<int64_t>& a,
                         const std::vector<int64_t>& st, int64_t len) override {
    return inner_->DraftLogits(s, a, st, len);
  }
  std::vector<int64_t> AcceptedDrafts(const std::vector<DraftSession*>& s,
                                      const std::vector<int64_t>& a,
                                      const std::vector<int64_t>& st, int64_t len,
                                      const std::vector<std::vector<int64_t>>& t) override {
    return inner_->AcceptedDrafts(s, a, st, len, t);
  }

 private:
  std::unique_ptr<BlockDrafter> inner_;
  int32_t block_;
};

// The real loop on every prompt, the target in this process (InProcessTarget), greedy: per
// response its step lengths and whether they equal the replay's, and the loop's wall time.
absl::StatusOr<json> RunLive(Models& m, const std::vector<std::vector<int64_t>>& prompts,
                             const std::vector<ResponseAcceptance>& replayed,
                             int64_t max_new_tokens) {
  const DrafterSpec& dc = m.spec();
  std::unique_ptr<BlockDrafter> block = m.drafter->Chain();
  LiveSettings settings;
  settings.max_new_tokens = max_new_tokens;
  SW_ASSIGN_OR_RETURN(const StopFlags stop, StopFromFlags());
  if (stop.use_model_eos) settings.stop_token_ids = m.engine->config().eos_token_ids;
  settings.stop_token_ids.insert(settings.stop_token_ids.end(), stop.stop_token_ids.begin(),
                                 stop.stop_token_ids.end());
  TargetSessionOptions options;
  options.max_new_tokens = max_new_tokens;
  options.max_draft_tokens = block->block_size() - 1;
  const at::Device device = m.drafter->device();
  const at::ScalarType dtype = m.drafter->dtype();
  auto to_features = [&](const std::vector<FeatureState>& states) {
    std::vector<at::Tensor> parts;
    for (const FeatureState& f : states) {
      parts.push_back(at::from_blob(const_cast<std::byte*>(f.bytes.data()), {f.rows, f.hidden},
                                    ToScalarType(f.dtype)));
    }
    return at::cat(parts, -1).to(device, dtype);  // cat copies: the bytes may go
  };
  json responses = json::array();
  int64_t equal = 0;
  const auto t0 = std::chrono::steady_clock::now();
  SW_ASSIGN_OR_RETURN(const bool final_norm, LastLayerIsFinalNorm(dc));
  for (size_t i = 0; i < prompts.size(); ++i) {
    SW_ASSIGN_OR_RETURN(std::unique_ptr<InProcessTarget> target,
                        InProcessTarget::Open(m.engine->model(), prompts[i], options,
                                              dc.target_layer_ids, final_norm));
    absl::StatusOr<LiveResult> r = absl::InternalError("live loop did not run");
    SW_RETURN_IF_ERROR(RunGuarded("live loop", [&]() -> absl::Status {
      r = RunLiveLoop(block.get(), target->start(), *target, settings, to_features);
      return absl::OkStatus();
    }));
    SW_RETURN_IF_ERROR(r.status());
    const bool same = r->step_lengths == replayed[i].step_lengths;
    equal += same;
    responses.push_back({{"step_lengths", r->step_lengths},
                         {"equals_replay", same},
                         {"completion_tokens", r->completion.size()},
                         {"verify_calls", r->verify_calls},
                         {"rollback_tokens", target->session().rollback_tokens()}});
  }
  SynchronizeDevice(device);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return json{{"responses", responses},
              {"equal_to_replay", equal},
              {"of", prompts.size()},
              {"seconds", seconds}};
}

// The family's own acceptance prediction beside the replay (DSpark's confidence head, which the
// chain's replay `results` recorded), nullopt when it has none: the summary's calibration table
// and cutoffs (acceptance.h), each cutoff's step lengths, and every block's record (accepted
// drafts, predictions) for checks made elsewhere.
absl::StatusOr<std::optional<json>> PredictedAcceptanceJson(
    Drafter& drafter, const std::vector<std::vector<int64_t>>& trajectories,
    const std::vector<at::Tensor>& features, const std::vector<std::vector<int64_t>>& prompts,
    std::vector<ResponseAcceptance>& results, int64_t max_new_tokens, int64_t block) {
  if (results.empty() || !results.front().predicted) return std::optional<json>();
  SW_ASSIGN_OR_RETURN(const std::vector<double> cutoffs,
                      ParseSurvivalCutoffs(absl::GetFlag(FLAGS_dspark_cutoff), "--dspark_cutoff"));
  SW_RETURN_IF_ERROR(RunGuarded("adaptive verify length", [&]() -> absl::Status {
    std::unique_ptr<BlockDrafter> chain = drafter.Chain();
    if (!chain) return absl::InternalError("the family made no drafter");
    if (chain->block_size() != block) {
      chain = std::make_unique<ResizedBlocks>(std::move(chain), static_cast<int32_t>(block));
    }
    for (size_t i = 0; i < trajectories.size(); ++i) {
      const int64_t P = static_cast<int64_t>(prompts[i].size());
      if (!results[i].predicted) return absl::InternalError("a response without predictions");
      results[i].predicted->cut_step_lengths = CutoffStepLengths(
          chain.get(), trajectories[i], features[i], P, P + max_new_tokens, cutoffs);
    }
    return absl::OkStatus();
  }));
  std::vector<const PredictedAcceptance*> all;
  json blocks = json::array();
  for (const ResponseAcceptance& r : results) {
    const PredictedAcceptance& p = *r.predicted;
    all.push_back(&p);
    json per = json::array();
    for (size_t s = 0; s < p.accepted.size(); ++s) {
      per.push_back({{"accepted", p.accepted[s]}, {"predicted", p.predicted[s]}});
    }
    blocks.push_back(std::move(per));
  }
  json out = PredictedAcceptanceJson(*SummarizePredicted(all, SummaryOptions().bootstrap));
  for (json& c : out["cutoffs"]) {
    json steps = json::array();
    for (const PredictedAcceptance* p : all) {
      steps.push_back(p->cut_step_lengths.at(c["cutoff"].get<double>()));
    }
    c["step_lengths"] = std::move(steps);
  }
  out["blocks"] = std::move(blocks);
  return std::optional<json>(std::move(out));
}

absl::Status RunReplay() {
  SW_ASSIGN_OR_RETURN(Models m, LoadModels(/*need_target=*/true));
  const DrafterSpec& dc = m.spec();
  const int64_t max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  if (max_new_tokens < 1) return absl::InvalidArgumentError("--max_new_tokens must be positive");
  const int64_t repeat = absl::GetFlag(FLAGS_reps);
  if (repeat < 1) return absl::InvalidArgumentError("--reps must be positive");
  ReplayOptions options;
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  if (batch < 1) return absl::InvalidArgumentError("--batch must be positive");
  options.max_batch = static_cast<int32_t>(batch);
  options.full_logits = absl::GetFlag(FLAGS_full_logits);
  options.ddtree_budgets.clear();

  // The family's chain or block, or its own tree (--tree); DDTree budgets where its tree is
  // DDTree over the block's marginals.
  std::optional<TreeSettings> tree;
  int32_t tree_budget = 0;
  if (const std::string t = absl::GetFlag(FLAGS_tree); !t.empty()) {
    SW_ASSIGN_OR_RETURN(std::vector<int64_t> v, ParseIntList(t, "tree"));
    if (v.size() != 3 || v[0] < 1 || v[0] > TreeSettings::kMaxSetting || v[1] < 1 ||
        v[1] > TreeSettings::kMaxSetting || v[2] < 1) {
      return absl::InvalidArgumentError(
          "--tree must be depth,top_k,total_tokens (depth and top_k in [1, 64], total >= 1)");
    }
    if (dc.tree != kTreeEagle) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tree: the ", dc.method, " drafter has no tree of its own",
          dc.tree == kTreeDDTree ? " (its tree is DDTree over its block: --ddtree)" : ""));
    }
    tree = TreeSettings{kTreeEagle, {}, static_cast<int32_t>(v[0]), static_cast<int32_t>(v[1])};
    tree_budget = static_cast<int32_t>(v[2]);
    options.max_batch = 1;  // trees are recorded in response order
  }
  const std::string budgets = absl::GetFlag(FLAGS_ddtree);
  if (!tree && dc.tree == kTreeDDTree && budgets != "none" && !budgets.empty()) {
    SW_ASSIGN_OR_RETURN(std::vector<int64_t> b, ParseIntList(budgets, "ddtree"));
    for (int64_t v : b) {
      if (v < 1) return absl::InvalidArgumentError("--ddtree budgets must be positive");
      options.ddtree_budgets.push_back(static_cast<int32_t>(v));
    }
  }
  int64_t block = absl::GetFlag(FLAGS_block);
  if (tree) {
    block = tree->depth + 1;
  } else if (block == 0) {
    block = dc.block_size;
  } else if (block < 2 || block > 65 || (!dc.autoregressive && block > dc.block_size)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--block ", block, ": must lie in [2, ",
        dc.autoregressive ? int64_t{65} : int64_t{dc.block_size}, "] (the ", dc.method,
        " drafter's ", dc.autoregressive ? "chain" : "block", ")"));
  }

  // Trajectories: given, or the target's greedy completions of the prompts.
  double generate_seconds = 0;
  std::vector<std::vector<int64_t>> prompts, completions;
  std::vector<std::string> finish;
  if (const std::string file = absl::GetFlag(FLAGS_trajectories_file); !file.empty()) {
    SW_ASSIGN_OR_RETURN(json j, ReadJson(file, "trajectories_file"));
    if (!j.is_array()) return absl::InvalidArgumentError("--trajectories_file: expected a list");
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string what = absl::StrCat("--trajectories_file[", i, "]");
      if (!j[i].is_object() || !j[i].contains("prompt") || !j[i].contains("completion")) {
        return absl::InvalidArgumentError(what +
                                          ": expected {\"prompt\": [...], \"completion\": [...]}");
      }
      SW_ASSIGN_OR_RETURN(std::vector<int64_t> p, TokenIdsFromJson(j[i]["prompt"], what + ".prompt"));
      SW_ASSIGN_OR_RETURN(std::vector<int64_t> c,
                          TokenIdsFromJson(j[i]["completion"], what + ".completion"));
      if (p.empty()) return absl::InvalidArgumentError(what + ".prompt: empty");
      if (static_cast<int64_t>(c.size()) > max_new_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ".completion: ", c.size(), " tokens > --max_new_tokens ", max_new_tokens));
      }
      prompts.push_back(std::move(p));
      completions.push_back(std::move(c));
      finish.push_back("given");
    }
  } else if (TokenSourcesGiven() > 0) {
    const auto g0 = std::chrono::steady_clock::now();
    SW_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> given, TokenSequencesFromFlags());
    SW_ASSIGN_OR_RETURN(StopFlags stop, StopFromFlags());
    GenerateOptions gen;
    gen.max_new_tokens = max_new_tokens;
    gen.use_config_eos = stop.use_model_eos;
    gen.stop_token_ids = std::move(stop.stop_token_ids);
    for (std::vector<int64_t>& p : given) {
      SW_ASSIGN_OR_RETURN(GenerateResult r, m.engine->Generate(p, gen));
      prompts.push_back(std::move(p));
      completions.push_back(std::move(r.tokens));
      finish.push_back(r.finish_reason);
    }
    generate_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
  } else {
    return absl::InvalidArgumentError("give --tokens, --tokens_file or --trajectories_file");
  }

  std::vector<std::vector<int64_t>> trajectories;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (completions[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("response ", i, ": empty completion"));
    }
    std::vector<int64_t> t = prompts[i];
    t.insert(t.end(), completions[i].begin(), completions[i].end());
    trajectories.push_back(std::move(t));
  }
  const auto f0 = std::chrono::steady_clock::now();
  SW_ASSIGN_OR_RETURN(std::vector<at::Tensor> features,
                      ContextFeatures(*m.engine, dc, trajectories, m.drafter->dtype()));
  SynchronizeDevice(m.drafter->device());
  const double features_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();

  std::vector<ResponseAcceptance> results;
  std::vector<double> seconds;
  std::vector<DraftTree> trees;  // --tree: every step's, in response order
  absl::Status status = RunGuarded("replay", [&]() -> absl::Status {
    std::unique_ptr<BlockDrafter> drafter =
        tree ? m.drafter->Tree(*tree, tree_budget, &trees) : m.drafter->Chain();
    if (!drafter) return absl::InternalError("the family made no drafter");
    if (!tree && block != drafter->block_size()) {
      drafter = std::make_unique<ResizedBlocks>(std::move(drafter), static_cast<int32_t>(block));
    }
    AcceptanceReplay replay(drafter.get());
    std::vector<ReplayInput> inputs;
    for (size_t i = 0; i < trajectories.size(); ++i) {
      const int64_t P = static_cast<int64_t>(prompts[i].size());
      inputs.push_back({&trajectories[i], &features[i], P, P + max_new_tokens});
    }
    for (int64_t rep = 0; rep < repeat; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      trees.clear();
      results = replay.RunBatch(inputs, options);
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  SW_RETURN_IF_ERROR(ValidateAcceptance(results, static_cast<int32_t>(block)));
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];

  json out;
  out["drafter"] = absl::GetFlag(FLAGS_drafter);
  out["method"] = dc.method;
  out["format"] = dc.format;
  out["block_size"] = block;
  out["target_layer_ids"] = dc.target_layer_ids;
  out["mask_token_id"] = dc.mask_token_id;
  if (!dc.tensors.empty()) out["drafter_tensors"] = dc.tensors;
  json responses = json::array();
  int64_t chain_blocks = 0, all_blocks = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const ResponseAcceptance& r = results[i];
    json dd = json::object();
    for (const auto& [budget, lengths] : r.ddtree_step_lengths) {
      dd[std::to_string(budget)] = lengths;
      all_blocks += static_cast<int64_t>(lengths.size());
    }
    chain_blocks += static_cast<int64_t>(r.step_lengths.size());
    responses.push_back({{"prompt_tokens", r.prompt_tokens},
                         {"completion_tokens", r.completion_tokens},
                         {"completion", completions[i]},
                         {"finish_reason", finish[i]},
                         {"step_lengths", r.step_lengths},
                         {"ddtree", dd}});
  }
  all_blocks += chain_blocks;
  if (tree) {
    out["tree"] = {{"depth", tree->depth}, {"top_k", tree->top_k}, {"total_tokens", tree_budget}};
    if (const std::string dump = absl::GetFlag(FLAGS_tree_dump); !dump.empty()) {
      json all = json::array();
      for (const DraftTree& t : trees) {
        std::vector<int> kept(t.kept.begin(), t.kept.end());
        all.push_back({{"token", t.token}, {"parent", t.parent}, {"level", t.level},
                       {"score", t.score}, {"kept", kept}});
      }
      SW_RETURN_IF_ERROR(WriteFileAtomically(dump, all.dump()));
    }
  }
  if (absl::GetFlag(FLAGS_live)) {
    if (TokenSourcesGiven() == 0) {
      return absl::InvalidArgumentError(
          "--live needs --tokens or --tokens_file (the loop makes its own completions)");
    }
    SW_ASSIGN_OR_RETURN(json live, RunLive(m, prompts, results, max_new_tokens));
    out["live"] = std::move(live);
  }
  if (!tree) {
    SW_ASSIGN_OR_RETURN(std::optional<json> predicted,
                        PredictedAcceptanceJson(*m.drafter, trajectories, features, prompts,
                                                results, max_new_tokens, block));
    if (predicted) out["predicted_acceptance"] = std::move(*predicted);
  }
  out["responses"] = responses;
  out["summary"] =
      json::parse(AcceptanceSummaryToJson(Summarize(results, static_cast<int32_t>(block))));
  out["timing"] = {{"replay_seconds", median},
                   {"generate_seconds", generate_seconds},
                   {"features_seconds", features_seconds},
                   {"replay_seconds_all", seconds},
                   {"chain_blocks", chain_blocks},
                   {"blocks", all_blocks},
                   {"blocks_per_second", median > 0 ? all_blocks / median : 0.0},
                   {"threads", at::get_num_threads()},
                   {"batch", options.max_batch}};
  std::cout << out.dump() << "\n";
  return absl::OkStatus();
}

// draft: see kUsage. The session persists across a case's steps, as in the drafting loops.
absl::Status RunDraft() {
  SW_ASSIGN_OR_RETURN(Models m, LoadModels(/*need_target=*/false));
  const std::string cases_path = absl::GetFlag(FLAGS_cases), out_path = absl::GetFlag(FLAGS_out);
  if (cases_path.empty() || out_path.empty()) {
    return absl::InvalidArgumentError("draft needs --cases and --out");
  }
  SW_ASSIGN_OR_RETURN(CasesFile opened, OpenCases(cases_path));
  std::unique_ptr<SafetensorsFile> in = std::move(opened.file);
  json cases = std::move(opened.cases);
  std::vector<std::pair<std::string, at::Tensor>> outputs;
  absl::Status status = RunGuarded("draft", [&]() -> absl::Status {
    std::unique_ptr<BlockDrafter> drafter = m.drafter->Chain();
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string name = absl::StrCat("case.", i);
      const TensorView* fv = in->Find(name + ".features");
      if (fv == nullptr || !IsFloat(fv->dtype) || fv->shape.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("--cases: ", name, ".features must be a float [T, n × H] tensor"));
      }
      at::Tensor features = WrapView(*fv).to(m.drafter->device(), m.drafter->dtype());
      const int64_t T = fv->shape[0];
      std::vector<int64_t> tokens;
      if (const TensorView* tv = in->Find(name + ".tokens")) {
        if (tv->dtype != DType::kI64 || tv->shape.size() != 1 ||
            (tv->shape[0] != T && tv->shape[0] != T + 1)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--cases: ", name, ".tokens must be I64 [", T, "] or [", T + 1,
              "] (the trajectory, optionally with the token after the last row)"));
        }
        const int64_t* t = reinterpret_cast<const int64_t*>(tv->data);
        tokens.assign(t, t + tv->shape[0]);
      }
      std::unique_ptr<DraftSession> session = drafter->NewSession(T + drafter->block_size() + 1);
      int64_t context = 0;
      const json& steps = cases[i].value("steps", json::array());
      for (size_t j = 0; j < steps.size(); ++j) {
        const std::string what = absl::StrCat("--cases: case ", i, " step ", j);
        const int64_t end = steps[j].at("context_end").get<int64_t>();
        const int64_t len = steps[j].value("len", int64_t{drafter->block_size()});
        if (end < context || end > T || len < 2) {
          return absl::InvalidArgumentError(absl::StrCat(what, ": context_end ", end, " outside [",
                                                         context, ", ", T, "] or len ", len,
                                                         " < 2"));
        }
        int64_t anchor = -1;
        if (steps[j].contains("anchor")) {
          anchor = steps[j].at("anchor").get<int64_t>();
        } else if (end < static_cast<int64_t>(tokens.size())) {
          anchor = tokens[end];
        } else {
          return absl::InvalidArgumentError(what + ": no anchor (give it, or case tokens)");
        }
        std::vector<int64_t> next(end - context, -1);
        for (int64_t r = context; r < end && r + 1 < static_cast<int64_t>(tokens.size()); ++r) {
          next[r - context] = tokens[r + 1];
        }
        session->AppendContext(features.narrow(0, context, end - context), next);
        context = end;
        // Teacher forcing: draft position k conditions on the trajectory's tokens before it.
        std::vector<int64_t> given;
        for (int64_t k = 1; k < len - 1 && end + k < static_cast<int64_t>(tokens.size()); ++k) {
          given.push_back(tokens[end + k]);
        }
        const at::Tensor logits = session->DraftLogits(anchor, end, len, given);
        const std::string p = absl::StrCat(name, ".step.", j, ".");
        outputs.emplace_back(p + "logits", logits.to(at::kCPU, at::kFloat).contiguous());
        for (const auto& [key, t] : session->Inspect()) {
          outputs.emplace_back(p + key, t.scalar_type() == at::kLong
                                            ? t.to(at::kCPU).contiguous()
                                            : t.to(at::kCPU, at::kFloat).contiguous());
        }
      }
    }
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : outputs) {
    tensors.push_back(
        {name, t.scalar_type() == at::kLong ? DType::kI64 : DType::kF32, t.sizes().vec(),
         std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  SW_RETURN_IF_ERROR(WriteSafetensors(out_path, tensors));
  std::cout << json({{"tensors", outputs.size()}}).dump() << "\n";
  return absl::OkStatus();
}

// ddtree: {"budgets": [...], "cases": [{"log_probs": [[...], ...], "truth": [...]}]} →
// {"accepted": [[a for each budget] for each case]}.
absl::Status RunDDTree() {
  const std::string cases_path = absl::GetFlag(FLAGS_cases);
  if (cases_path.empty()) return absl::InvalidArgumentError("ddtree needs --cases");
  SW_ASSIGN_OR_RETURN(json in, ReadJson(cases_path, "cases"));
  std::vector<int32_t> budgets = in.at("budgets").get<std::vector<int32_t>>();
  json accepted = json::array();
  absl::Status status = RunGuarded("ddtree", [&]() -> absl::Status {
    for (const json& c : in.at("cases")) {
      const auto rows = c.at("log_probs").get<std::vector<std::vector<float>>>();
      const auto truth = c.at("truth").get<std::vector<int64_t>>();
      const int64_t D = static_cast<int64_t>(rows.size()), V = D ? rows[0].size() : 0;
      at::Tensor lp = at::empty({D, V}, at::kFloat);
      for (int64_t d = 0; d < D; ++d) {
        if (static_cast<int64_t>(rows[d].size()) != V) {
          return absl::InvalidArgumentError("ddtree: ragged log_probs");
        }
        std::copy(rows[d].begin(), rows[d].end(), lp.data_ptr<float>() + d * V);
      }
      json row = json::array();
      for (int32_t b : budgets) row.push_back(DDTreeAccepted(lp, truth, b));
      accepted.push_back(row);
    }
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  std::cout << json({{"accepted", accepted}}).dump() << "\n";
  return absl::OkStatus();
}

// features: case.{i}.canonical and case.{i}.foreign [T_i, n × H] (the drafter's context features
// of trajectory i, any float dtype), metadata cases = [{"trajectory": [...], "prompt_len": P,
// "max_length": M (optional)}, ...]. Both sets are replayed on the same trajectories; the
// comparison pairs them prompt by prompt (Δτ = foreign − canonical).
absl::Status RunFeatures() {
  SW_ASSIGN_OR_RETURN(Models m, LoadModels(/*need_target=*/true));
  const std::string cases_path = absl::GetFlag(FLAGS_cases);
  if (cases_path.empty()) return absl::InvalidArgumentError("features needs --cases");
  SW_ASSIGN_OR_RETURN(CasesFile opened, OpenCases(cases_path));
  std::unique_ptr<SafetensorsFile> in = std::move(opened.file);
  const json cases = std::move(opened.cases);
  if (cases.empty()) {
    return absl::InvalidArgumentError("--cases: metadata \"cases\" must be a non-empty JSON list");
  }
  const DrafterSpec& dc = m.spec();
  const int64_t width = dc.target_hidden_size * static_cast<int64_t>(dc.target_layer_ids.size());
  std::vector<std::vector<int64_t>> trajectories(cases.size());
  std::vector<int64_t> prompt_lens(cases.size()), max_lengths(cases.size());
  std::map<std::string, std::vector<at::Tensor>> sets;
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string what = absl::StrCat("--cases: case ", i);
    if (!cases[i].is_object()) return absl::InvalidArgumentError(what + ": not an object");
    SW_ASSIGN_OR_RETURN(trajectories[i], TokenIdsFromJson(cases[i].value("trajectory", json()),
                                                   what + ".trajectory"));
    const int64_t T = static_cast<int64_t>(trajectories[i].size());
    prompt_lens[i] = cases[i].value("prompt_len", int64_t{0});
    if (prompt_lens[i] < 1 || prompt_lens[i] >= T) {
      return absl::InvalidArgumentError(absl::StrCat(what, ".prompt_len: ", prompt_lens[i],
                                                     " must lie in [1, ", T - 1, "]"));
    }
    max_lengths[i] = cases[i].value("max_length", T);
    for (const char* set : {"canonical", "foreign"}) {
      const std::string name = absl::StrCat("case.", i, ".", set);
      const TensorView* view = in->Find(name);
      if (view == nullptr) return absl::InvalidArgumentError(absl::StrCat("--cases: ", name, " missing"));
      if (!IsFloat(view->dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--cases: ", name, " is ", DTypeName(view->dtype), ", not a float"));
      }
      if (view->shape != std::vector<int64_t>{T, width}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--cases: ", name, " has shape [", absl::StrJoin(view->shape, ", "), "]; the drafter reads [",
            T, ", ", width, "] (", dc.target_layer_ids.size(), " layers × ", dc.target_hidden_size, ")"));
      }
      sets[set].push_back(WrapView(*view).to(m.drafter->device(), m.drafter->dtype()));
    }
  }
  ReplayOptions options;
  options.ddtree_budgets.clear();
  std::map<std::string, std::vector<ResponseAcceptance>> results;
  SW_RETURN_IF_ERROR(RunGuarded("features", [&]() -> absl::Status {
    std::unique_ptr<BlockDrafter> chain = m.drafter->Chain();
    AcceptanceReplay replay(chain.get());
    for (auto& [set, features] : sets) {
      std::vector<ReplayInput> inputs;
      for (size_t i = 0; i < cases.size(); ++i) {
        inputs.push_back({&trajectories[i], &features[i], prompt_lens[i], max_lengths[i]});
      }
      results[set] = replay.RunBatch(inputs, options);
    }
    return absl::OkStatus();
  }));
  BootstrapOptions bootstrap;
  bootstrap.resamples = absl::GetFlag(FLAGS_bootstrap_resamples);
  bootstrap.seed = absl::GetFlag(FLAGS_bootstrap_seed);
  std::map<std::string, std::vector<const std::vector<int32_t>*>> lists;
  json out, responses = json::array();
  for (const auto& [set, r] : results) {
    for (const ResponseAcceptance& a : r) lists[set].push_back(&a.step_lengths);
    const TauEstimate tau = EstimateTau(lists[set], bootstrap);
    out[set] = {{"tau", tau.mean_of_means}, {"tau_ci", IntervalJson(tau.mean_of_means_ci)},
                {"pooled", tau.pooled}, {"steps", tau.steps}};
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    responses.push_back({{"canonical", results["canonical"][i].step_lengths},
                         {"foreign", results["foreign"][i].step_lengths}});
  }
  const PairedComparison c = ComparePaired(lists["canonical"], lists["foreign"], bootstrap);
  out["delta_tau"] = c.delta;
  out["delta_tau_ci"] = IntervalJson(c.delta_ci);
  out["prompts"] = c.prompts;
  out["foreign_better"] = c.b_better;
  out["canonical_better"] = c.a_better;
  out["ties"] = c.ties;
  out["responses"] = responses;
  out["method"] = dc.method;
  out["format"] = dc.format;
  out["block_size"] = dc.block_size;
  out["target_layer_ids"] = dc.target_layer_ids;
  out["bootstrap"] = {{"resamples", bootstrap.resamples}, {"seed", bootstrap.seed}};
  std::cout << out.dump() << "\n";
  return absl::OkStatus();
}

absl::Status Run(const std::vector<std::string>& args) {
  if (args.size() > 1) return absl::InvalidArgumentError("unexpected argument " + args[1]);
  const std::string command = args.empty() ? "replay" : args[0];
  SW_ASSIGN_OR_RETURN(const TargetFlags target, TargetFlagsFromFlags("float32"));
  if (target.threads > 0) at::set_num_threads(target.threads);
  if (command == "replay") return RunReplay();
  if (command == "draft") return RunDraft();
  if (command == "ddtree") return RunDDTree();
  if (command == "features") return RunFeatures();
  if (command == "eagle3-replay" || command == "eagle3-draft") {
    return absl::InvalidArgumentError(absl::StrCat(
        "the command ", command, " is now `specwire-replay ", command.substr(7),
        " --drafter DIR`: one path for every drafter family (EAGLE-3's config.json says it is "
        "one); its tree is `replay --tree depth,top_k,total_tokens`"));
  }
  return absl::InvalidArgumentError("unknown command " + command + " (see --help)");
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  const std::vector<std::string> args =
      specwire::ParseCommandLineFlags(argc, argv, specwire::kUsage);
  specwire::KeepFreedMemoryForReuse();
  absl::Status s;
  try {
    s = specwire::Run(args);
  } catch (const std::exception& e) {  // JSON type errors in --cases files
    s = absl::InvalidArgumentError(e.what());
  }
  if (!s.ok()) {
    std::cerr << "specwire-replay: " << s.ToString() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
