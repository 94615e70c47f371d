#include "clients/cli/feature_export.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/cli/arrow_stream.h"
#include "clients/cli/torch_save.h"
#include "common/checkpoint.h"
#include "common/contract.h"
#include "common/digest.h"
#include "common/status.h"

namespace specwire {
namespace {

using json = nlohmann::json;

constexpr char kManifest[] = "specwire_export.json";
constexpr char kArrowFile[] = "data-00000-of-00001.arrow";

std::string LongBytes(const std::vector<int64_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
}

// [T, sum of widths]: each row holds the states' rows side by side (torch.cat(states, -1)). With
// equal widths the same bytes are [T, n, H] (torch.stack(states, 1)).
std::string ConcatRows(const std::vector<const ReceivedState*>& states) {
  const int64_t rows = states.front()->rows;
  const size_t size = DTypeSize(states.front()->dtype);
  size_t width = 0;
  for (const ReceivedState* s : states) width += static_cast<size_t>(s->hidden) * size;
  std::string out(static_cast<size_t>(rows) * width, '\0');
  size_t at = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (const ReceivedState* s : states) {
      const size_t n = static_cast<size_t>(s->hidden) * size;
      std::memcpy(out.data() + at, s->bytes.data() + static_cast<size_t>(r) * n, n);
      at += n;
    }
  }
  return out;
}

// The specwire state behind each selected layer: SpecForge reads id k as transformers'
// hidden_states[k + 1], so its id L - 1 is the final-norm output (as dflash's reference code and
// the scorer read it); speculators' vLLM capture reads the last layer's output before the norm.
std::vector<std::string> LayerStates(const ExportSpec& spec, int32_t num_layers) {
  std::vector<std::string> out;
  for (int32_t k : spec.layer_ids) {
    out.push_back(spec.format == "specforge" && k == num_layers - 1 ? "final_norm"
                                                                     : absl::StrCat("layer.", k));
  }
  return out;
}

// The layers extracted for `spec`, and whether the final norm is.
std::pair<std::vector<int32_t>, bool> StatesOf(const ExportSpec& spec, int32_t num_layers) {
  std::vector<std::string> names = LayerStates(spec, num_layers);
  if (spec.format == "speculators") names.push_back(absl::StrCat("layer.", num_layers - 1));
  if (spec.format == "specforge" && spec.layout == "eagle3") names.push_back("final_norm");
  std::set<int32_t> ids;
  bool final_norm = false;
  for (const std::string& n : names) {
    if (n == "final_norm") {
      final_norm = true;
    } else {
      ids.insert(std::stoi(n.substr(6)));
    }
  }
  return {std::vector<int32_t>(ids.begin(), ids.end()), final_norm};
}

json FormatLayers(const ExportSpec& spec, int32_t num_layers) {
  json ids = spec.layer_ids;
  if (spec.format == "specforge") {
    json out = {{spec.layout == "dflash" ? "target_layer_ids" : "aux_hidden_state_layer_ids", ids},
                {"states", LayerStates(spec, num_layers)}};
    if (spec.layout == "eagle3") out["hidden_state"] = "final_norm";
    return out;
  }
  json hf = json::array();
  for (int32_t k : spec.layer_ids) hf.push_back(k + 1);
  json all = hf;
  all.push_back(num_layers);
  return {{spec.layout == "dflash" ? "target_layer_ids" : "eagle_aux_hidden_state_layer_ids", hf},
          {"hidden_states_layers", all},
          {"verifier_last_hidden_states",
           absl::StrCat("layer.", num_layers - 1, " (before the final norm)")}};
}

json SpeculatorsFeatures() {
  const json ints = {{"feature", {{"dtype", "int64"}, {"_type", "Value"}}}, {"_type", "List"}};
  return {{"input_ids", ints}, {"loss_mask", ints},
          {"seq_len", {{"dtype", "int64"}, {"_type", "Value"}}}};
}

// The `datasets` directory of the rows: the Arrow stream, state.json and dataset_info.json (the
// fingerprint, `datasets`' cache key, is a digest of the rows).
absl::Status WriteSpeculatorsRows(const std::string& dir, const std::vector<ExportRow>& rows) {
  std::vector<std::vector<int64_t>> ids, masks;
  std::vector<int64_t> lengths;
  ContentDigest digest;
  for (const ExportRow& r : rows) {
    ids.push_back(r.input_ids);
    masks.push_back(r.loss_mask);
    lengths.push_back(static_cast<int64_t>(r.input_ids.size()));
    digest.UpdateField(json::array({r.input_ids, r.loss_mask}).dump());
  }
  const json features = SpeculatorsFeatures();
  const std::string arrow = ArrowStream(
      {ArrowListColumn("input_ids", ids), ArrowListColumn("loss_mask", masks),
       ArrowColumn{"seq_len", false, lengths, {}}},
      {{"huggingface", json{{"info", {{"features", features}}}}.dump()}});
  SW_RETURN_IF_ERROR(WriteFileAtomically(dir + "/" + kArrowFile, arrow));
  const json state = {{"_data_files", json::array({{{"filename", kArrowFile}}})},
                      {"_fingerprint", digest.Hex().substr(9, 16)},
                      {"_format_columns", nullptr},
                      {"_format_kwargs", json::object()},
                      {"_format_type", "torch"},
                      {"_output_all_columns", false},
                      {"_split", nullptr}};
  const json info = {{"citation", ""}, {"description", ""}, {"features", features},
                     {"homepage", ""}, {"license", ""}};
  SW_RETURN_IF_ERROR(WriteFileAtomically(dir + "/state.json", state.dump(2)));
  return WriteFileAtomically(dir + "/dataset_info.json", info.dump(2));
}

// One sample's file.
absl::Status WriteSample(const ExportSpec& spec, int32_t num_layers, const std::string& dir,
                         size_t index, const ExportRow& row,
                         const std::map<std::string, const ReceivedState*>& states) {
  std::vector<const ReceivedState*> layers;
  for (const std::string& name : LayerStates(spec, num_layers)) {
    auto it = states.find(name);
    if (it == states.end()) {
      return absl::DataLossError(absl::StrCat("sample ", index, ": the stream has no ", name));
    }
    layers.push_back(it->second);
  }
  const int64_t t = static_cast<int64_t>(row.input_ids.size());
  for (const ReceivedState* s : layers) {
    if (s->rows != t) {
      return absl::DataLossError(absl::StrCat("sample ", index, ": ", s->state, " has ", s->rows,
                                              " rows for ", t, " tokens"));
    }
  }
  const int64_t hidden = layers.front()->hidden;
  const std::string ids = LongBytes(row.input_ids);
  if (spec.format == "speculators") {
    layers.push_back(states.at(absl::StrCat("layer.", num_layers - 1)));
    const std::string stacked = ConcatRows(layers);  // [T, n, H] = stack(states, 1)
    return WriteSafetensors(
        absl::StrCat(dir, "/hidden_states/hs_", index, ".safetensors"),
        {{"hidden_states", spec.dtype, {t, static_cast<int64_t>(layers.size()), hidden},
          std::as_bytes(std::span(stacked))},
         {"token_ids", DType::kI64, {t}, std::as_bytes(std::span(ids))}});
  }
  const int64_t width = hidden * static_cast<int64_t>(layers.size());
  std::vector<SavedTensor> d = {{"input_ids", DType::kI64, {t}, ids},
                                {"loss_mask", DType::kI64, {t}, LongBytes(row.loss_mask)}};
  if (spec.layout == "dflash") {
    d.push_back({"hidden_states", spec.dtype, {t, width}, ConcatRows(layers)});
  } else {
    const ReceivedState* norm = states.at("final_norm");
    d.push_back({"hidden_state", spec.dtype, {1, t, norm->hidden},
                 std::string(reinterpret_cast<const char*>(norm->bytes.data()), norm->bytes.size())});
    d.push_back({"aux_hidden_state", spec.dtype, {1, t, width}, ConcatRows(layers)});
  }
  size_t total = 0;
  for (const SavedTensor& x : d) total += x.bytes.size();
  if (total >= (uint64_t{1} << 32) - (1 << 20)) {
    return absl::OutOfRangeError(absl::StrCat(
        "sample ", index, ": ", total, " bytes of states; a .ckpt over 4 GiB needs zip64, which "
        "the export does not write (shorten the sequence or export fewer layers)"));
  }
  char name[32];
  std::snprintf(name, sizeof(name), "/data_%08zu.ckpt", index);
  return WriteFileAtomically(dir + name, TorchSaveDict(d));
}

// The integers of `v`; the error says what is wrong with `field` (the caller names the line).
absl::StatusOr<std::vector<int64_t>> IntList(const json& v, const char* field) {
  if (!v.is_array()) return absl::InvalidArgumentError(absl::StrCat(field, " is not a list"));
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const json& t : v) {
    if (!t.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " holds ", t.dump(), ", not an integer"));
    }
    out.push_back(t.get<int64_t>());
  }
  return out;
}

