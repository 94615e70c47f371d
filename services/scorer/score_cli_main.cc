// specwire-score: runs one scoring job and writes its reports.
//
//   specwire-score --scorer ADDR    --drafter DIR (--dataset F | --prompts_file F | --tokens ..)
//   specwire-score --extractor ADDR --drafter DIR ...          (in-process: no scorer needed)
//   specwire-score --extractor ADDR --watch_dir DIR --eval_sets ...   (continuous evaluation)
//   specwire-score --reconcile SERVED --drafter DIR --target_checkpoint DIR [-- OPTIONS]
//                                                     (served acceptance against the canonical)
//
// Through a scorer, the drafter and a --dataset are paths on the scorer's host; in-process they
// are local and the drafter runs here, against the extractor(s) directly. Either way the same
// job logic (score_job.h) runs, so both give the same numbers. Progress goes to stderr (one
// updating line on a terminal, plain lines otherwise), the final table to stdout, the reports to
// --json_out and --html_out. The connection, runner and eval flags are the shared modules'
// (clients/cpp/*_connection_flags.h, runner_flags.h, eval_flags.h), spelled as in
// specwire-scorer.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/cpp/extractor_connection_flags.h"
#include "clients/cpp/scorer_connection_flags.h"
#include "common/checkpoint.h"
#include "common/command_line.h"
#include "common/digest.h"
#include "common/request_flags.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/security.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "proto/specwire/v1/scorer.grpc.pb.h"
#include "services/scorer/report/compare.h"
#include "services/scorer/report/reconcile_command.h"
#include "services/scorer/eval/eval_flags.h"
#include "services/scorer/replay/score_flags.h"
#include "services/scorer/report/report.h"
#include "services/scorer/runner_flags.h"
#include "services/scorer/job/score_job.h"
#include "services/scorer/job/scorer_backend.h"
#include "services/scorer/server.h"
#include "services/scorer/eval/watch.h"

// The job (both modes).
ABSL_FLAG(std::string, drafter, "",
          "The drafter: a checkpoint directory (config.json + safetensors) of any family "
          "specwire reads; its config.json declares which (DFlash, DFlash2, DSpark, Domino, "
          "EAGLE-3, P-EAGLE, MTP, XPress: a target directory with mtp.* tensors drafts with its own head). "
          "\"mtp\": the served target's own multi-token-prediction head, its mtp.* tensors and "
          "config.json fetched from the extractor (or read from --target_checkpoint). Required.");
ABSL_FLAG(std::string, dataset, "",
          "JSONL prompts, one {\"prompt\": str} or {\"input_ids\": [int]} per line (a path on the "
          "scorer's host with --scorer).");
ABSL_FLAG(int64_t, max_prompts, 0, "Score the first N prompts only (0: all).");
ABSL_FLAG(std::string, ddtree, "8",
          "Tree node budgets, comma-separated: DDTree-N for DFlash, EAGLE's top-k tree "
          "(total_tokens) for EAGLE-3.");
ABSL_FLAG(int32_t, tree_depth, 0,
          "EAGLE-3: levels of EAGLE's tree (0: the drafter's whole chain).");
ABSL_FLAG(int32_t, tree_top_k, 0, "EAGLE-3: children per expanded node of EAGLE's tree (0: 8).");
ABSL_FLAG(std::string, drafter_label, "",
          "Metric/report label (default: the drafter directory's name).");
ABSL_FLAG(std::string, dataset_label, "",
          "Metric/report label (default: the dataset's file name or \"inline\").");
ABSL_FLAG(std::string, method_label, "",
          "Metric/report label (default: the drafter's family, dflash or eagle3).");
ABSL_FLAG(bool, add_special_tokens, false,
          "Tokenize text prompts with the tokenizer's special tokens.");
ABSL_FLAG(std::string, json_out, "", "Write the JSON report here.");
ABSL_FLAG(std::string, html_out, "", "Write the self-contained HTML report here.");
ABSL_FLAG(bool, quiet, false, "No progress on stderr.");
ABSL_FLAG(std::string, job_id, "",
          "Names the job for resumption ([A-Za-z0-9._-], at most 128). --scorer: default a random "
          "id; a scorer with --results_dir resumes a job submitted again under it.");
