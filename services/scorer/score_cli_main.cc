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
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <thread>

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
#include "common/security.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "proto/specwire/v1/scorer.grpc.pb.h"
#include "services/scorer/report.h"
#include "services/scorer/score_job.h"
#include "services/scorer/scorer_backend.h"
#include "services/scorer/server.h"
#include "services/scorer/watch.h"

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
ABSL_FLAG(std::string, job_id, "",
          "Names the job for resumption ([A-Za-z0-9._-], at most 128). --scorer: default a random "
          "id; a scorer with --results_dir resumes a job submitted again under it.");
ABSL_FLAG(int, scorer_attempts, 5,
          "--scorer: submissions of the job at most when the scorer goes away (UNAVAILABLE); "
          "each is sent with the same job_id.");
ABSL_FLAG(std::string, resume_file, "",
          "In-process: keep each completed prompt in this JSONL file (fsync'ed); run again with "
          "the same file and flags, only the prompts not in it are scored.");
ABSL_FLAG(int, extractor_attempts, 6,
          "In-process: attempts per prompt when an extractor call fails with UNAVAILABLE.");
ABSL_FLAG(bool, tls, false,
          "Connect to the scorer (or, in-process, the extractors) with TLS; implied by --tls_ca "
          "and --tls_client_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA that signed the server's certificate (default: system roots).");
ABSL_FLAG(std::string, tls_client_cert, "",
          "PEM client certificate for mTLS (with --tls_client_key).");
ABSL_FLAG(std::string, tls_client_key, "", "PEM private key of --tls_client_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the server's certificate against (default: the host of the address).");
ABSL_FLAG(std::string, auth_token_file, "",
          "Bearer token sent with every call; else $SPECWIRE_AUTH_TOKEN, else the file named by "
          "$SPECWIRE_AUTH_TOKEN_FILE.");
// Watch mode (in-process, with --extractor): services/scorer/watch.h.
ABSL_FLAG(std::string, watch, "",
          "Watch this directory and score every drafter checkpoint appearing in it (a "
          "subdirectory with config.json + *.safetensors; step from checkpoint-N / step_N / N or "
          "trainer_state.json) once on each of --eval_sets, recording the results in --eval_db. "
          "Needs --extractor; --max_new_tokens, --max_prompts and --ddtree apply.");
ABSL_FLAG(std::string, eval_sets, "",
          "Watch mode: label=path.jsonl or path.jsonl, comma-separated (default: --dataset).");
ABSL_FLAG(std::string, eval_db, "",
          "Watch mode: the SQLite results database (default <watch dir>/specwire-eval.sqlite).");
ABSL_FLAG(std::string, watch_run, "", "Watch mode: run label (default: the directory's name).");
ABSL_FLAG(double, watch_poll_seconds, 5, "Watch mode: seconds between scans.");
ABSL_FLAG(int64_t, watch_scans, 0,
          "Watch mode: stop after this many scans (0: until interrupted).");
ABSL_FLAG(std::string, baseline_drafter, "",
          "Watch mode: a reference drafter scored once as run \"baseline\", step 0.");

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
  s.job_id = absl::GetFlag(FLAGS_job_id);
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
  r.created = NowUtc();
  r.drafter_path = spec.drafter_path;
  r.dataset_path = spec.dataset_path;
  r.max_new_tokens = spec.max_new_tokens;
  r.max_prompts = spec.max_prompts;
  r.ddtree_budgets = spec.ddtree_budgets;
  r.labels = ResolveLabels(spec);
  return r;
}

// The client side of --tls* / --auth_token_file, for whichever server this program talks to.
absl::StatusOr<ClientSecurity> SecurityFromFlags() {
  ClientSecurityFiles f;
  f.tls = absl::GetFlag(FLAGS_tls);
  f.ca_file = absl::GetFlag(FLAGS_tls_ca);
  f.cert_file = absl::GetFlag(FLAGS_tls_client_cert);
  f.key_file = absl::GetFlag(FLAGS_tls_client_key);
  f.server_name = absl::GetFlag(FLAGS_tls_server_name);
  f.token_file = absl::GetFlag(FLAGS_auth_token_file);
  return LoadClientSecurity(f);
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

  SW_ASSIGN_OR_RETURN(ClientSecurity security, SecurityFromFlags());
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  // Reconnect soon after a restarted scorer listens again (gRPC's default backoff grows to 2 min).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = MakeChannel(report.endpoint, security, args);
  auto stub = v1::Scorer::NewStub(channel);
  v1::ScoreRequest request;
  SpecToProto(spec, &request);
  // The whole job's deadline, across resubmissions.
  const auto deadline = absl::GetFlag(FLAGS_timeout) > 0
                            ? std::chrono::system_clock::now() +
                                  std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                      std::chrono::duration<double>(absl::GetFlag(FLAGS_timeout)))
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

