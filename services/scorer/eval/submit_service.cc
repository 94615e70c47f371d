#include "services/scorer/eval/submit_service.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/rpc/grpc_status.h"
#include "common/status.h"
#include "services/scorer/server.h"

namespace specwire {

namespace fs = std::filesystem;

absl::Status ValidateRunName(const std::string& run, const std::string& field) {
  if (run.empty() || run.size() > 128 || run[0] == '.' ||
      !std::all_of(run.begin(), run.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
               c == '-';
      })) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": \"", run,
                     "\" must be 1-128 characters of [A-Za-z0-9._-], not starting with '.'"));
  }
  return absl::OkStatus();
}

void CheckpointResultToProto(const CheckpointResult& r, v1::CheckpointScore* out) {
  out->set_dataset(r.dataset);
  out->set_status(r.status);
  out->set_error(r.error);
  if (r.status == "ok") SummaryToProto(r.summary, out->mutable_summary());
  out->set_from_database(r.from_database);
}

namespace {

absl::Status ValidateFileName(const std::string& name) {
  const bool chars_ok = !name.empty() && name.size() <= 255 && name[0] != '.' &&
                        std::all_of(name.begin(), name.end(), [](char c) {
                          return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                                 c == '_' || c == '-';
                        });
  if (!chars_ok || !(absl::EndsWith(name, ".json") || absl::EndsWith(name, ".safetensors"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.files.name: \"", name,
        "\" must be a plain file name ([A-Za-z0-9._-]) ending in .json or .safetensors"));
  }
  return absl::OkStatus();
}

class SubmitReactor final : public grpc::ServerReadReactor<v1::DrafterUpload> {
 public:
  SubmitReactor(EvaluationLoop* loop, ContinuousEvaluator* evaluator, ScorerMetrics* metrics,
                const SubmitOptions& options, v1::SubmitDrafterReply* reply)
      : loop_(loop), evaluator_(evaluator), metrics_(metrics), options_(options), reply_(reply) {
    StartRead(&message_);
  }

  ~SubmitReactor() override {
    // A partial directory is left only by a failed or refused upload.
    if (!partial_.empty()) {
      std::error_code ec;
      fs::remove_all(partial_, ec);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side: every file must be whole.
      EndOfUpload();
      return;
    }
    absl::Status s = message_.part_case() == v1::DrafterUpload::kHeader
                         ? OnHeader(message_.header())
                         : OnChunk(message_);
    if (!s.ok()) {
      Fail(s);
      return;
    }
    StartRead(&message_);
  }