ABSL_FLAG(std::string, chat_template_record, "",
          "The chat template record (JSON, specwire_client.chat.TemplateRecord) the prompts were "
          "prepared under; a drafter trained under another one is refused.");
// Statistics of the summary (and --bootstrap_resamples, --bootstrap_seed: score_flags.h).
ABSL_FLAG(int64_t, token_window, 64,
          "Report tau by completion-token window of this many tokens (0: no windows).");
ABSL_FLAG(std::string, temperature, "",
          "Teacher-forced acceptance at T > 0: settings \"T[:top_p[:top_k]]\", comma-separated "
          "(e.g. \"0.6:0.95:20,1.0\"); each reports tau_prob under both verification rules.");
ABSL_FLAG(std::string, live, "",
          "The real loop instead of the greedy replay, at a setting \"T[:top_p[:top_k]]\" (\"0\": "
          "greedy): each prompt through a live verification session on the extractor, the "
          "drafter drafting on what the target committed. Empty: the replay.");
ABSL_FLAG(std::string, live_rule, "argmax_draft",
          "With --live: argmax_draft (the drafter's argmax, q one-hot) or draft_distribution "
          "(drafts sampled from the drafter's q).");
ABSL_FLAG(uint64_t, live_seed, 0, "With --live: the seed of prompt 0's draws (prompt i: + i).");
ABSL_FLAG(int64_t, live_self_check, 2,
          "With --live at T = 0: prompts also replayed and compared step for step (0: none).");
// Capacity planning (the report's cost model).
ABSL_FLAG(double, plan_drafter_cost, 0.1,
          "Capacity plan: one drafter forward, in target decode forwards.");
ABSL_FLAG(double, plan_verify_cost_per_token, 0.01,
          "Capacity plan: the extra cost of verifying one more draft token, in target decode "
          "forwards.");
ABSL_FLAG(bool, plan_autoregressive, false,
          "Capacity plan: the drafter runs one forward per draft token (EAGLE-style) rather than "
          "one per block (DFlash).");
ABSL_FLAG(std::string, vllm_synthetic_out, "",
          "Write vLLM's --speculative-config for its synthetic acceptance mode at the recommended "
          "k (per-position acceptance rates of this drafter) to this file.");
// Paired comparison.
ABSL_FLAG(std::string, compare, "",
          "--compare A B: a paired comparison of two drafters on the same prompts and "
          "trajectories; A and B are report JSON files (--json_out of earlier runs) or drafter "
          "directories (scored here with the job flags). Writes the comparison to --json_out / "
          "--html_out.");
// Served against canonical.
ABSL_FLAG(std::string, reconcile, "",
          "--reconcile DIR: a serving engine's acceptance on a set of prompts (DIR: the record "
          "specwire_client.served.drive_openai writes: vLLM's counters before and after, its "
          "per-request metrics, SGLang's meta_info, the settings and prompts) against specwire's "
          "on the same prompts and sampling (the greedy replay of --target_checkpoint; with "
          "--extractor, the live loop at the served temperature), per position with intervals, "
          "paired where requests pair, and the known cause that fits when they differ. Runs "
          "specwire_client.reconcile (its options after \"--\": --drive URL --served_model M, "
          "--metrics_after F, --diagnose always, --features F, ...); exit 1 when they differ.");
// Through a scorer.
ABSL_FLAG(int, scorer_attempts, 5,
          "--scorer: submissions of the job at most when the scorer goes away (UNAVAILABLE); "
          "each is sent with the same job_id.");
// In-process.
ABSL_FLAG(std::string, resume_file, "",
          "In-process: keep each completed prompt in this JSONL file (fsync'ed); run again with "
          "the same file and flags, only the prompts not in it are scored.");
// Watch mode (--watch_dir, in-process): the rest of its flags are eval_flags.h's.
ABSL_FLAG(int64_t, watch_scans, 0,
          "--watch_dir: stop after this many scans (0: until interrupted).");

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

