// specwire-score: runs one scoring job and writes its reports.
//
//   specwire-score --scorer ADDR    --drafter DIR (--dataset F | --prompts_file F | --tokens ..)
//   specwire-score --extractor ADDR --drafter DIR ...          (in-process: no scorer needed)
//
// Through a scorer, the drafter and a --dataset are paths on the scorer's host; in-process they
// are local and the drafter runs here, against the extractor(s) directly. Either way the same
// job logic (score_job.h) runs, so both give the same numbers. Progress goes to stderr (one
// updating line on a terminal, plain lines otherwise), the final table to stdout, the reports to
// --json_out and --html_out.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/checkpoint.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "proto/specwire/v1/scorer.grpc.pb.h"
#include "services/scorer/report.h"
#include "services/scorer/score_job.h"
#include "services/scorer/scorer_backend.h"
#include "services/scorer/server.h"

ABSL_FLAG(std::string, scorer, "", "A running specwire-scorer (host:port) to run the job on.");
ABSL_FLAG(std::string, extractor, "",
          "Run in-process instead, against these extractor(s): host:port, a comma list, or "
          "dns:///name:port.");
ABSL_FLAG(std::string, drafter, "",
          "DFlash drafter directory (config.json + safetensors). Required.");
ABSL_FLAG(std::string, dataset, "",
          "JSONL prompts, one {\"prompt\": str} or {\"input_ids\": [int]} per line (a path on the "
          "scorer's host with --scorer).");
ABSL_FLAG(std::string, prompts_file, "",
          "Local JSON list of prompts (each a string or a list of token ids), sent inline.");
ABSL_FLAG(std::string, tokens, "",
          "Inline prompts as token ids: \"1,2,3;4,5,6\" (';' separates prompts).");
ABSL_FLAG(std::string, text, "", "One inline text prompt (tokenized by the extractor).");
ABSL_FLAG(int64_t, max_prompts, 0, "Score the first N prompts only (0: all).");
ABSL_FLAG(int64_t, max_new_tokens, 256,
          "Greedy completion budget per prompt (dflash's max_new_tokens).");
ABSL_FLAG(std::string, ddtree, "8", "DDTree node budgets, comma-separated.");
ABSL_FLAG(std::string, drafter_label, "",
          "Metric/report label (default: the drafter directory's name).");
ABSL_FLAG(std::string, dataset_label, "",
          "Metric/report label (default: the dataset's file name or \"inline\").");
ABSL_FLAG(std::string, method_label, "", "Metric/report label (default \"dflash\").");
ABSL_FLAG(bool, add_special_tokens, false,
          "Tokenize text prompts with the tokenizer's special tokens.");
ABSL_FLAG(std::string, json_out, "", "Write the JSON report here.");
ABSL_FLAG(std::string, html_out, "", "Write the self-contained HTML report here.");
ABSL_FLAG(bool, quiet, false, "No progress on stderr.");
ABSL_FLAG(double, timeout, 0, "--scorer: deadline of the whole job in seconds (0: none).");
// In-process only.
ABSL_FLAG(std::string, dtype, "float32",
          "In-process: drafter compute dtype (float32 | bfloat16 | float16).");
ABSL_FLAG(std::string, wire_dtype, "auto",
          "In-process: feature dtype on the wire (fp32 | bf16 | auto).");
ABSL_FLAG(std::string, device, "cpu", "In-process: drafter device (cpu | cuda | cuda:N).");
ABSL_FLAG(int, threads, 0, "In-process: intra-op CPU threads (0: torch's default).");
ABSL_FLAG(std::string, cache_dir, "",
          "In-process: target-head cache (default $XDG_CACHE_HOME/specwire or ~/.cache/specwire; "
          "\"none\" disables it).");
ABSL_FLAG(std::string, target_checkpoint, "",
          "In-process: read embed_tokens / lm_head from this local target checkpoint.");
ABSL_FLAG(int64_t, prefetch, 1, "In-process: trajectories fetched ahead, per extractor.");

namespace specwire {
namespace {

using json = nlohmann::json;

// Progress on stderr: one line rewritten in place on a terminal; otherwise a plain line at most
// once a second (and at the end), so logs stay short.
class ProgressDisplay {
 public:
  explicit ProgressDisplay(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) == 1) {}

  void Update(const ScoreProgress& p) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    char line[256];
    std::snprintf(line, sizeof(line),
                  "scored %lld/%lld prompts  tau %.3f (pooled %.3f)  steps %lld  %.1fs",
                  static_cast<long long>(p.done), static_cast<long long>(p.total), p.tau_so_far,
                  p.tau_pooled_so_far, static_cast<long long>(p.steps), elapsed);
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line);
      std::fflush(stderr);
      open_line_ = true;
    } else if (p.done == p.total || now - last_ >= std::chrono::seconds(1) || p.done == 0) {
      std::fprintf(stderr, "%s\n", line);
      last_ = now;
    }
  }
  void End() {
    if (open_line_) std::fprintf(stderr, "\n");
    open_line_ = false;
  }

 private:
  bool quiet_;
  bool tty_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

