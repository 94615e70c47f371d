#include "services/scorer/job/results_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/digest.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json ScoreToJson(const PromptScore& s, const std::string& key) {
  json ddtree = json::object();
  for (const auto& [budget, lengths] : s.acceptance.ddtree_step_lengths) {
    ddtree[std::to_string(budget)] = lengths;
  }
  json sampled = json::array();
  for (const SampledAcceptance& a : s.acceptance.sampled) {
    sampled.push_back({{"temperature", a.setting.temperature},
                       {"top_p", a.setting.top_p},
                       {"top_k", a.setting.top_k},
                       {"rule", a.rule},
                       {"block_tau", a.block_tau},
                       {"alpha_sum", a.alpha_sum},
                       {"alpha_blocks", a.alpha_blocks}});
  }
  json out = {{"key", key},
          {"prompt_index", s.prompt_index},
          {"sampled", sampled},
          {"trajectory_digest", s.trajectory_digest},
          {"prompt_tokens", s.acceptance.prompt_tokens},
          {"completion_tokens", s.acceptance.completion_tokens},
          {"step_lengths", s.acceptance.step_lengths},
          {"ddtree", ddtree},
          {"finish_reason", s.finish_reason}};
  if (const std::optional<PredictedAcceptance>& p = s.acceptance.predicted) {
    json cuts = json::array();
    for (const auto& [cutoff, lengths] : p->cut_step_lengths) {
      cuts.push_back({{"cutoff", cutoff}, {"step_lengths", lengths}});
    }
    out["predicted"] = {{"accepted", p->accepted}, {"predicted", p->predicted}, {"cutoffs", cuts}};
  }
  return out;
}

// One journal line back into a PromptScore; nullopt for a line that is not one (torn, edited).
std::optional<PromptScore> ScoreFromJson(const json& j) {
  try {
    PromptScore s;
    s.prompt_index = j.at("prompt_index").get<int64_t>();
    s.acceptance.prompt_tokens = j.at("prompt_tokens").get<int64_t>();
    s.acceptance.completion_tokens = j.at("completion_tokens").get<int64_t>();
    s.acceptance.step_lengths = j.at("step_lengths").get<std::vector<int32_t>>();
    for (const auto& [budget, lengths] : j.at("ddtree").items()) {
      s.acceptance.ddtree_step_lengths[std::stoi(budget)] = lengths.get<std::vector<int32_t>>();
    }
    if (j.contains("sampled")) {
      for (const json& a : j.at("sampled")) {
        SampledAcceptance x;
        x.setting.temperature = a.at("temperature").get<double>();
        x.setting.top_p = a.at("top_p").get<double>();
        x.setting.top_k = a.at("top_k").get<int32_t>();
        x.rule = a.at("rule").get<std::string>();
        x.block_tau = a.at("block_tau").get<std::vector<double>>();
        x.alpha_sum = a.at("alpha_sum").get<std::vector<double>>();
        x.alpha_blocks = a.at("alpha_blocks").get<std::vector<int64_t>>();
        s.acceptance.sampled.push_back(std::move(x));
      }
    }
    if (j.contains("predicted")) {
      const json& p = j.at("predicted");
      PredictedAcceptance x;
      x.accepted = p.at("accepted").get<std::vector<int32_t>>();
      x.predicted = p.at("predicted").get<std::vector<std::vector<float>>>();
      for (const json& c : p.at("cutoffs")) {
        x.cut_step_lengths[c.at("cutoff").get<double>()] =
            c.at("step_lengths").get<std::vector<int32_t>>();
      }
      s.acceptance.predicted = std::move(x);
    }
    s.finish_reason = j.at("finish_reason").get<std::string>();
    s.trajectory_digest = j.value("trajectory_digest", std::string());
    s.tau = MeanStepLength(s.acceptance.step_lengths);
    s.resumed = true;
    if (s.prompt_index < 0) return std::nullopt;
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("results journal ", path, ": ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResultsJournal>> ResultsJournal::Open(const std::string& path,
                                                                     const std::string& key) {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::unique_ptr<ResultsJournal> j(new ResultsJournal());
  j->path_ = path;
  j->key_ = key;
  j->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (j->fd_ < 0) return ErrnoError("cannot open", path);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t got = ::read(j->fd_, buf, sizeof(buf));
    if (got < 0) return ErrnoError("cannot read", path);
    if (got == 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  // Only newline-terminated lines were written completely; a tail without one is a torn write,
  // cut off so the next line starts on a line of its own.
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {
    ++j->ignored_lines_;
    if (::ftruncate(j->fd_, static_cast<off_t>(complete)) != 0) {
      return ErrnoError("cannot cut the torn last line", path);
    }
  }
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text).substr(0, complete), '\n', absl::SkipWhitespace())) {
    json v = json::parse(line, nullptr, false);
    if (v.is_discarded() || !v.is_object() || !v.contains("key") || v.at("key") != key) {
      ++j->ignored_lines_;
      continue;
    }
    std::optional<PromptScore> score = ScoreFromJson(v);
    if (!score) {
      ++j->ignored_lines_;
      continue;
    }
    j->completed_[score->prompt_index] = std::move(*score);
  }
  if (::lseek(j->fd_, 0, SEEK_END) < 0) return ErrnoError("cannot seek", path);
  return j;
}