// "T[:top_p[:top_k]],...".
absl::StatusOr<std::vector<SamplingSetting>> ParseSamplingSettings(absl::string_view flag) {
  std::vector<SamplingSetting> out;
  for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    const std::vector<std::string> parts = absl::StrSplit(item, ':');
    SamplingSetting x;
    bool ok = parts.size() <= 3 && absl::SimpleAtod(parts[0], &x.temperature);
    if (ok && parts.size() > 1) ok = absl::SimpleAtod(parts[1], &x.top_p);
    if (ok && parts.size() > 2) ok = absl::SimpleAtoi(parts[2], &x.top_k);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--temperature: \"", item, "\" is not T[:top_p[:top_k]] (e.g. 0.7:0.95:20)"));
    }
    out.push_back(x);
  }
  return out;
}

// The job the flags describe; `drafter` ("" : --drafter) is the directory to score.
absl::StatusOr<ScoreSpec> SpecFromFlags(const std::string& drafter) {
  ScoreSpec s;
  s.drafter_path = drafter.empty() ? absl::GetFlag(FLAGS_drafter) : drafter;
  if (s.drafter_path.empty()) return absl::InvalidArgumentError("--drafter is required");
  s.dataset_path = absl::GetFlag(FLAGS_dataset);
  // Inline prompts, sent with the job: --prompts_file's, --text, then --tokens' / --tokens_file's.
  SW_ASSIGN_OR_RETURN(s.prompts, TextPromptsFromFlags());
  SW_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> seqs, TokenSequencesFromFlags());
  for (std::vector<int64_t>& ids : seqs) s.prompts.push_back(InputSequence::Tokens(std::move(ids)));
  s.max_prompts = absl::GetFlag(FLAGS_max_prompts);
  s.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  s.ddtree_budgets.clear();
  SW_ASSIGN_OR_RETURN(const std::vector<int64_t> budgets,
                      ParseIntList(absl::GetFlag(FLAGS_ddtree), "ddtree"));
  for (int64_t b : budgets) {
    if (b < 1 || b > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("--ddtree: ", b, " is not a node budget"));
    }
    s.ddtree_budgets.push_back(static_cast<int32_t>(b));
  }
  s.tree_depth = absl::GetFlag(FLAGS_tree_depth);
  s.tree_top_k = absl::GetFlag(FLAGS_tree_top_k);
  s.labels.drafter = absl::GetFlag(FLAGS_drafter_label);
  s.labels.dataset = absl::GetFlag(FLAGS_dataset_label);
  s.labels.method = absl::GetFlag(FLAGS_method_label);
  s.add_special_tokens = absl::GetFlag(FLAGS_add_special_tokens);
  s.job_id = absl::GetFlag(FLAGS_job_id);
  s.chat_template_record = absl::GetFlag(FLAGS_chat_template_record);
  s.summary.bootstrap.resamples = absl::GetFlag(FLAGS_bootstrap_resamples);
  s.summary.bootstrap.seed = absl::GetFlag(FLAGS_bootstrap_seed);
  s.summary.token_window = absl::GetFlag(FLAGS_token_window);
  SW_ASSIGN_OR_RETURN(s.sampling, ParseSamplingSettings(absl::GetFlag(FLAGS_temperature)));
  SW_ASSIGN_OR_RETURN(s.predicted_cutoffs,
                      ParseSurvivalCutoffs(absl::GetFlag(FLAGS_dspark_cutoff), "--dspark_cutoff"));
  if (!absl::GetFlag(FLAGS_live).empty()) {
    auto live = ParseSamplingSettings(absl::GetFlag(FLAGS_live));
    if (!live.ok() || live->size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--live: \"", absl::GetFlag(FLAGS_live), "\" is not one T[:top_p[:top_k]] setting"));
    }
    s.live.enabled = true;
    s.live.setting = live->front();
    s.live.rule = absl::GetFlag(FLAGS_live_rule);
    s.live.seed = absl::GetFlag(FLAGS_live_seed);
    s.live.self_check_prompts = absl::GetFlag(FLAGS_live_self_check);
  }
  return s;
}

// A job id for resubmission through a scorer: 16 random hex digits.
std::string RandomJobId() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                    static_cast<uint64_t>(std::time(nullptr)));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "job-%016llx", static_cast<unsigned long long>(g()));
  return buf;
}