// In-process: this program is the scorer.
absl::Status RunInProcess(const ScoreSpec& spec, ScoreReport& report, ProgressDisplay& progress) {
  report.mode = "in-process";
  report.endpoint = absl::GetFlag(FLAGS_extractor);
  TorchScorerOptions to;
  to.dtype = absl::GetFlag(FLAGS_dtype);
  to.device = absl::GetFlag(FLAGS_device);
  to.threads = absl::GetFlag(FLAGS_threads);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ScorerBackend> backend, MakeTorchScorerBackend(to));
  ExtractorClientOptions client_options;
  SW_ASSIGN_OR_RETURN(client_options.security, SecurityFromFlags());
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ExtractorPool> pool,
                      ExtractorPool::Create(report.endpoint, client_options));
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
  ro.results_file = absl::GetFlag(FLAGS_resume_file);
  ro.retry.max_attempts = std::max(1, absl::GetFlag(FLAGS_extractor_attempts));
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

std::atomic<bool> g_watch_stop{false};
void OnWatchSignal(int) { g_watch_stop = true; }

// specwire-score --watch DIR --extractor ADDR: the drafter runs here; each new checkpoint is
// scored once per eval set and recorded (the scorer service's --watch_dir, without a service).
absl::Status RunWatch() {
  if (absl::GetFlag(FLAGS_extractor).empty()) {
    return absl::InvalidArgumentError(
        "--watch runs in-process: give --extractor (a scorer service watches with its own "
        "--watch_dir, or takes uploads from specwire_client.ScorerClient)");
  }
  const std::string dir = absl::GetFlag(FLAGS_watch);
  std::string sets_flag = absl::GetFlag(FLAGS_eval_sets);
  if (sets_flag.empty()) sets_flag = absl::GetFlag(FLAGS_dataset);
  SW_ASSIGN_OR_RETURN(std::vector<EvalSet> sets, ParseEvalSets(sets_flag));
  if (sets.empty()) return absl::InvalidArgumentError("--watch needs --eval_sets (or --dataset)");
  TorchScorerOptions to;
  to.dtype = absl::GetFlag(FLAGS_dtype);
  to.device = absl::GetFlag(FLAGS_device);
  to.threads = absl::GetFlag(FLAGS_threads);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ScorerBackend> backend, MakeTorchScorerBackend(to));
  ExtractorClientOptions client_options;
  SW_ASSIGN_OR_RETURN(client_options.security, SecurityFromFlags());
  client_options.timeout_seconds = absl::GetFlag(FLAGS_timeout);
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ExtractorPool> pool,
                      ExtractorPool::Create(absl::GetFlag(FLAGS_extractor), client_options));
  ScoreRunnerOptions ro;
  ro.target_checkpoint = absl::GetFlag(FLAGS_target_checkpoint);
  ro.cache_dir = absl::GetFlag(FLAGS_cache_dir);
  if (ro.cache_dir.empty()) ro.cache_dir = DefaultCacheDir();
  if (ro.cache_dir == "none") ro.cache_dir.clear();
  const std::string wire = absl::GetFlag(FLAGS_wire_dtype);
  if (wire == "fp32" || wire == "float32" || (wire == "auto" && to.dtype == "float32")) {
    ro.wire_dtype = DType::kF32;
  } else if (wire == "bf16" || wire == "bfloat16" || wire == "auto") {
    ro.wire_dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--wire_dtype \"", wire, "\" is not one of fp32, bf16, auto"));
  }
  ro.prefetch_per_extractor = absl::GetFlag(FLAGS_prefetch);
  ro.retry.max_attempts = std::max(1, absl::GetFlag(FLAGS_extractor_attempts));
  auto log = [](const std::string& line) {
    if (!absl::GetFlag(FLAGS_quiet)) std::cerr << "specwire-score: " << line << std::endl;
  };
  ro.log = log;
  ScoreRunner runner(backend.get(), pool.get(), ro);
  ScoreFn score = [&runner](const ScoreSpec& spec) -> absl::StatusOr<AcceptanceSummary> {
    std::optional<AcceptanceSummary> summary;
    ScoreEvents events;
    events.on_summary = [&](const AcceptanceSummary& s) { summary = s; };
    SW_RETURN_IF_ERROR(runner.Run(spec, events, g_watch_stop));
    if (!summary) return absl::InternalError("the scoring job ended without a summary");
    return *summary;
  };
  std::string db_path = absl::GetFlag(FLAGS_eval_db);
  if (db_path.empty()) db_path = (std::filesystem::path(dir) / "specwire-eval.sqlite").string();
  SW_ASSIGN_OR_RETURN(std::unique_ptr<ResultsDb> db, ResultsDb::Open(db_path));
  EvaluatorOptions eo;
  eo.eval_sets = sets;
  eo.max_prompts = absl::GetFlag(FLAGS_max_prompts);
  eo.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  eo.ddtree_budgets.clear();
  for (absl::string_view b :
       absl::StrSplit(absl::GetFlag(FLAGS_ddtree), ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(b, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ddtree: \"", std::string(b), "\" is not an integer"));
    }
    eo.ddtree_budgets.push_back(v);
  }
  eo.log = log;
  ContinuousEvaluator evaluator(db.get(), score, eo, nullptr);
  WatchOptions wo;
  wo.dir = dir;
  wo.run = absl::GetFlag(FLAGS_watch_run);
  CheckpointWatcher watcher(&evaluator, wo, nullptr);
  signal(SIGINT, OnWatchSignal);
  signal(SIGTERM, OnWatchSignal);
  log(absl::StrCat("watching ", dir, " as run ", watcher.options().run, "; results in ", db_path));
  if (const std::string base = absl::GetFlag(FLAGS_baseline_drafter); !base.empty()) {
    auto fp = DirectoryFingerprint(base);
    CheckpointRef ref{"baseline", 0, base, fp.ok() ? *fp : "", "baseline"};
    absl::Status complete = CheckCheckpointComplete(base);
    SW_RETURN_IF_ERROR(
        (complete.ok() ? evaluator.Evaluate(ref) : evaluator.RecordFailure(ref, complete))
            .status());
  }
  const auto period = std::chrono::duration<double>(absl::GetFlag(FLAGS_watch_poll_seconds));
  for (int64_t scan = 1; !g_watch_stop; ++scan) {
    auto n = watcher.Poll(g_watch_stop);
    if (!n.ok()) log(absl::StrCat("watch: ", n.status().ToString()));
    if (absl::GetFlag(FLAGS_watch_scans) > 0 && scan >= absl::GetFlag(FLAGS_watch_scans)) break;
    for (auto t = std::chrono::steady_clock::now() + period;
         !g_watch_stop && std::chrono::steady_clock::now() < t;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  SW_ASSIGN_OR_RETURN(std::vector<CheckpointResult> rows, db->All());
  std::printf("%-16s %10s %-12s %-7s %8s %8s\n", "run", "step", "eval set", "status", "tau",
              "pooled");
  for (const CheckpointResult& r : rows) {
    std::printf("%-16s %10lld %-12s %-7s %8.3f %8.3f\n", r.run.c_str(),
                static_cast<long long>(r.step), r.dataset.c_str(), r.status.c_str(),
                r.summary.tau_mean_of_means, r.summary.tau_pooled);
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const bool via_scorer = !absl::GetFlag(FLAGS_scorer).empty();
  if (!absl::GetFlag(FLAGS_watch).empty()) return RunWatch();
  if (via_scorer == !absl::GetFlag(FLAGS_extractor).empty()) {
    return absl::InvalidArgumentError("give exactly one of --scorer and --extractor (see --help)");
  }
  SW_ASSIGN_OR_RETURN(ScoreSpec spec, SpecFromFlags());
  if (via_scorer && spec.job_id.empty()) spec.job_id = RandomJobId();
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
