#include "services/scorer/job/score_spec.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/job/extractor_pool.h"

namespace specwire {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string TrajectoryDigest(const std::vector<int64_t>& tokens) {
  ContentDigest d;
  d.Update(std::span<const std::byte>(reinterpret_cast<const std::byte*>(tokens.data()),
                                      tokens.size() * sizeof(int64_t)));
  return d.Hex();
}

std::vector<int64_t> CompletionTokens(const PromptScore& s) {
  const auto prompt = static_cast<size_t>(std::max<int64_t>(s.acceptance.prompt_tokens, 0));
  if (s.trajectory.empty() || s.trajectory.size() < prompt) return s.completion_tokens;
  return {s.trajectory.begin() + static_cast<std::ptrdiff_t>(prompt), s.trajectory.end()};
}

double MeanStepLength(const std::vector<int32_t>& lengths) {
  if (lengths.empty()) return 0;
  int64_t sum = 0;
  for (int32_t v : lengths) sum += v;
  return static_cast<double>(sum) / static_cast<double>(lengths.size());
}

absl::Status ValidateSpec(const ScoreSpec& spec, const ScoreLimits& o) {
  if (spec.drafter_path.empty()) return absl::InvalidArgumentError("drafter_path: empty");
  if (spec.prompts.empty() && spec.dataset_path.empty()) {
    return absl::InvalidArgumentError("prompts: none given (give prompts or dataset_path)");
  }
  if (!spec.prompts.empty() && !spec.dataset_path.empty()) {
    return absl::InvalidArgumentError("give either prompts or dataset_path, not both");
  }
  if (spec.max_prompts < 0) return absl::InvalidArgumentError("max_prompts: negative");
  if (spec.job_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: ", spec.job_id.size(), " characters, at most 128"));
  }
  for (char c : spec.job_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "job_id: \"", spec.job_id, "\" may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  if (!spec.job_id.empty() && spec.job_id.find_first_not_of('.') == std::string::npos) {
    return absl::InvalidArgumentError("job_id: \".\" and \"..\" are not ids");
  }
  if (static_cast<int64_t>(spec.prompts.size()) > o.max_prompts) {
    return absl::InvalidArgumentError(absl::StrCat("prompts: ", spec.prompts.size(),
                                                   " exceed the limit of ", o.max_prompts,
                                                   " (--max_prompts_per_job)"));
  }
  if (spec.max_new_tokens < 1 || spec.max_new_tokens > o.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: ", spec.max_new_tokens,
                                                   " is outside [1, ", o.max_new_tokens,
                                                   "] (--max_new_tokens_limit)"));
  }
  const BootstrapOptions& boot = spec.summary.bootstrap;
  if (boot.resamples < 0 || boot.resamples > o.max_bootstrap_resamples) {
    return absl::InvalidArgumentError(absl::StrCat("bootstrap_resamples: ", boot.resamples,
                                                   " is outside [0, ", o.max_bootstrap_resamples,
                                                   "]"));
  }
  if (!(boot.confidence > 0 && boot.confidence < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("confidence: ", boot.confidence, " is not in (0, 1)"));
  }
  if (spec.summary.token_window < 0 || spec.summary.token_window > 1000000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_window: ", spec.summary.token_window, " is outside [0, 1000000]"));
  }
  if (static_cast<int64_t>(spec.sampling.size()) > o.max_sampling_settings) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", spec.sampling.size(),
                                                   " settings, at most ",
                                                   o.max_sampling_settings));
  }
  for (size_t i = 0; i < spec.sampling.size(); ++i) {
    const SamplingSetting& x = spec.sampling[i];
    if (!std::isfinite(x.temperature) || x.temperature < 0 || x.temperature > 100) {
      return absl::InvalidArgumentError(absl::StrCat("sampling[", i, "].temperature: ",
                                                     x.temperature, " is outside [0, 100]"));
    }
    if (!(x.top_p > 0 && x.top_p <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling[", i, "].top_p: ", x.top_p, " is outside (0, 1]"));
    }
    if (x.top_k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling[", i, "].top_k: ", x.top_k, " is negative"));
    }
  }
  if (spec.predicted_cutoffs.size() > 16) {
    return absl::InvalidArgumentError(absl::StrCat("predicted_acceptance_cutoffs: ",
                                                   spec.predicted_cutoffs.size(),
                                                   " cutoffs, at most 16"));
  }
  for (size_t i = 0; i < spec.predicted_cutoffs.size(); ++i) {
    const double c = spec.predicted_cutoffs[i];
    if (!(c >= 0 && c <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("predicted_acceptance_cutoffs[", i, "]: ", c,
                                                     " is not a survival probability in [0, 1]"));
    }
  }
  if (spec.live.enabled) {
    const SamplingSetting& x = spec.live.setting;
    if (!std::isfinite(x.temperature) || x.temperature < 0 || x.temperature > 100) {
      return absl::InvalidArgumentError(absl::StrCat("live.sampling.temperature: ",
                                                     x.temperature, " is outside [0, 100]"));
    }
    if (!(x.top_p > 0 && x.top_p <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("live.sampling.top_p: ", x.top_p, " is outside (0, 1]"));
    }
    if (x.top_k < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("live.sampling.top_k: ", x.top_k, " is negative"));
    }
    if (spec.live.rule != kRuleArgmaxDraft && spec.live.rule != kRuleDraftDistribution) {
      return absl::InvalidArgumentError(absl::StrCat("live.rule: \"", spec.live.rule,
                                                     "\" is not \"", kRuleArgmaxDraft,
                                                     "\" or \"", kRuleDraftDistribution, "\""));
    }
    if (spec.live.self_check_prompts < 0) {
      return absl::InvalidArgumentError(absl::StrCat("live.self_check_prompts: ",
                                                     spec.live.self_check_prompts,
                                                     " is negative"));
    }
    if (!spec.sampling.empty()) {
      return absl::InvalidArgumentError(
          "sampling: teacher-forced acceptance is the replay's; a live job measures the real "
          "loop at live.sampling (leave sampling empty)");
    }
  }
  for (size_t i = 0; i < spec.prompts.size(); ++i) {
    if (spec.prompts[i].is_text &&
        static_cast<int64_t>(spec.prompts[i].text.size()) > o.max_text_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompts[", i, "].text: ", spec.prompts[i].text.size(),
                       " bytes exceed the limit of ", o.max_text_bytes, " (--max_text_bytes)"));
    }
  }
  if (static_cast<int64_t>(spec.ddtree_budgets.size()) > o.max_ddtree_budgets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ddtree_budgets: ", spec.ddtree_budgets.size(), " budgets exceed the limit of ",
        o.max_ddtree_budgets, " (--max_ddtree_budgets)"));
  }
  for (size_t i = 0; i < spec.ddtree_budgets.size(); ++i) {
    const int64_t b = spec.ddtree_budgets[i];
    if (b < 1 || b > o.max_ddtree_budget) {
      return absl::InvalidArgumentError(absl::StrCat("ddtree_budgets[", i, "]: ", b,
                                                     " is outside [1, ", o.max_ddtree_budget,
                                                     "] (--max_ddtree_budget)"));
    }
  }
  for (const auto& [field, v] : {std::pair<const char*, int32_t>{"tree_depth", spec.tree_depth},
                                  {"tree_top_k", spec.tree_top_k}}) {
    if (v < 0 || v > TreeSettings::kMaxSetting) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " is outside [1, ",
                                                     TreeSettings::kMaxSetting, "] (0: the default)"));
    }
  }
  if (!o.data_root.empty()) {
    std::error_code ec;
    const fs::path root = fs::weakly_canonical(o.data_root, ec);
    for (const auto& [field, path] :
         {std::pair<const char*, const std::string&>{"drafter_path", spec.drafter_path},
          {"dataset_path", spec.dataset_path}}) {
      if (path.empty()) continue;
      const fs::path p = fs::weakly_canonical(path, ec);
      const auto rel = p.lexically_relative(root);
      if (ec || rel.empty() || *rel.begin() == "..") {
        return absl::PermissionDeniedError(
            absl::StrCat(field, ": ", path, " is outside --data_root ", o.data_root));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TreeSettings> ResolveTrees(const ScoreSpec& spec, const std::string& tree,
                                          int32_t block_size) {
  TreeSettings t;
  if (tree.empty()) return t;  // the family drafts no tree
  t.budgets = spec.ddtree_budgets;
  if (tree != kTreeEagle) {
    t.method = kTreeDDTree;
    return t;
  }
  t.method = kTreeEagle;
  const int32_t chain = block_size - 1;
  t.depth = spec.tree_depth > 0 ? spec.tree_depth : chain;
  if (t.depth > chain) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tree_depth: ", spec.tree_depth, " levels exceed the drafter's chain of ", chain,
        " drafts (block_size ", block_size, "); at most ", chain));
  }
  t.top_k = spec.tree_top_k > 0 ? spec.tree_top_k : TreeSettings::kDefaultEagleTopK;
  return t;
}