// SpecForge's DFlash reader refuses a sample without two consecutive supervised tokens: a
// specforge dflash export leaves such samples out (the manifest lists them).
bool Trainable(const ExportSpec& spec, const std::vector<int64_t>& loss_mask) {
  if (spec.format != "specforge" || spec.layout != "dflash") return true;
  for (size_t i = 0; i + 1 < loss_mask.size(); ++i) {
    if (loss_mask[i] && loss_mask[i + 1]) return true;
  }
  return false;
}

constexpr char kUntrainable[] =
    "no two consecutive supervised tokens (SpecForge's DFlash reader refuses it)";

}  // namespace

absl::Status CheckFormatAndLayout(const std::string& format, const std::string& layout) {
  if (format != "specforge" && format != "speculators") {
    return absl::InvalidArgumentError(
        absl::StrCat("--format: \"", format, "\" is not specforge or speculators"));
  }
  if (layout != "dflash" && layout != "eagle3") {
    return absl::InvalidArgumentError(
        absl::StrCat("--layout: \"", layout, "\" is not dflash or eagle3"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> DefaultExportLayers(const std::string& layout,
                                                         int32_t num_layers,
                                                         const json* drafter_config) {
  std::vector<int32_t> ids;
  const json cfg = drafter_config ? *drafter_config : json::object();
  try {
    if (layout == "dflash") {
      if (cfg.contains("dflash_config") && cfg["dflash_config"].contains("target_layer_ids")) {
        for (const json& v : cfg["dflash_config"]["target_layer_ids"]) ids.push_back(v.get<int32_t>());
      }
      if (ids.empty()) {
        return absl::InvalidArgumentError(
            "--layers: a dflash export needs the drafter's layers: give --layers or --drafter "
            "(a directory whose config.json has dflash_config.target_layer_ids)");
      }
      return ids;
    }
    if (cfg.contains("eagle_aux_hidden_state_layer_ids")) {
      for (const json& v : cfg["eagle_aux_hidden_state_layer_ids"]) ids.push_back(v.get<int32_t>() - 1);
      return ids;
    }
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("--drafter: config.json: ", e.what()));
  }
  ids = {1, num_layers / 2 - 1, num_layers - 4};
  if (std::set<int32_t>(ids.begin(), ids.end()).size() != 3 || *std::min_element(ids.begin(), ids.end()) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers: EAGLE-3's default aux layers [", absl::StrJoin(ids, ", "), "] do not fit a ",
        num_layers, "-layer target; give three distinct --layers"));
  }
  return ids;
}

absl::Status CheckExportLayers(const std::string& layout, const std::vector<int32_t>& ids,
                               int32_t num_layers) {
  if (ids.empty()) return absl::InvalidArgumentError("--layers: empty");
  for (int32_t k : ids) {
    if (k < 0 || k >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("--layers: ", k, " is outside the target's layers 0..",
                                                     num_layers - 1));
    }
  }
  if (std::set<int32_t>(ids.begin(), ids.end()).size() != ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--layers: [", absl::StrJoin(ids, ", "), "] repeats a layer"));
  }
  if (layout == "eagle3" && ids.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--layers: EAGLE-3 reads exactly three aux layers, got [", absl::StrJoin(ids, ", "), "]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ExportRow>> ReadExportDataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--dataset: ", path, ": cannot open"));
  std::vector<ExportRow> rows;
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto fail = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("--dataset: ", path, ":", line, ": ", what));
    };
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return fail("not a JSON object");
    if (j.contains("messages") && !j.contains("input_ids")) {
      return fail("has messages: render them first (python -m specwire_client.export renders "
                  "chat templates, or specwire_client.write_prepared_dataset)");
    }
    if (!j.contains("input_ids")) return fail("needs input_ids");
    ExportRow r;
    auto ids = IntList(j["input_ids"], "input_ids");
    if (!ids.ok()) return fail(std::string(ids.status().message()));
    r.input_ids = *std::move(ids);
    if (r.input_ids.empty()) return fail("input_ids is empty");
    if (std::any_of(r.input_ids.begin(), r.input_ids.end(), [](int64_t t) { return t < 0; })) {
      return fail("input_ids holds a negative token id");
    }
    if (j.contains("loss_mask") && !j["loss_mask"].is_null()) {
      auto mask = IntList(j["loss_mask"], "loss_mask");
      if (!mask.ok()) return fail(std::string(mask.status().message()));
      r.loss_mask = *std::move(mask);
      if (r.loss_mask.size() != r.input_ids.size()) {
        return fail(absl::StrCat("loss_mask has ", r.loss_mask.size(), " entries for ",
                                 r.input_ids.size(), " input_ids"));
      }
      if (std::any_of(r.loss_mask.begin(), r.loss_mask.end(), [](int64_t m) { return m != 0 && m != 1; })) {
        return fail("loss_mask entries must be 0 or 1");
      }
    } else {
      r.loss_mask.assign(r.input_ids.size(), 1);
    }
    if (j.contains("chat_template")) r.chat_template = j["chat_template"];
    rows.push_back(std::move(r));
  }
  if (rows.empty()) return absl::InvalidArgumentError(absl::StrCat("--dataset: ", path, ": no lines"));
  return rows;
}