ScoreReport NewReport(const ScoreSpec& spec) {
  ScoreReport r;
  r.created = UtcNow();
  r.drafter_path = spec.drafter_path;
  r.dataset_path = spec.dataset_path;
  r.max_new_tokens = spec.max_new_tokens;
  r.max_prompts = spec.max_prompts;
  r.ddtree_budgets = spec.ddtree_budgets;
  r.labels = ResolveLabels(spec);
  r.capacity.drafter_cost = absl::GetFlag(FLAGS_plan_drafter_cost);
  r.capacity.verify_cost_per_token = absl::GetFlag(FLAGS_plan_verify_cost_per_token);
  r.capacity.autoregressive = absl::GetFlag(FLAGS_plan_autoregressive);
  // Digests of the inputs visible from here (through a scorer, its host's files may not be).
  const std::string prompts_path = !spec.dataset_path.empty()  ? spec.dataset_path
                                   : !PromptsFilePath().empty() ? PromptsFilePath()
                                                                : TokensFilePath();
  r.inputs.dataset_digest = FileDigestOrEmpty(prompts_path);
  if (auto d = CheckpointDigest(spec.drafter_path); d.ok()) r.inputs.drafter_digest = *d;
  return r;
}

// Through a running scorer.
absl::Status RunOnScorer(const ScoreSpec& spec, const ScorerConnection& scorer, ScoreReport& report,
                         ProgressDisplay& progress) {
  report.mode = "scorer";
  report.endpoint = scorer.address;
  // The drafter lives on the scorer's host; its config is reported when visible from here too.
  auto config = ReadConfigFile(spec.drafter_path);
  if (config.ok()) report.drafter.config_json = config->text;
  report.drafter.path = spec.drafter_path;

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  // Reconnect soon after a restarted scorer listens again (gRPC's default backoff grows to 2 min).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = MakeChannel(report.endpoint, scorer.security, args);
  auto stub = v1::Scorer::NewStub(channel);
  v1::ScoreRequest request;
  SpecToProto(spec, &request);
  // The whole job's deadline, across resubmissions.
  const auto deadline = scorer.timeout_seconds > 0
                            ? std::chrono::system_clock::now() +
                                  std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      std::chrono::duration<double>(scorer.timeout_seconds))
                            : std::chrono::system_clock::time_point::max();
  // Results by prompt index: a resubmitted job streams the prompts it kept again.
  std::map<int64_t, PromptScore> results;
  const int attempts = std::max(1, absl::GetFlag(FLAGS_scorer_attempts));
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    if (deadline != std::chrono::system_clock::time_point::max()) ctx.set_deadline(deadline);
    auto reader = stub->Score(&ctx, request);
    v1::ScoreResponse m;
    bool summary = false;
    while (reader->Read(&m)) {
      switch (m.message_case()) {
        case v1::ScoreResponse::kContract:
          report.contract = ContractFromProto(m.contract());
          report.extractors.assign(m.extractors().begin(), m.extractors().end());
          if (report.labels.method.empty()) report.labels.method = m.method_label();
          report.drafter.method = m.drafter_method();
          report.drafter.format = m.drafter_format();
          report.drafter.dtype = m.drafter_dtype();
          report.drafter.device = m.drafter_device();
          break;
        case v1::ScoreResponse::kProgress: {
          ScoreProgress p;
          p.done = m.progress().prompts_done();
          p.total = m.progress().prompts_total();
          p.steps = static_cast<int64_t>(m.progress().steps());
          p.tau_so_far = m.progress().tau_so_far();
          // The pooled τ so far is not on the wire; recomputed from the results received.
          int64_t steps = 0, tokens = 0;
          for (const auto& [i, s] : results) {
            steps += static_cast<int64_t>(s.acceptance.step_lengths.size());
            for (int32_t v : s.acceptance.step_lengths) tokens += v;
          }
          p.tau_pooled_so_far = steps ? static_cast<double>(tokens) / steps : 0;
          progress.Update(p);
          break;
        }
        case v1::ScoreResponse::kResult: {
          PromptScore s = PromptScoreFromProto(m.result());
          results[s.prompt_index] = std::move(s);
          break;
        }
        case v1::ScoreResponse::kSummary:
          report.summary = SummaryFromProto(m.summary());
          summary = true;
          break;
        default:
          break;
      }
    }
    grpc::Status status = reader->Finish();
    if (status.ok()) {
      if (!summary) return absl::DataLossError("the scorer's stream ended without a summary");
      break;
    }
    // UNAVAILABLE: the scorer went away (restarted, connection reset). The same job under the
    // same job_id is submitted again; a scorer with --results_dir resumes it where it stopped.
    absl::Status failed = FromGrpcStatus(status);
    if (!absl::IsUnavailable(failed) || attempt >= attempts) {
      if (attempt > 1) {
        return Annotate(failed, absl::StrCat("job ", spec.job_id, " after ", attempt,
                                             " submissions (--scorer_attempts)"));
      }
      return failed;
    }
    const double wait = std::min(0.2 * std::pow(2.0, attempt - 1), 3.0);
    if (!absl::GetFlag(FLAGS_quiet)) {
      std::cerr << "\nspecwire-score: the scorer is unavailable (" << failed.message()
                << "); submitting job " << spec.job_id << " again in " << wait << " s (attempt "
                << attempt + 1 << " of " << attempts << ")" << std::endl;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  for (auto& [i, s] : results) report.prompts.push_back(std::move(s));
  return absl::OkStatus();
}