std::string NowUtc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string DefaultCacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) {
    return absl::StrCat(x, "/specwire");
  }
  if (const char* h = std::getenv("HOME"); h != nullptr && *h) {
    return absl::StrCat(h, "/.cache/specwire");
  }
  return "";
}

absl::StatusOr<ScoreSpec> SpecFromFlags() {
  ScoreSpec s;
  s.drafter_path = absl::GetFlag(FLAGS_drafter);
  if (s.drafter_path.empty()) return absl::InvalidArgumentError("--drafter is required");
  s.dataset_path = absl::GetFlag(FLAGS_dataset);
  if (!absl::GetFlag(FLAGS_prompts_file).empty()) {
    SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(absl::GetFlag(FLAGS_prompts_file)));
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      return absl::InvalidArgumentError("--prompts_file: expected a JSON list of prompts");
    }
    for (size_t i = 0; i < j.size(); ++i) {
      if (j[i].is_string()) {
        s.prompts.push_back(InputSequence::Text(j[i].get<std::string>()));
      } else if (j[i].is_array()) {
        std::vector<int64_t> ids;
        for (const json& v : j[i]) {
          if (!v.is_number_integer()) {
            return absl::InvalidArgumentError(
                absl::StrCat("--prompts_file[", i, "]: token ids must be integers"));
          }
          ids.push_back(v.get<int64_t>());
        }
        s.prompts.push_back(InputSequence::Tokens(std::move(ids)));
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompts_file[", i, "]: a string or a list of ids"));
      }
    }
  }
  for (absl::string_view prompt :
       absl::StrSplit(absl::GetFlag(FLAGS_tokens), ';', absl::SkipWhitespace())) {
    std::vector<int64_t> ids;
    for (absl::string_view t : absl::StrSplit(prompt, ',', absl::SkipWhitespace())) {
      int64_t v;
      if (!absl::SimpleAtoi(t, &v)) {
        return absl::InvalidArgumentError(absl::StrCat("--tokens: \"", t, "\" is not an integer"));
      }
      ids.push_back(v);
    }
    s.prompts.push_back(InputSequence::Tokens(std::move(ids)));
  }
  if (!absl::GetFlag(FLAGS_text).empty())
    s.prompts.push_back(InputSequence::Text(absl::GetFlag(FLAGS_text)));
  s.max_prompts = absl::GetFlag(FLAGS_max_prompts);
  s.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  s.ddtree_budgets.clear();
  for (absl::string_view b :
       absl::StrSplit(absl::GetFlag(FLAGS_ddtree), ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(b, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--ddtree: \"", b, "\" is not an integer"));
    }
    s.ddtree_budgets.push_back(v);
  }
  s.labels.drafter = absl::GetFlag(FLAGS_drafter_label);
  s.labels.dataset = absl::GetFlag(FLAGS_dataset_label);
  s.labels.method = absl::GetFlag(FLAGS_method_label);
  s.add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
  return s;
}

ScoreReport NewReport(const ScoreSpec& spec) {
  ScoreReport r;
  r.created = NowUtc();
  r.drafter_path = spec.drafter_path;
  r.dataset_path = spec.dataset_path;
  r.max_new_tokens = spec.max_new_tokens;
  r.max_prompts = spec.max_prompts;
  r.ddtree_budgets = spec.ddtree_budgets;
  r.labels = ResolveLabels(spec);
  return r;
}

