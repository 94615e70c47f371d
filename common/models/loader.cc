#include "common/models/loader.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <span>

#include <torch/headeronly/version.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "common/digest.h"
#include "common/models/llama.h"
#include "common/models/qwen3_5.h"
#include "common/models/torch_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {

namespace {

// The chat template a checkpoint ships, digested as its text's UTF-8 bytes ("" without one).
absl::StatusOr<std::string> ChatTemplateDigest(const std::string& dir) {
  auto digest_of = [](const std::string& text) {
    return DigestBytes(std::as_bytes(std::span<const char>(text.data(), text.size())));
  };
  const std::filesystem::path root(dir);
  std::error_code ec;
  if (std::filesystem::is_regular_file(root / "chat_template.jinja", ec)) {
    SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString((root / "chat_template.jinja").string()));
    return digest_of(text);
  }
  if (!std::filesystem::is_regular_file(root / "tokenizer_config.json", ec)) return std::string();
  SW_ASSIGN_OR_RETURN(std::string text,
                      ReadFileToString((root / "tokenizer_config.json").string()));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("chat_template")) return std::string();
  const nlohmann::json& t = j["chat_template"];
  if (t.is_string()) return digest_of(t.get<std::string>());
  if (t.is_array()) {
    const nlohmann::json* pick = nullptr;
    for (const nlohmann::json& e : t) {
      if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
      if (pick == nullptr || e.value("name", "") == "default") pick = &e;
      if (e.value("name", "") == "default") break;
    }
    if (pick != nullptr) return digest_of((*pick)["template"].get<std::string>());
  }
  return std::string();
}

}  // namespace
namespace {

constexpr char kTextPrefix[] = "model.";
constexpr char kVlmPrefix[] = "model.language_model.";

// Checkpoint tensors that are deliberately not loaded, by prefix, with the reason given in the
// load report. `vlm_only` groups are errors in a text-only checkpoint.
struct SkipRule {
  const char* prefix;
  const char* reason;
  bool vlm_only;
};
constexpr SkipRule kSkipRules[] = {
    {"model.visual.", "vision tower: the text path does not use it", true},
    {"visual.", "vision tower: the text path does not use it", true},
    {"mtp.", "multi-token-prediction head: not part of the CausalLM forward (the scorer drafts "
             "with it: the mtp drafter family)", false},
};

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

absl::StatusOr<std::unique_ptr<DecoderModel>> BuildModel(const ModelConfig& c,
                                                         at::ScalarType dtype,
                                                         std::optional<KernelSet> choice) {
  const KernelSet kernels = ResolveKernelSet(c.family, choice);
  switch (c.family) {
    case ModelFamily::kLlama:
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3:
      return BuildLlamaFamilyModel(c, dtype, kernels);
    case ModelFamily::kQwen3_5:
      return BuildQwen3_5Model(c, dtype, kernels);
  }
  return absl::UnimplementedError(
      absl::StrCat("architecture ", c.architecture, " has no implementation in this build"));
}

// What the contract says of the model as built, whatever its weights came from.
void FillContract(const DecoderModel& model, const ModelConfig& config,
                  const std::vector<at::Device>& devices, at::ScalarType dtype,
                  ExtractionContract& c) {
  c.architecture = config.architecture;
  c.model_type = config.model_type;
  c.num_layers = config.num_layers;
  c.hidden_size = config.hidden_size;
  c.vocab_size = config.vocab_size;
  for (LayerType t : config.layer_types) c.layer_types.push_back(LayerTypeName(t));
  c.compute_dtype = ScalarTypeName(dtype);
  for (const at::Device& d : devices) c.devices.push_back(d.str());
  std::set<std::string> kernels;
  for (int64_t i = 0; i < model.num_layers(); ++i) kernels.insert(model.layer(i).KernelVariant());
  c.kernel_variant = absl::StrCat(absl::StrJoin(kernels, "; "), " (libtorch ", TORCH_VERSION_MAJOR,
                                  ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH, ")");
  c.specwire_version = SPECWIRE_VERSION;
}

// The device a weight runs on: its layer's (model.layers.{i}.*), the first layer's for the
// embedding, the last layer's for the final norm and lm_head.
at::Device WeightDevice(const std::string& name, const std::vector<at::Device>& devices) {
  constexpr std::string_view kLayers = "model.layers.";
  if (name.starts_with(kLayers)) {
    int64_t layer = 0;
    const std::string rest = name.substr(kLayers.size());
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &layer) && layer >= 0 &&
        layer < static_cast<int64_t>(devices.size())) {
      return devices[layer];
    }
  }
  return name.starts_with("model.embed_tokens.") ? devices.front() : devices.back();
}