  void OnDone() override {
    if (metrics_ != nullptr) {
      metrics_->RequestDone(
          "SubmitDrafter", code_,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    delete this;
  }

 private:
  struct File {
    uint64_t size = 0;
    std::string digest;
    uint64_t received = 0;
    std::unique_ptr<std::ofstream> out;
    std::unique_ptr<ContentDigest> hash;
  };

  void Fail(const absl::Status& s) {
    code_ = GrpcCodeName(ToGrpcStatus(s).error_code());
    Finish(ToGrpcStatus(s));
  }

  absl::Status OnHeader(const v1::DrafterUploadHeader& h) {
    if (have_header_) return absl::InvalidArgumentError("header: sent twice");
    have_header_ = true;
    SW_RETURN_IF_ERROR(ValidateRunName(h.run(), "header.run"));
    if (h.step() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("header.step: ", h.step(), " is negative"));
    }
    if (evaluator_->options().eval_sets.empty()) {
      return absl::FailedPreconditionError(
          "this scorer has no eval sets to score a checkpoint on (start it with --eval_sets)");
    }
    if (h.files_size() == 0 || h.files_size() > options_.max_files) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.files: ", h.files_size(), " files (1..", options_.max_files, ")"));
    }
    uint64_t total = 0;
    bool config = false, safetensors = false;
    for (const auto& f : h.files()) {
      SW_RETURN_IF_ERROR(ValidateFileName(f.name()));
      if (files_.count(f.name())) {
        return absl::InvalidArgumentError(absl::StrCat("header.files: \"", f.name(), "\" twice"));
      }
      if (!absl::StartsWith(f.digest(), "xxh3-128:") || f.digest().size() != 9 + 32) {
        return absl::InvalidArgumentError(absl::StrCat("header.files[", f.name(), "].digest: \"",
                                                       f.digest(), "\" is not xxh3-128:<32 hex>"));
      }
      config |= f.name() == "config.json";
      safetensors |= absl::EndsWith(f.name(), ".safetensors");
      total += f.size();
      File& file = files_[f.name()];
      file.size = f.size();
      file.digest = absl::AsciiStrToLower(f.digest());
    }
    if (!config || !safetensors) {
      return absl::InvalidArgumentError(
          "header.files: a checkpoint needs config.json and at least one *.safetensors");
    }
    if (total > static_cast<uint64_t>(options_.max_upload_bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "header.files: the upload is ", total, " bytes, over this scorer's limit of ",
          options_.max_upload_bytes, " (--max_upload_bytes)"));
    }
    run_ = h.run();
    step_ = h.step();
    std::random_device rd;
    partial_ = fs::path(options_.upload_dir) /
               absl::StrCat(".partial-", run_, "-", step_, "-", getpid(), "-", rd());
    std::error_code ec;
    fs::create_directories(partial_, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("upload directory ", partial_.string(), ": ", ec.message()));
    }
    for (auto& [name, file] : files_) {
      file.out = std::make_unique<std::ofstream>(partial_ / name, std::ios::binary);
      file.hash = std::make_unique<ContentDigest>();
      if (!*file.out) {
        return absl::InternalError(absl::StrCat("cannot write ", (partial_ / name).string()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status OnChunk(const v1::DrafterUpload& m) {
    if (!have_header_) return absl::InvalidArgumentError("chunk: before the header");
    const v1::FileChunk& c = m.chunk();
    auto it = files_.find(c.name());
    if (it == files_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.name: \"", c.name(), "\" is not in the header"));
    }
    File& f = it->second;
    if (c.offset() != f.received) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk of ", c.name(), ": offset ", c.offset(), ", expected ", f.received));
    }
    if (f.received + c.data().size() > f.size) {
      return absl::InvalidArgumentError(absl::StrCat("chunk of ", c.name(), ": runs past the ",
                                                     f.size, " bytes the header declares"));
    }
    f.out->write(c.data().data(), static_cast<std::streamsize>(c.data().size()));
    if (!*f.out) {
      return absl::InternalError(absl::StrCat("writing ", (partial_ / c.name()).string()));
    }
    f.hash->Update(std::string_view(c.data()));
    f.received += c.data().size();
    return absl::OkStatus();
  }

  void EndOfUpload() {
    if (!have_header_) {
      Fail(absl::InvalidArgumentError("the upload ended before its header"));
      return;
    }
    for (auto& [name, f] : files_) {
      if (f.received != f.size) {
        Fail(absl::InvalidArgumentError(
            absl::StrCat("file ", name, ": received ", f.received, " of ", f.size, " bytes")));
        return;
      }
      f.out->close();
      if (!*f.out) {
        Fail(absl::InternalError(absl::StrCat("writing ", (partial_ / name).string())));
        return;
      }
      const std::string got = f.hash->Hex();
      if (got != f.digest) {
        Fail(absl::DataLossError(absl::StrCat("file ", name, ": digest ", got,
                                              " does not match the header's ", f.digest)));
        return;
      }
    }
    // Scoring runs on the evaluation thread; this reaction returns at once.
    const bool posted = loop_->Post([this](bool stopping) {
      if (stopping) {
        Fail(absl::UnavailableError("the scorer is shutting down"));
        return;
      }
      absl::Status s = ScoreOnLoop();
      if (!s.ok()) {
        Fail(s);
        return;
      }
      code_ = "OK";
      Finish(grpc::Status::OK);
    });
    if (!posted) Fail(absl::UnavailableError("the scorer is shutting down"));
  }

  // On the evaluation thread.
  absl::Status ScoreOnLoop() {
    SW_ASSIGN_OR_RETURN(std::string digest, CheckpointDigest(partial_.string()));
    const fs::path final_dir =
        fs::path(options_.upload_dir) / run_ / absl::StrCat("checkpoint-", step_);
    for (const EvalSet& set : evaluator_->options().eval_sets) {
      SW_ASSIGN_OR_RETURN(std::optional<CheckpointResult> row,
                          evaluator_->db()->Find(run_, step_, set.label));
      if (row && row->status == "ok" && row->checkpoint_digest != digest) {
        return absl::AlreadyExistsError(
            absl::StrCat("run ", run_, " step ", step_, " is already recorded (eval set ",
                         set.label, ") with checkpoint digest ", row->checkpoint_digest,
                         "; this upload's is ", digest, ": submit it under another step or run"));
      }
    }
    SW_ASSIGN_OR_RETURN(bool recorded,
                        evaluator_->AllRecorded({run_, step_, final_dir.string(), digest, "push"}));
    if (!recorded) {
      // The new files replace an earlier upload of the same (run, step), which failed.
      std::error_code ec;
      fs::remove_all(final_dir, ec);
      fs::create_directories(final_dir.parent_path(), ec);
      fs::rename(partial_, final_dir, ec);
      if (ec) {
        return absl::InternalError(
            absl::StrCat("moving the upload to ", final_dir.string(), ": ", ec.message()));
      }
      partial_.clear();
    }
    CheckpointRef ref{run_, step_, final_dir.string(), digest, "push"};
    absl::StatusOr<std::vector<CheckpointResult>> results;
    absl::Status complete = recorded ? absl::OkStatus() : CheckCheckpointComplete(ref.dir);
    results = complete.ok() ? evaluator_->Evaluate(ref) : evaluator_->RecordFailure(ref, complete);
    SW_RETURN_IF_ERROR(results.status());
    reply_->set_run(run_);
    reply_->set_step(step_);
    reply_->set_checkpoint_digest(digest);
    for (const CheckpointResult& r : *results) CheckpointResultToProto(r, reply_->add_scores());
    return absl::OkStatus();
  }

  EvaluationLoop* loop_;
  ContinuousEvaluator* evaluator_;
  ScorerMetrics* metrics_;
  const SubmitOptions& options_;
  v1::SubmitDrafterReply* reply_;
  v1::DrafterUpload message_;
  bool have_header_ = false;
  std::string run_;
  int64_t step_ = 0;
  fs::path partial_;
  std::map<std::string, File> files_;
  std::string code_ = "UNKNOWN";
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

CheckpointScorerService::CheckpointScorerService(EvaluationLoop* loop,
                                                 ContinuousEvaluator* evaluator,
                                                 ScorerMetrics* metrics, SubmitOptions options)
    : loop_(loop), evaluator_(evaluator), metrics_(metrics), options_(std::move(options)) {}

grpc::ServerReadReactor<v1::DrafterUpload>* CheckpointScorerService::SubmitDrafter(
    grpc::CallbackServerContext* /*ctx*/, v1::SubmitDrafterReply* reply) {
  return new SubmitReactor(loop_, evaluator_, metrics_, options_, reply);
}

}  // namespace specwire

namespace specwire {

ScoreFn MakeWorkerScoreFn(ScoreWorker* worker, ScorerMetrics* metrics) {
  return [worker, metrics](const ScoreSpec& spec) -> absl::StatusOr<EvalScore> {
    auto job = std::make_shared<ScoreJob>();
    job->spec = spec;
    // The events run on the worker thread; the result is handed over through `done`.
    struct State {
      ScoreLabels labels;
      int32_t block_size = 0;
      std::optional<AcceptanceSummary> summary;
      std::vector<PromptScore> prompts;
      CanaryFingerprint canary;
      std::string provenance;
      std::mutex mu;
      std::condition_variable cv;
      bool finished = false;
      absl::Status status;
    };
    auto state = std::make_shared<State>();
    job->events.on_start = [state, dataset = spec.dataset_path](const ScoreStart& s) {
      state->labels = s.labels;
      state->block_size = s.drafter.block_size;
      state->canary = s.contract.canary;
      state->provenance = ScoreProvenanceJson(s.contract, s.drafter.dtype,
                                              s.chat_template_record,
                                              FileDigestOrEmpty(dataset), "");
    };
    job->events.on_progress = [state, metrics](const ScoreProgress& p) {
      if (metrics != nullptr) metrics->Progress(state->labels, p);
    };
    job->events.on_prompt = [state, metrics](const PromptScore& s) {
      state->prompts.push_back(s);
      if (metrics != nullptr) {
        metrics->PromptScored(state->labels, s.acceptance, state->block_size, 0);
      }
    };
    job->events.on_summary = [state, metrics](const AcceptanceSummary& s) {
      if (metrics != nullptr) metrics->Summary(state->labels, s);
      state->summary = s;
    };
    job->on_done = [state](const absl::Status& s) {
      std::lock_guard<std::mutex> lock(state->mu);
      state->status = s;
      state->finished = true;
      state->cv.notify_all();
    };
    SW_RETURN_IF_ERROR(worker->Submit(job));
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->finished; });
    SW_RETURN_IF_ERROR(state->status);
    if (!state->summary) return absl::InternalError("the scoring job ended without a summary");
    return EvalScore{*state->summary, std::move(state->prompts), std::move(state->canary),
                     std::move(state->provenance)};
  };
}