void Log(const std::string& line) {
  if (!absl::GetFlag(FLAGS_quiet)) std::cerr << "specwire-score: " << line << std::endl;
}

// In-process, this program is the scorer: the drafter runs here, against the extractor(s).
struct InProcessScorer {
  std::unique_ptr<ScorerBackend> backend;
  std::unique_ptr<ExtractorPool> pool;
  std::unique_ptr<ScoreRunner> runner;  // uses both above
};

// The runner flags (runner_flags.h, as specwire-scorer's) plus the journal file of one job.
absl::StatusOr<InProcessScorer> StartInProcess(const ExtractorConnection& extractors,
                                               const std::string& resume_file) {
  SW_ASSIGN_OR_RETURN(ScoreRunnerOptions ro, RunnerOptionsFromFlags());
  ro.journal.results_file = resume_file;
  ro.log = Log;
  InProcessScorer s;
  SW_ASSIGN_OR_RETURN(s.backend, MakeTorchScorerBackend(DrafterOptionsFromFlags()));
  SW_ASSIGN_OR_RETURN(s.pool, ExtractorPool::Create(extractors.address, extractors.client));
  s.runner = std::make_unique<ScoreRunner>(s.backend.get(), s.pool.get(), std::move(ro));
  return s;
}

absl::Status RunInProcess(const ScoreSpec& spec, const ExtractorConnection& extractors,
                          ScoreReport& report, ProgressDisplay& progress) {
  report.mode = "in-process";
  report.endpoint = extractors.address;
  SW_ASSIGN_OR_RETURN(InProcessScorer scorer,
                      StartInProcess(extractors, absl::GetFlag(FLAGS_resume_file)));
  ScoreEvents events;
  events.on_start = [&](const ScoreStart& s) {
    report.contract = s.contract;
    report.drafter = s.drafter;
    report.drafter_loaded = true;
    report.labels = s.labels;
    report.extractors = s.extractors;
    report.chat_template_record = s.chat_template_record;
  };
  events.on_progress = [&](const ScoreProgress& p) { progress.Update(p); };
  events.on_prompt = [&](const PromptScore& s) { report.prompts.push_back(s); };
  events.on_summary = [&](const AcceptanceSummary& s) { report.summary = s; };
  std::atomic<bool> cancelled{false};
  return scorer.runner->Run(spec, events, cancelled);
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::atomic<bool> g_watch_stop{false};
void OnWatchSignal(int) { g_watch_stop = true; }

// specwire-score --watch_dir DIR --extractor ADDR: the drafter runs here; each new checkpoint
// is scored once per eval set and recorded (the scorer service's --watch_dir, without a
// service; the same eval flags).
absl::Status RunWatch(ContinuousEvalOptions eval, const ExtractorConnection& extractors) {
  if (extractors.address.empty()) {
    return absl::InvalidArgumentError(
        "--watch_dir runs in-process: give --extractor (a scorer service watches with its own "
        "--watch_dir, or takes uploads from specwire_client.ScorerClient)");
  }
  if (eval.evaluator.eval_sets.empty() && !absl::GetFlag(FLAGS_dataset).empty()) {
    SW_ASSIGN_OR_RETURN(eval.evaluator.eval_sets, ParseEvalSets(absl::GetFlag(FLAGS_dataset)));
  }
  if (eval.evaluator.eval_sets.empty()) {
    return absl::InvalidArgumentError("--watch_dir needs --eval_sets (or --dataset)");
  }
  SW_ASSIGN_OR_RETURN(InProcessScorer scorer, StartInProcess(extractors, ""));
  ScoreRunner* runner = scorer.runner.get();
  ScoreFn score = [runner](const ScoreSpec& spec) -> absl::StatusOr<EvalScore> {
    std::optional<AcceptanceSummary> summary;
    std::vector<PromptScore> prompts;
    CanaryFingerprint canary;
    std::string provenance;
    ScoreEvents events;
    events.on_start = [&](const ScoreStart& s) {
      canary = s.contract.canary;
      provenance = ScoreProvenanceJson(s.contract, s.drafter.dtype, s.chat_template_record,
                                       FileDigestOrEmpty(spec.dataset_path), "");
    };
    events.on_summary = [&](const AcceptanceSummary& s) { summary = s; };
    events.on_prompt = [&](const PromptScore& p) { prompts.push_back(p); };
    SW_RETURN_IF_ERROR(runner->Run(spec, events, g_watch_stop));
    if (!summary) return absl::InternalError("the scoring job ended without a summary");
    return EvalScore{*summary, std::move(prompts), std::move(canary), std::move(provenance)};
  };
  const std::string db_path =
      eval.db_path.empty()
          ? (std::filesystem::path(eval.watch.dir) / "specwire-eval.sqlite").string()
          : eval.db_path;
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ResultsDb> db, ResultsDb::Open(db_path));
  eval.evaluator.log = Log;
  ContinuousEvaluator evaluator(db.get(), score, eval.evaluator, nullptr);
  CheckpointWatcher watcher(&evaluator, eval.watch, nullptr);
  signal(SIGINT, OnWatchSignal);
  signal(SIGTERM, OnWatchSignal);
  Log(absl::StrCat("watching ", eval.watch.dir, " as run ", watcher.options().run, "; results in ",
                   db_path));
  if (!eval.baseline_drafter.empty()) {
    const std::string& base = eval.baseline_drafter;
    auto fp = DirectoryFingerprint(base);
    CheckpointRef ref{"baseline", 0, base, fp.ok() ? *fp : "", "baseline"};
    absl::Status complete = CheckCheckpointComplete(base);
    SW_RETURN_IF_ERROR(
        (complete.ok() ? evaluator.Evaluate(ref) : evaluator.RecordFailure(ref, complete))
            .status());
  }
  const auto period = std::chrono::duration<double>(eval.poll_seconds);
  const int64_t scans = absl::GetFlag(FLAGS_watch_scans);
  for (int64_t scan = 1; !g_watch_stop; ++scan) {
    auto n = watcher.Poll(g_watch_stop);
    if (!n.ok()) Log(absl::StrCat("watch: ", n.status().ToString()));
    if (scans > 0 && scan >= scans) break;
    for (auto t = std::chrono::steady_clock::now() + period;
         !g_watch_stop && std::chrono::steady_clock::now() < t;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  SW_ASSIGN_OR_RETURN(std::vector<CheckpointResult> rows, db->All());
  // Every τ beside what it was measured with.
  std::printf("eval settings: max_new_tokens %lld, drafter dtype %s, greedy; tau with its 95%% "
              "bootstrap interval over the eval set's prompts\n",
              static_cast<long long>(eval.evaluator.max_new_tokens),
              DrafterOptionsFromFlags().dtype.c_str());
  std::printf("%-16s %10s %-12s %-7s %6s %8s %8s %-20s %8s\n", "run", "step", "eval set",
              "status", "block", "prompts", "tau", "95% interval", "pooled");
  for (const CheckpointResult& r : rows) {
    const auto& ci = r.summary.tau_mean_of_means_ci;
    char interval[64] = "";
    if (ci) std::snprintf(interval, sizeof(interval), "[%.3f, %.3f]", ci->lo, ci->hi);
    std::printf("%-16s %10lld %-12s %-7s %6d %8lld %8.3f %-20s %8.3f\n", r.run.c_str(),
                static_cast<long long>(r.step), r.dataset.c_str(), r.status.c_str(),
                r.summary.block_size, static_cast<long long>(r.summary.responses),
                r.summary.tau_mean_of_means, interval, r.summary.tau_pooled);
  }
  return absl::OkStatus();
}

// One job (the flags' spec, for `drafter` when given) through the scorer or in-process.
absl::StatusOr<ScoreReport> ScoreOne(const ScorerConnection& scorer,
                                     const ExtractorConnection& extractors,
                                     const std::string& drafter) {
  const bool via_scorer = !scorer.address.empty();
  if (via_scorer == !extractors.address.empty()) {
    return absl::InvalidArgumentError("give exactly one of --scorer and --extractor (see --help)");
  }
  SW_ASSIGN_OR_RETURN(ScoreSpec spec, SpecFromFlags(drafter));
  if (via_scorer && spec.job_id.empty()) spec.job_id = RandomJobId();
  ScoreReport report = NewReport(spec);
  ProgressDisplay progress(absl::GetFlag(FLAGS_quiet));
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status status = via_scorer ? RunOnScorer(spec, scorer, report, progress)
                                   : RunInProcess(spec, extractors, report, progress);
  progress.End();
  SW_RETURN_IF_ERROR(status);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::sort(
      report.prompts.begin(), report.prompts.end(),
      [](const PromptScore& a, const PromptScore& b) { return a.prompt_index < b.prompt_index; });
  return report;
}

// One side of --compare: a report file, or a drafter directory scored now.
absl::StatusOr<ScoreReport> CompareSide(const std::string& path, const ScorerConnection& scorer,
                                        const ExtractorConnection& extractors) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    Log(absl::StrCat("--compare: scoring ", path));
    return ScoreOne(scorer, extractors, path);
  }
  SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ReportFromJson(text, path);
}