// Random weights drawn where they run (LoadOptions::random_weights_seed): normal(0, 0.02), RMS
// norms 1, so that activations keep their scale through a deep stack in bf16. The Gated DeltaNet
// decay parameters take transformers' initialisation ranges (A in [1, 16), dt_bias around 0).
void DrawRandomWeights(DecoderModel& model, const std::vector<at::Device>& devices,
                       at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  model.ForEachWeight([&](const WeightSlot& slot) {
    const auto opts = at::TensorOptions()
                          .dtype(slot.keep_fp32 ? at::kFloat : dtype)
                          .device(WeightDevice(slot.name, devices));
    if (slot.name.ends_with("norm.weight")) {
      *slot.slot = at::ones(slot.shape, opts);
    } else if (slot.name.ends_with("A_log")) {
      *slot.slot = at::log(at::rand(slot.shape, opts.dtype(at::kFloat)) * 15 + 1).to(opts);
    } else if (slot.name.ends_with("dt_bias")) {
      *slot.slot = at::randn(slot.shape, opts) * 0.1;
    } else {
      *slot.slot = at::randn(slot.shape, opts) * 0.02;
    }
  });
}

}  // namespace

absl::StatusOr<std::vector<at::Device>> ResolveDeviceMap(const std::string& spec,
                                                        int64_t num_layers) {
  std::vector<std::string> parts = absl::StrSplit(spec, ',', absl::SkipWhitespace());
  for (std::string& p : parts) p = std::string(absl::StripAsciiWhitespace(p));
  if (parts.empty()) return absl::InvalidArgumentError("device map is empty");
  const bool explicit_ranges = spec.find('=') != std::string::npos;
  std::vector<at::Device> devices;
  if (!explicit_ranges) {
    std::vector<at::Device> listed;
    for (const std::string& p : parts) {
      SW_ASSIGN_OR_RETURN(at::Device d, ParseDevice(p));
      listed.push_back(d);
    }
    const int64_t n = static_cast<int64_t>(listed.size());
    for (int64_t i = 0; i < num_layers; ++i) devices.push_back(listed[i * n / num_layers]);
    return devices;
  }
  std::vector<std::optional<at::Device>> per_layer(num_layers);
  for (const std::string& p : parts) {
    std::vector<std::string> kv = absl::StrSplit(p, '=');
    std::vector<std::string> range = kv.size() == 2 ? absl::StrSplit(kv[1], '-')
                                                    : std::vector<std::string>{};
    int64_t lo = 0, hi = 0;
    if (kv.size() != 2 || range.size() != 2 || !absl::SimpleAtoi(range[0], &lo) ||
        !absl::SimpleAtoi(range[1], &hi)) {
      return absl::InvalidArgumentError(
          absl::StrCat("device map entry \"", p, "\" is not DEVICE=FIRST-LAST"));
    }
    SW_ASSIGN_OR_RETURN(at::Device d, ParseDevice(kv[0]));
    if (lo < 0 || hi >= num_layers || lo > hi) {
      return absl::InvalidArgumentError(absl::StrCat("device map entry \"", p,
                                                     "\": layers must lie in [0, ", num_layers - 1,
                                                     "]"));
    }
    for (int64_t i = lo; i <= hi; ++i) {
      if (per_layer[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("device map assigns layer ", i, " twice"));
      }
      per_layer[i] = d;
    }
  }
  for (int64_t i = 0; i < num_layers; ++i) {
    if (!per_layer[i]) {
      return absl::InvalidArgumentError(absl::StrCat("device map leaves layer ", i, " unassigned"));
    }
    devices.push_back(*per_layer[i]);
  }
  return devices;
}

KernelSet ResolveKernelSet(ModelFamily family, std::optional<KernelSet> choice) {
  if (choice.has_value()) return *choice;
  // The Qwen3.5 hybrid keeps transformers' own kernels: with its unfused projections and
  // transformers' rounding points everywhere else, its states are bit-identical to transformers'
  // on the CPU, which other kernels would end. The dense families fuse q|k|v and gate|up (other
  // GEMM shapes: in fp32 never bit-identical to transformers), so they take the fast set, whose
  // states are as far from the fp32 forward as transformers' own (tests/parity checks both
  // sets); --kernels reference keeps bf16 bit-identity where the rest of the path allows it.
  return family == ModelFamily::kQwen3_5 ? KernelSet::kReference : KernelSet::kFast;
}