absl::Status ExportFeatures(ExtractorClient& client, const ExtractionContract& contract,
                            const ExportSpec& spec, const std::vector<ExportRow>& rows,
                            const std::string& out_dir, const ExportOptions& options,
                            std::ostream& report) {
  const int32_t num_layers = contract.num_layers;
  std::error_code ec;
  std::filesystem::create_directories(
      spec.format == "speculators" ? out_dir + "/hidden_states" : out_dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("--out: ", out_dir, ": ", ec.message()));
  std::filesystem::remove(out_dir + "/" + kManifest, ec);

  const auto [ids, final_norm] = StatesOf(spec, num_layers);
  const size_t per_request = std::max<uint32_t>(1, options.sequences_per_request);
  uint64_t tokens = 0, supervised = 0, written = 0;
  json skipped = json::array();
  for (size_t start = 0; start < rows.size(); start += per_request) {
    const size_t end = std::min(rows.size(), start + per_request);
    ExtractParams p;
    for (size_t i = start; i < end; ++i) p.sequences.push_back(InputSequence::Tokens(rows[i].input_ids));
    p.states = {std::vector<int64_t>(ids.begin(), ids.end()), false, final_norm};
    p.dtype = spec.dtype;
    p.max_chunk_bytes = options.max_chunk_bytes;
    SW_ASSIGN_OR_RETURN(ExtractReply reply, client.Extract(p));
    if (reply.contract.weights_digest != contract.weights_digest ||
        reply.contract.num_layers != contract.num_layers ||
        reply.contract.hidden_size != contract.hidden_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the extractor now serves another target (weights ", reply.contract.weights_digest,
          ", was ", contract.weights_digest, "): the export would mix two targets"));
    }
    std::vector<std::map<std::string, const ReceivedState*>> by_seq(end - start);
    for (const ReceivedState& s : reply.states) by_seq.at(s.sequence_index)[s.state] = &s;
    for (size_t i = start; i < end; ++i) {
      if (reply.token_ids.at(i - start) != rows[i].input_ids) {
        return absl::DataLossError(absl::StrCat("sample ", i, ": the extractor ran other token ids"));
      }
      if (!Trainable(spec, rows[i].loss_mask)) {
        skipped.push_back({{"sample_index", i}, {"reason", kUntrainable}});
        continue;
      }
      SW_RETURN_IF_ERROR(WriteSample(spec, num_layers, out_dir, i, rows[i], by_seq[i - start]));
      ++written;
      tokens += rows[i].input_ids.size();
      for (int64_t m : rows[i].loss_mask) supervised += static_cast<uint64_t>(m);
    }
  }
  if (spec.format == "speculators") SW_RETURN_IF_ERROR(WriteSpeculatorsRows(out_dir, rows));

  json templates = json::array();
  std::set<size_t> left_out;
  for (const json& s : skipped) left_out.insert(s["sample_index"].get<size_t>());
  for (size_t i = 0; i < rows.size(); ++i) {
    const ExportRow& r = rows[i];
    if (left_out.count(i)) continue;
    if (!r.chat_template.is_null() &&
        std::find(templates.begin(), templates.end(), r.chat_template) == templates.end()) {
      templates.push_back(r.chat_template);
    }
  }
  const json manifest = {
      {"specwire_export", 1},
      {"format", spec.format},
      {"layout", spec.layout},
      {"dtype", spec.dtype == DType::kF32 ? "fp32" : "bf16"},
      {"layer_ids", spec.layer_ids},
      {"layer_numbering", "specwire: id k = output of decoder layer k = hidden_states[k + 1]"},
      {"format_layers", FormatLayers(spec, num_layers)},
      {"samples", written},
      {"tokens", tokens},
      {"supervised_tokens", supervised},
      {"skipped", skipped},
      {"chat_templates", templates},
      {"source", options.source},
      {"contract", json::parse(ContractToJson(contract, -1))},
  };
  SW_RETURN_IF_ERROR(WriteFileAtomically(out_dir + "/" + kManifest, manifest.dump(2) + "\n"));
  report << "wrote " << written << " samples (" << tokens << " tokens) to " << out_dir << " as "
         << spec.format << " " << spec.layout;
  if (!skipped.empty()) report << "; left out " << skipped.size() << " (" << kUntrainable << ")";
  report << "\n";
  return absl::OkStatus();
}

}  // namespace specwire