ResultsJournal::~ResultsJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ResultsJournal::Append(const PromptScore& score) {
  const std::string line = ScoreToJson(score, key_).dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot append", path_);
    }
    done += static_cast<size_t>(n);
  }
  // The line counts as kept only once it is on disk: a resumed job trusts every complete line.
  if (::fsync(fd_) != 0) return ErrnoError("cannot fsync", path_);
  PromptScore kept = score;
  kept.resumed = true;
  completed_[score.prompt_index] = std::move(kept);
  return absl::OkStatus();
}

absl::StatusOr<std::string> DigestDrafterFiles(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() &&
        (name == "config.json" || absl::EndsWith(name, ".safetensors"))) {
      files.push_back(entry.path());
    }
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("drafter_path ", dir, ": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  ContentDigest d;
  std::vector<char> buf(1 << 20);
  for (const fs::path& f : files) {
    d.UpdateField(f.filename().string());
    std::ifstream in(f, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("drafter file ", f.string(), ": cannot open"));
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const std::streamsize got = in.gcount();
      if (got > 0) d.Update(std::string_view(buf.data(), static_cast<size_t>(got)));
    }
  }
  return d.Hex();
}

std::string JobKey(const ScoreSpec& spec, const ExtractionContract& contract,
                   const DrafterSpec& drafter, const std::string& drafter_digest,
                   const std::vector<std::vector<int64_t>>& prompts, DType wire_dtype) {
  ContentDigest d;
  d.UpdateField("specwire-score-job-v1");
  d.UpdateField(spec.job_id);
  d.UpdateField(contract.weights_digest);
  d.UpdateField(contract.tokenizer_digest);
  d.UpdateField(contract.compute_dtype);
  d.UpdateField(drafter_digest);
  d.UpdateField(drafter.dtype);
  d.UpdateField(drafter.device);
  d.UpdateField(absl::StrCat(spec.max_new_tokens));
  d.UpdateField(absl::StrJoin(spec.ddtree_budgets, ","));
  // EAGLE's tree settings (a job without them keeps the key it had before they existed).
  if (spec.tree_depth != 0 || spec.tree_top_k != 0) {
    d.UpdateField(absl::StrCat("tree:", spec.tree_depth, ":", spec.tree_top_k));
  }
  d.UpdateField(spec.chat_template_record);
  for (const SamplingSetting& x : spec.sampling) {
    d.UpdateField(absl::StrCat("sampling:", x.temperature, ":", x.top_p, ":", x.top_k));
  }
  // The cutoffs (a job without them keeps the key it had before they existed).
  if (!spec.predicted_cutoffs.empty()) {
    d.UpdateField(absl::StrCat("predicted:", absl::StrJoin(spec.predicted_cutoffs, ",")));
  }
  // The live loop (a replay job keeps the key it had before live jobs existed).
  if (spec.live.enabled) {
    const SamplingSetting& x = spec.live.setting;
    d.UpdateField(absl::StrCat("live:", x.temperature, ":", x.top_p, ":", x.top_k, ":",
                               spec.live.rule, ":", spec.live.seed));
  }
  d.UpdateField(absl::StrCat(static_cast<int>(wire_dtype)));
  d.UpdateField(absl::StrCat(prompts.size()));
  for (const auto& p : prompts) d.UpdateField(absl::StrJoin(p, ","));
  return d.Hex();
}
std::string JournalOptions::PathFor(const ScoreSpec& spec) const {
  if (!results_file.empty()) return results_file;
  if (results_dir.empty() || spec.job_id.empty()) return "";
  return (fs::path(results_dir) / (spec.job_id + ".jsonl")).string();
}

}  // namespace specwire