absl::Status RunCompare(const std::vector<std::string>& args, const ScorerConnection& scorer,
                        const ExtractorConnection& extractors) {
  // "--compare A B", or "--compare=A,B".
  std::vector<std::string> sides = {absl::GetFlag(FLAGS_compare)};
  if (args.empty() && sides[0].find(',') != std::string::npos) {
    sides = absl::StrSplit(sides[0], absl::MaxSplits(',', 1));
  } else {
    sides.insert(sides.end(), args.begin(), args.end());
  }
  if (sides.size() != 2 || sides[0].empty() || sides[1].empty()) {
    return absl::InvalidArgumentError(
        "--compare A B: give two reports or drafter directories (A as the flag's value, B "
        "after it, or --compare=A,B)");
  }
  SW_ASSIGN_OR_RETURN(ScoreReport a, CompareSide(sides[0], scorer, extractors));
  SW_ASSIGN_OR_RETURN(ScoreReport b, CompareSide(sides[1], scorer, extractors));
  BootstrapOptions bootstrap;
  bootstrap.resamples = absl::GetFlag(FLAGS_bootstrap_resamples);
  bootstrap.seed = absl::GetFlag(FLAGS_bootstrap_seed);
  if (bootstrap.resamples < 0 || bootstrap.resamples > 100000) {
    return absl::InvalidArgumentError("--bootstrap_resamples: outside [0, 100000]");
  }
  SW_ASSIGN_OR_RETURN(ComparisonReport c, CompareReports(std::move(a), std::move(b), bootstrap,
                                                         absl::GetFlag(FLAGS_token_window)));
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_json_out), ComparisonToJson(c)));
  }
  if (!absl::GetFlag(FLAGS_html_out).empty()) {
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_html_out), ComparisonToHtml(c)));
  }
  std::cout << ComparisonTable(c) << std::flush;
  return absl::OkStatus();
}