ScoreLabels ResolveLabels(const ScoreSpec& spec) {
  ScoreLabels l = spec.labels;
  if (l.drafter.empty()) {
    const fs::path p = fs::path(spec.drafter_path).lexically_normal();
    l.drafter = p.filename().string();
    if (l.drafter.empty()) l.drafter = p.parent_path().filename().string();  // "dir/"
  }
  if (l.dataset.empty()) {
    l.dataset = spec.dataset_path.empty() ? "inline" : fs::path(spec.dataset_path).stem().string();
  }
  // method: the job's, else the drafter's family once it is loaded (ScoreRunner::Run).
  return l;
}
absl::StatusOr<std::string> CanonicalTemplateRecord(const std::string& text,
                                                    const std::string& where) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("digest") || !j["digest"].is_string() ||
      j["digest"].get<std::string>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": a chat template record is {\"digest\": str, \"flags\": {...}}"));
  }
  json flags = j.value("flags", json::object());
  if (flags.is_null()) flags = json::object();
  if (!flags.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": chat template flags must be an object"));
  }
  return json({{"digest", j["digest"]}, {"flags", flags}}).dump();
}

absl::Status CheckTemplateRecord(const std::string& drafter_dir, const std::string& record) {
  if (record.empty()) return absl::OkStatus();
  const std::string path = (fs::path(drafter_dir) / "specwire_training.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return absl::OkStatus();
  std::ifstream in(path);
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  if (!j.contains("chat_template") || j["chat_template"].is_null()) return absl::OkStatus();
  SW_ASSIGN_OR_RETURN(const std::string trained,
                      CanonicalTemplateRecord(j["chat_template"].dump(),
                                              absl::StrCat(path, ": chat_template")));
  if (trained != record) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chat template mismatch: the prompts were prepared with ", record,
        " but the drafter was trained on data prepared with ", trained, " (", path,
        "); prepare the prompts with the drafter's template and flags"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<InputSequence>> ReadPromptDataset(const std::string& path,
                                                             int64_t max_prompts) {
  return ReadPromptDataset(path, max_prompts, nullptr);
}

absl::StatusOr<std::vector<InputSequence>> ReadPromptDataset(const std::string& path,
                                                             int64_t max_prompts,
                                                             std::string* template_record) {
  std::optional<std::string> record;  // of the lines seen so far
  int64_t lines_with = 0, lines_without = 0;
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("dataset ", path, ": cannot open"));
  std::vector<InputSequence> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (max_prompts > 0 && static_cast<int64_t>(out.size()) >= max_prompts) break;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat("dataset ", path, " line ", line_no);
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    if (j.contains("chat_template") && !j["chat_template"].is_null()) {
      SW_ASSIGN_OR_RETURN(std::string r, CanonicalTemplateRecord(j["chat_template"].dump(),
                                                                 absl::StrCat(where, ": chat_template")));
      if (record && *record != r) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": chat_template ", r, " differs from the earlier lines' ", *record));
      }
      record = std::move(r);
      ++lines_with;
    } else {
      ++lines_without;
    }
    if (lines_with > 0 && lines_without > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": some lines carry a chat_template record and some do not"));
    }
    if (j.contains("input_ids")) {
      const json& ids = j.at("input_ids");
      if (!ids.is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": input_ids must be a list"));
      }
      std::vector<int64_t> v;
      for (const json& x : ids) {
        if (!x.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": input_ids must hold integers, got ", x.dump()));
        }
        v.push_back(x.get<int64_t>());
      }
      out.push_back(InputSequence::Tokens(std::move(v)));
    } else if (j.contains("prompt")) {
      if (!j.at("prompt").is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": prompt must be a string"));
      }
      out.push_back(InputSequence::Text(j.at("prompt").get<std::string>()));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected {\"prompt\": str} or {\"input_ids\": [int, ...]}"));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("dataset ", path, ": read error"));
  if (template_record != nullptr) *template_record = record.value_or("");
  return out;
}
absl::StatusOr<std::vector<std::vector<int64_t>>> ResolvePrompts(
    const ScoreSpec& spec, const ScoreLimits& limits, ExtractorEndpoint* tokenizer,
    const ExtractionContract& contract, std::string* template_record) {
  std::vector<InputSequence> inputs;
  std::string field = "prompts";
  std::string record;
  if (!spec.chat_template_record.empty()) {
    SW_ASSIGN_OR_RETURN(record,
                        CanonicalTemplateRecord(spec.chat_template_record, "chat_template_record"));
  }
  if (!spec.dataset_path.empty()) {
    // Reading stops one prompt past the limit: a huge file is refused without being held.
    const int64_t read_at_most = spec.max_prompts > 0 ? spec.max_prompts : limits.max_prompts + 1;
    std::string from_lines;
    SW_ASSIGN_OR_RETURN(inputs, ReadPromptDataset(spec.dataset_path, read_at_most, &from_lines));
    if (!from_lines.empty()) {
      if (!record.empty() && record != from_lines) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chat_template_record ", record, " differs from the dataset's lines' ", from_lines));
      }
      record = from_lines;
    }
    field = absl::StrCat("dataset ", spec.dataset_path, " prompt");
    if (static_cast<int64_t>(inputs.size()) > limits.max_prompts) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset ", spec.dataset_path, ": more than ", limits.max_prompts,
                       " prompts, the limit (--max_prompts_per_job; or set max_prompts)"));
    }
  } else {
    inputs = spec.prompts;
    if (spec.max_prompts > 0 && static_cast<int64_t>(inputs.size()) > spec.max_prompts) {
      inputs.resize(spec.max_prompts);
    }
  }
  if (inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": no prompt"));
  std::vector<std::vector<int64_t>> out(inputs.size());
  // Text prompts are tokenized by the extractor (the target's own tokenizer), in batches.
  std::vector<size_t> text_index;
  std::vector<std::string> texts;
  auto flush = [&]() -> absl::Status {
    if (texts.empty()) return absl::OkStatus();
    auto ids = tokenizer->Tokenize(texts, spec.add_special_tokens);
    if (!ids.ok()) {
      return Annotate(ids.status(),
                      absl::StrCat(field, "[", text_index.front(), "].text (Tokenize on ",
                                   tokenizer->address(), ")"));
    }
    if (ids->size() != texts.size()) {
      return absl::DataLossError(absl::StrCat("Tokenize returned ", ids->size(), " sequences for ",
                                              texts.size(), " texts"));
    }
    for (size_t k = 0; k < texts.size(); ++k) out[text_index[k]] = std::move((*ids)[k]);
    texts.clear();
    text_index.clear();
    return absl::OkStatus();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_text && static_cast<int64_t>(inputs[i].text.size()) > limits.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "].text: ", inputs[i].text.size(), " bytes exceed the limit of ",
          limits.max_text_bytes, " (--max_text_bytes)"));
    }
    if (inputs[i].is_text) {
      text_index.push_back(i);
      texts.push_back(inputs[i].text);
      if (texts.size() == 64) {
        SW_RETURN_IF_ERROR(flush());
      }
    } else {
      out[i] = inputs[i].token_ids;
    }
  }
  SW_RETURN_IF_ERROR(flush());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: empty"));
    for (size_t j = 0; j < out[i].size(); ++j) {
      if (out[i][j] < 0 || out[i][j] >= contract.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] token ", j, " = ",
                                                       out[i][j], " is outside the vocabulary [0, ",
                                                       contract.vocab_size, ")"));
      }
    }
  }
  if (template_record != nullptr) *template_record = record;
  return out;
}
}  // namespace specwire