// Through a running scorer.
absl::Status RunOnScorer(const ScoreSpec& spec, ScoreReport& report, ProgressDisplay& progress) {
  report.mode = "scorer";
  report.endpoint = absl::GetFlag(FLAGS_scorer);
  // The drafter lives on the scorer's host; its config is reported when visible from here too.
  auto config =
      ReadFileToString((std::filesystem::path(spec.drafter_path) / "config.json").string());
  if (config.ok()) report.drafter.config_json = *config;
  report.drafter.path = spec.drafter_path;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  auto channel =
      grpc::CreateCustomChannel(report.endpoint, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Scorer::NewStub(channel);
  v1::ScoreRequest request;
  SpecToProto(spec, &request);
  grpc::ClientContext ctx;
  if (absl::GetFlag(FLAGS_timeout) > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         std::chrono::duration<double>(absl::GetFlag(FLAGS_timeout))));
  }
  auto reader = stub->Score(&ctx, request);
  v1::ScoreResponse m;
  bool summary = false;
  while (reader->Read(&m)) {
    switch (m.message_case()) {
      case v1::ScoreResponse::kContract:
        report.contract = ContractFromProto(m.contract());
        break;
      case v1::ScoreResponse::kProgress: {
        ScoreProgress p;
        p.done = m.progress().prompts_done();
        p.total = m.progress().prompts_total();
        p.steps = static_cast<int64_t>(m.progress().steps());
        p.tau_so_far = m.progress().tau_so_far();
        // The pooled τ so far is not on the wire; recomputed from the results received.
        int64_t steps = 0, tokens = 0;
        for (const PromptScore& s : report.prompts) {
          steps += static_cast<int64_t>(s.acceptance.step_lengths.size());
          for (int32_t v : s.acceptance.step_lengths) tokens += v;
        }
        p.tau_pooled_so_far = steps ? static_cast<double>(tokens) / steps : 0;
        progress.Update(p);
        break;
      }
      case v1::ScoreResponse::kResult:
        report.prompts.push_back(PromptScoreFromProto(m.result()));
        break;
      case v1::ScoreResponse::kSummary:
        report.summary = SummaryFromProto(m.summary());
        summary = true;
        break;
      default:
        break;
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (!summary) return absl::DataLossError("the scorer's stream ended without a summary");
  return absl::OkStatus();
}

// In-process: this program is the scorer.
absl::Status RunInProcess(const ScoreSpec& spec, ScoreReport& report, ProgressDisplay& progress) {
  report.mode = "in-process";
  report.endpoint = absl::GetFlag(FLAGS_extractor);
  TorchScorerOptions to;
  to.dtype = absl::GetFlag(FLAGS_dtype);
  to.device = absl::GetFlag(FLAGS_device);
  to.threads = absl::GetFlag(FLAGS_threads);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ScorerBackend> backend, MakeTorchScorerBackend(to));
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ExtractorPool> pool,
                      ExtractorPool::Create(report.endpoint, ExtractorClientOptions()));
  ScoreRunnerOptions ro;
  ro.target_checkpoint = absl::GetFlag(FLAGS_target_checkpoint);
  ro.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (ro.cache_dir.empty()) ro.cache_dir = DefaultCacheDir();
  if (ro.cache_dir == "none") ro.cache_dir.clear();
  const std::string wire = absl::GetFlag(FLAGS_wire_dtype);
  if (wire == "fp32" || wire == "float32" ||
      (wire == "auto" && (to.dtype == "float32" || to.dtype == "fp32"))) {
    ro.wire_dtype = DType::kF32;
  } else if (wire == "bf16" || wire == "bfloat16" || wire == "auto") {
    ro.wire_dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--wire_dtype \"", wire, "\" is not one of fp32, bf16, auto"));
  }
  ro.prefetch_per_extractor = absl::GetFlag(FLAGS_prefetch);
  ro.log = [&](const std::string& line) {
    if (!absl::GetFlag(FLAGS_quiet)) std::cerr << "specwire-score: " << line << std::endl;
  };
  ScoreRunner runner(backend.get(), pool.get(), ro);
  ScoreEvents events;
  events.on_start = [&](const ScoreStart& s) {
    report.contract = s.contract;
    report.drafter = s.drafter;
    report.drafter_loaded = true;
    report.labels = s.labels;
    report.extractors = s.extractors;
  };
  events.on_progress = [&](const ScoreProgress& p) { progress.Update(p); };
  events.on_prompt = [&](const PromptScore& s) { report.prompts.push_back(s); };
  events.on_summary = [&](const AcceptanceSummary& s) { report.summary = s; };
  std::atomic<bool> cancelled{false};
  return runner.Run(spec, events, cancelled);
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status Run() {
  const bool via_scorer = !absl::GetFlag(FLAGS_scorer).empty();
  if (via_scorer == !absl::GetFlag(FLAGS_extractor).empty()) {
    return absl::InvalidArgumentError("give exactly one of --scorer and --extractor (see --help)");
  }
  SW_ASSIGN_OR_RETURN(ScoreSpec spec, SpecFromFlags());
  ScoreReport report = NewReport(spec);
  ProgressDisplay progress(absl::GetFlag(FLAGS_quiet));
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status status =
      via_scorer ? RunOnScorer(spec, report, progress) : RunInProcess(spec, report, progress);
  progress.End();
  SW_RETURN_IF_ERROR(status);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(
      report.prompts.begin(), report.prompts.end(),
      [](const PromptScore& a, const PromptScore& b) { return a.prompt_index < b.prompt_index; });
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_json_out), ReportToJson(report)));
  }
  if (!absl::GetFlag(FLAGS_html_out).empty()) {
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_html_out), ReportToHtml(report)));
  }
  std::cout << SummaryTable(report) << std::flush;
  return absl::OkStatus();
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "specwire-score (--scorer ADDR | --extractor ADDR) --drafter DIR (--dataset F | "
      "--prompts_file F | --tokens IDS | --text T) [flags]\n"
      "Scores a DFlash drafter (τ, per-position acceptance, DDTree-N) and writes JSON / HTML "
      "reports.");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return file.find("score_cli_main") != absl::string_view::npos;
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  absl::Status s = specwire::Run();
  if (!s.ok()) {
    std::cerr << "specwire-score: " << s.ToString() << std::endl;
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