// --reconcile: this command becomes specwire_client.reconcile's (reconcile_command.h).
template <typename T>
std::optional<T> IfGiven(const absl::Flag<T>& flag) {
  if (!FlagGivenOnCommandLine(absl::GetFlagReflectionHandle(flag).Name())) return std::nullopt;
  return absl::GetFlag(flag);
}

absl::Status RunReconcile(const std::vector<std::string>& args, const ScorerConnection& scorer,
                          const ExtractorConnection& extractors) {
  if (!scorer.address.empty()) {
    return absl::InvalidArgumentError(
        "--reconcile runs here (the target replayed in process): drop --scorer");
  }
  ReconcileRequest r;
  r.served_dir = absl::GetFlag(FLAGS_reconcile);
  r.drafter = absl::GetFlag(FLAGS_drafter);
  SW_ASSIGN_OR_RETURN(ScoreRunnerOptions runner, RunnerOptionsFromFlags());
  r.target = runner.head.target_checkpoint;
  r.extractor = extractors.address;
  r.prompts_file = !PromptsFilePath().empty() ? PromptsFilePath() : TokensFilePath();
  r.max_tokens = IfGiven(FLAGS_max_new_tokens);
  r.bootstrap_resamples = IfGiven(FLAGS_bootstrap_resamples);
  r.bootstrap_seed = IfGiven(FLAGS_bootstrap_seed);
  r.json_out = absl::GetFlag(FLAGS_json_out);
  r.html_out = absl::GetFlag(FLAGS_html_out);
  r.passthrough = args;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    r.score_binary = self.string();
    const std::filesystem::path replay = self.parent_path() / "specwire-replay";
    if (std::filesystem::exists(replay, ec)) r.replay_binary = replay.string();
  }
  SW_ASSIGN_OR_RETURN(std::vector<std::string> arguments, ReconcileArguments(r));
  SW_ASSIGN_OR_RETURN(std::string python,
                      FindReconcilePython(ReconcilePythonCandidates(
                          r.score_binary, std::getenv("SPECWIRE_PYTHON"), std::getenv("PATH"))));
  return ExecReconcile(python, arguments);
}