absl::StatusOr<std::unique_ptr<ContinuousEval>> ContinuousEval::Start(ContinuousEvalConfig config,
                                                                      ScoreWorker* worker,
                                                                      ScorerMetrics* metrics) {
  std::unique_ptr<ContinuousEval> e(new ContinuousEval());
  std::error_code ec;
  for (const EvalSet& set : config.eval_sets) {
    if (!fs::is_regular_file(set.path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("--eval_sets: eval set ", set.label, ": no file ", set.path));
    }
  }
  for (const std::string& dir : {config.watch_dir, config.submit.upload_dir}) {
    if (dir.empty()) continue;
    for (const EvalSet& set : config.eval_sets) {
      ScoreSpec spec;
      spec.drafter_path = (fs::path(dir) / "checkpoint-0").string();
      spec.dataset_path = set.path;
      spec.max_prompts = config.evaluator.max_prompts;
      spec.max_new_tokens = config.evaluator.max_new_tokens;
      spec.ddtree_budgets = config.evaluator.ddtree_budgets;
      if (absl::Status s = ValidateSpec(spec, config.limits); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("continuous evaluation (eval set ",
                                                       set.label, ", checkpoints under ", dir,
                                                       "): ", s.message()));
      }
    }
  }
  SW_ASSIGN_OR_RETURN(e->db_, ResultsDb::Open(config.db_path));
  e->training_metrics_ = std::make_unique<TrainingMetrics>(metrics->registry(),
                                                           config.evaluator.regression);
  config.evaluator.eval_sets = config.eval_sets;
  auto log = config.evaluator.log;
  e->evaluator_ =
      std::make_unique<ContinuousEvaluator>(e->db_.get(), MakeWorkerScoreFn(worker, metrics),
                                            config.evaluator, e->training_metrics_.get());
  SW_RETURN_IF_ERROR(e->evaluator_->ExportRecorded());
  if (!config.watch_dir.empty()) {
    fs::create_directories(config.watch_dir, ec);
    config.watch.dir = config.watch_dir;
    e->watcher_ = std::make_unique<CheckpointWatcher>(e->evaluator_.get(), config.watch,
                                                      e->training_metrics_.get());
    if (log) {
      log(absl::StrCat("watching ", config.watch_dir, " as run ", e->watcher_->options().run,
                       " every ", config.poll_seconds, " s"));
    }
  }
  fs::create_directories(config.submit.upload_dir, ec);
  e->loop_ = std::make_unique<EvaluationLoop>(e->watcher_.get(), config.poll_seconds, log);
  e->service_ = std::make_unique<CheckpointScorerService>(e->loop_.get(), e->evaluator_.get(),
                                                          metrics, config.submit);
  std::function<bool(const std::atomic<bool>&)> baseline;
  if (!config.baseline_drafter.empty()) {
    ContinuousEvaluator* evaluator = e->evaluator_.get();
    baseline = [evaluator, dir = config.baseline_drafter, log](const std::atomic<bool>&) {
      CheckpointRef ref{"baseline", 0, dir, "", "baseline"};
      auto fp = DirectoryFingerprint(dir);
      ref.fingerprint = fp.ok() ? *fp : "";
      absl::Status complete = CheckCheckpointComplete(dir);
      auto r = complete.ok() ? evaluator->Evaluate(ref) : evaluator->RecordFailure(ref, complete);
      if (!r.ok() && log) log(absl::StrCat("baseline drafter: ", r.status().ToString()));
      return r.ok();  // retried before the next scan otherwise
    };
  }
  e->loop_->Start(std::move(baseline));
  return e;
}

ContinuousEval::~ContinuousEval() {
  if (loop_) loop_->Stop();
}

}  // namespace specwire