absl::StatusOr<std::unique_ptr<LoadedModel>> LoadModel(const std::string& dir,
                                                       const LoadOptions& options) {
  auto loaded = std::make_unique<LoadedModel>();
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  SW_ASSIGN_OR_RETURN(loaded->config, ParseModelConfig(config_file.text, config_file.path));
  SW_RETURN_IF_ERROR(CheckTargetConfig(loaded->config, config_file.path));
  const std::string gen_path = (std::filesystem::path(dir) / "generation_config.json").string();
  if (std::filesystem::exists(gen_path)) {
    SW_ASSIGN_OR_RETURN(std::string gen_text, ReadFileToString(gen_path));
    SW_RETURN_IF_ERROR(ApplyGenerationConfig(gen_text, loaded->config, gen_path));
  }
  const ModelConfig& config = loaded->config;
  SW_ASSIGN_OR_RETURN(std::vector<at::Device> devices,
                      ResolveDeviceMap(options.device_map, config.num_layers));
  // float32 means float32 on a GPU too: cuDNN's convolutions (the Gated DeltaNet's causal
  // convolution) would otherwise round their inputs to TF32 (torch's default there; its matrix
  // products already default to full fp32), ~1e-3 from the CPU's and transformers' fp32 states.
  const bool cuda =
      std::any_of(devices.begin(), devices.end(), [](const at::Device& d) { return d.is_cuda(); });
  if (cuda && options.dtype == at::kFloat) at::globalContext().setAllowTF32CuDNN(false);
  // cuDNN's attention builds an execution plan for every new shape: a decoding step has a new
  // key length for every sequence at every step, and an extraction one per prompt length (an
  // H200 measured 72 ms per Qwen3-8B-shaped decoding step at batch 1 as key lengths grew,
  // against 23 ms for the same step at a fixed length; tiny bf16 targets decoded 10-16x slower
  // than fp32, which cuDNN does not serve). Flash and memory-efficient attention need no plan.
  if (cuda) at::globalContext().setSDPUseCuDNN(false);
  if (options.random_weights_seed.has_value()) {
    SW_RETURN_IF_ERROR(RunGuarded("drawing random weights for " + dir, [&]() -> absl::Status {
      SW_ASSIGN_OR_RETURN(loaded->model, BuildModel(config, options.dtype, options.kernels));
      DrawRandomWeights(*loaded->model, devices, options.dtype, *options.random_weights_seed);
      loaded->model->Prepare(devices);
      return absl::OkStatus();
    }));
    FillContract(*loaded->model, config, devices, options.dtype, loaded->contract);
    ExtractionContract& c = loaded->contract;
    c.source_layout = "random";
    c.source_architecture = config.architecture;
    c.weight_prefix = kTextPrefix;
    c.weights_digest = absl::StrCat("random:seed=", *options.random_weights_seed);
    loaded->model->ForEachWeight([&](const WeightSlot&) { ++c.tensors_loaded; });
    return loaded;
  }
  SW_ASSIGN_OR_RETURN(loaded->checkpoint, Checkpoint::Open(dir));
  const Checkpoint& ckpt = *loaded->checkpoint;

  // Source layout: where the text model's tensors live.
  bool vlm_tensors = false;
  for (const auto& [name, view] : ckpt.tensors()) {
    if (name.starts_with(kVlmPrefix)) vlm_tensors = true;
  }
  const std::string prefix = vlm_tensors ? kVlmPrefix : kTextPrefix;
  const bool vlm = vlm_tensors || config.vlm_packaged;

  absl::Status status = RunGuarded("loading " + dir, [&]() -> absl::Status {
    SW_ASSIGN_OR_RETURN(loaded->model, BuildModel(config, options.dtype, options.kernels));
    DecoderModel& model = *loaded->model;

    std::set<std::string> consumed;
    std::map<std::string, const TensorView*> loaded_by_canonical;  // for the digest
    std::vector<std::string> missing;
    absl::Status load_error;
    model.ForEachWeight([&](const WeightSlot& slot) {
      if (!load_error.ok()) return;
      std::string source = slot.name;
      if (source.starts_with(kTextPrefix)) source = prefix + source.substr(strlen(kTextPrefix));
      const TensorView* view = ckpt.Find(source);
      if (view == nullptr) {
        missing.push_back(source);
        return;
      }
      if (view->shape != slot.shape) {
        load_error = absl::InvalidArgumentError(
            absl::StrCat("tensor \"", source, "\" has shape ", ShapeString(view->shape),
                         " but config.json implies ", ShapeString(slot.shape)));
        return;
      }
      if (!IsFloat(view->dtype)) {
        load_error = absl::InvalidArgumentError(
            absl::StrCat("tensor \"", source, "\" is ", DTypeName(view->dtype),
                         "; weights must be BF16, F16 or F32"));
        return;
      }
      const at::ScalarType want = slot.keep_fp32 ? at::kFloat : options.dtype;
      // Same dtype on CPU: the mapped bytes are used in place.
      *slot.slot = WrapView(*view).to(want);
      consumed.insert(source);
      loaded_by_canonical[slot.name] = view;
    });
    SW_RETURN_IF_ERROR(load_error);
    if (!missing.empty()) {
      const size_t shown = std::min<size_t>(missing.size(), 8);
      return absl::InvalidArgumentError(absl::StrCat(
          missing.size(), " tensor(s) required by ", config.architecture,
          " missing from the checkpoint: ",
          absl::StrJoin(missing.begin(), missing.begin() + shown, ", "),
          missing.size() > shown ? ", ..." : ""));
    }

    // Everything not loaded is skipped for a reason, or is an error.
    std::map<std::string, SkippedTensors> skipped;
    auto skip = [&](const std::string& group, const std::string& reason,
                    const std::string& name = "") {
      auto& s = skipped[group];
      s.prefix = group;
      s.reason = reason;
      ++s.count;
      if (!name.empty()) s.names.push_back(name);
    };
    for (const auto& [name, view] : ckpt.tensors()) {
      if (consumed.count(name)) continue;
      bool handled = false;
      for (const SkipRule& rule : kSkipRules) {
        if (name.starts_with(rule.prefix) && (vlm || !rule.vlm_only)) {
          // The MTP head's tensors are named: a scorer fetches them to draft with it.
          skip(rule.prefix, rule.reason, std::string(rule.prefix) == "mtp." ? name : "");
          handled = true;
          break;
        }
      }
      if (handled) continue;
      if (name == "lm_head.weight" && config.tie_word_embeddings) {
        skip(name, "tie_word_embeddings: lm_head is model.embed_tokens.weight");
      } else if (name.ends_with("rotary_emb.inv_freq")) {
        skip("rotary_emb.inv_freq", "recomputed from config.json");
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("unexpected tensor \"", name, "\" in the checkpoint: ",
                         config.architecture, " has no such weight (source layout ",
                         vlm ? "vlm" : "text", ", prefix ", prefix, ")"));
      }
    }

    // Digest over canonical names and source bytes: the same weights give the same digest whatever
    // the packaging, dtype or device they run with.
    ContentDigest digest;
    for (const auto& [name, view] : loaded_by_canonical) {
      digest.UpdateField(name);
      digest.UpdateField(DTypeName(view->dtype));
      digest.UpdateField(ShapeString(view->shape));
      digest.Update(std::span<const std::byte>(view->data, view->nbytes));
    }

    model.Prepare(devices);

    ExtractionContract& c = loaded->contract;
    FillContract(model, config, devices, options.dtype, c);
    c.source_layout = vlm ? "vlm" : "text";
    c.source_architecture = config.vlm_packaged ? config.vlm_architecture : config.architecture;
    c.weight_prefix = prefix;
    c.tensors_loaded = static_cast<int64_t>(consumed.size());
    for (auto& [group, s] : skipped) {
      c.tensors_skipped += s.count;
      if (!s.names.empty()) {  // the MTP head: its own digest, as weights_digest is computed
        ContentDigest head;
        for (const std::string& name : s.names) {
          const TensorView* view = ckpt.Find(name);
          head.UpdateField(name);
          head.UpdateField(DTypeName(view->dtype));
          head.UpdateField(ShapeString(view->shape));
          head.Update(std::span<const std::byte>(view->data, view->nbytes));
        }
        s.digest = head.Hex();
      }
      c.skipped.push_back(s);
    }
    c.weights_digest = digest.Hex();
    c.config_json = config_file.text;
    const std::string tok_path = (std::filesystem::path(dir) / "tokenizer.json").string();
    if (std::filesystem::exists(tok_path)) {
      SW_ASSIGN_OR_RETURN(std::string tok, ReadFileToString(tok_path));
      c.tokenizer_digest =
          DigestBytes(std::as_bytes(std::span<const char>(tok.data(), tok.size())));
    }
    SW_ASSIGN_OR_RETURN(c.chat_template_digest, ChatTemplateDigest(dir));
    return absl::OkStatus();
  });
  SW_RETURN_IF_ERROR(status);
  return loaded;
}

}  // namespace specwire