absl::Status Run(const std::vector<std::string>& args) {
  SW_ASSIGN_OR_RETURN(ContinuousEvalOptions eval, ContinuousEvalOptionsFromFlags());
  SW_ASSIGN_OR_RETURN(ScorerConnection scorer, ScorerConnectionFromFlags());
  SW_ASSIGN_OR_RETURN(ExtractorConnection extractors, ExtractorConnectionFromFlags({}));
  if (!absl::GetFlag(FLAGS_reconcile).empty()) return RunReconcile(args, scorer, extractors);
  if (!absl::GetFlag(FLAGS_compare).empty()) return RunCompare(args, scorer, extractors);
  if (!args.empty()) return absl::InvalidArgumentError("unexpected argument " + args[0]);
  if (!eval.watch.dir.empty()) return RunWatch(std::move(eval), extractors);
  SW_ASSIGN_OR_RETURN(ScoreReport report, ScoreOne(scorer, extractors, ""));
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_json_out), ReportToJson(report)));
  }
  if (!absl::GetFlag(FLAGS_html_out).empty()) {
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_html_out), ReportToHtml(report)));
  }
  if (!absl::GetFlag(FLAGS_vllm_synthetic_out).empty()) {
    const CapacityPlan plan = ReportCapacity(report);
    if (plan.recommended_k == 0) {
      return absl::FailedPreconditionError(
          "--vllm_synthetic_out: no drafting steps were scored, so there are no rates");
    }
    SW_RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_vllm_synthetic_out),
                                 VllmSyntheticConfigJson(plan, plan.recommended_k) + "\n"));
  }
  std::cout << SummaryTable(report) << std::flush;
  return absl::OkStatus();
}

}  // namespace
}  // namespace specwire

int main(int argc, char** argv) {
  const std::vector<std::string> args = specwire::ParseCommandLineFlags(
      argc, argv,
      "specwire-score (--scorer ADDR | --extractor ADDR) --drafter DIR (--dataset F | "
      "--prompts_file F | --tokens IDS | --tokens_file F | --text T) [flags]\n"
      "specwire-score --extractor ADDR --watch_dir DIR --eval_sets SETS [flags]\n"
      "specwire-score --compare A B [--extractor ADDR | --scorer ADDR] [flags]\n"
      "specwire-score --reconcile SERVED --drafter DIR --target_checkpoint DIR [flags] "
      "[-- reconcile options]\n"
      "Scores a drafter (any family specwire reads: τ, per-position acceptance, tree τ per node "
      "budget) and writes JSON / HTML reports; with --watch_dir, every checkpoint appearing in "
      "DIR; with --reconcile, a serving engine's acceptance against specwire's.");
  absl::Status s = specwire::Run(args);
  if (!s.ok()) {
    std::cerr << "specwire-score: " << s.ToString() << std::endl;
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
