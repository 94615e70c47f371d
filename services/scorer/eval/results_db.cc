#include "services/scorer/eval/results_db.h"

#include <sqlite3.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specwire {

using json = nlohmann::json;

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS checkpoint_results (
  run TEXT NOT NULL,
  step INTEGER NOT NULL,
  dataset TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
  error TEXT NOT NULL DEFAULT '',
  source TEXT NOT NULL DEFAULT '',
  checkpoint_path TEXT NOT NULL DEFAULT '',
  checkpoint_digest TEXT NOT NULL DEFAULT '',
  fingerprint TEXT NOT NULL DEFAULT '',
  tau REAL,
  tau_pooled REAL,
  ddtree_tau TEXT NOT NULL DEFAULT '{}',
  per_position_acceptance TEXT NOT NULL DEFAULT '[]',
  summary TEXT NOT NULL DEFAULT '{}',
  started_at TEXT NOT NULL DEFAULT '',
  finished_at TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (run, step, dataset)
);
)sql";

constexpr const char* kColumns =
    "run, step, dataset, status, error, source, checkpoint_path, checkpoint_digest, fingerprint, "
    "summary, started_at, finished_at";

std::string Column(sqlite3_stmt* s, int i) {
  const unsigned char* t = sqlite3_column_text(s, i);
  return t == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(t));
}

// Finalizes a statement on every path.
struct Statement {
  sqlite3_stmt* s = nullptr;
  ~Statement() { sqlite3_finalize(s); }
};

}  // namespace

std::string SummaryToJsonText(const AcceptanceSummary& s) {
  json ddtree = json::object();
  for (const auto& [budget, tau] : s.ddtree_tau) {
    ddtree[std::to_string(budget)] = {{"tau", tau.first}, {"tau_pooled", tau.second}};
  }
  json j = {{"block_size", s.block_size},
            {"responses", s.responses},
            {"steps", s.steps},
            {"tau", s.tau_mean_of_means},
            {"tau_pooled", s.tau_pooled},
            {"histogram", s.histogram},
            {"per_position_acceptance", s.per_position_acceptance},
            {"num_drafts", s.num_drafts},
            {"num_draft_tokens", s.num_draft_tokens},
            {"num_accepted_tokens", s.num_accepted_tokens},
            {"num_accepted_tokens_per_pos", s.num_accepted_tokens_per_pos},
            {"acceptance_rate", s.acceptance_rate},
            {"per_position_reached", s.per_position_reached},
            {"ddtree", ddtree}};
  if (s.tau_mean_of_means_ci) j["tau_ci"] = {s.tau_mean_of_means_ci->lo, s.tau_mean_of_means_ci->hi};
  if (s.tau_pooled_ci) j["tau_pooled_ci"] = {s.tau_pooled_ci->lo, s.tau_pooled_ci->hi};
  return j.dump();
}

absl::StatusOr<AcceptanceSummary> SummaryFromJsonText(const std::string& text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError("results database: a summary column is not a JSON object");
  }
  AcceptanceSummary s;
  try {
    s.block_size = j.value("block_size", 0);
    s.responses = j.value("responses", int64_t{0});
    s.steps = j.value("steps", int64_t{0});
    s.tau_mean_of_means = j.value("tau", 0.0);
    s.tau_pooled = j.value("tau_pooled", 0.0);
    s.histogram = j.value("histogram", std::vector<int64_t>{});
    s.per_position_acceptance = j.value("per_position_acceptance", std::vector<double>{});
    s.num_drafts = j.value("num_drafts", int64_t{0});
    s.num_draft_tokens = j.value("num_draft_tokens", int64_t{0});
    s.num_accepted_tokens = j.value("num_accepted_tokens", int64_t{0});
    s.num_accepted_tokens_per_pos = j.value("num_accepted_tokens_per_pos", std::vector<int64_t>{});
    s.acceptance_rate = j.value("acceptance_rate", 0.0);
    s.per_position_reached = j.value("per_position_reached", std::vector<int64_t>{});
    for (const char* key : {"tau_ci", "tau_pooled_ci"}) {
      if (!j.contains(key)) continue;
      const auto v = j[key].get<std::vector<double>>();
      if (v.size() != 2) return absl::DataLossError(absl::StrCat("results database: ", key));
      (std::string(key) == "tau_ci" ? s.tau_mean_of_means_ci : s.tau_pooled_ci) =
          Interval{v[0], v[1]};
    }
    if (j.contains("ddtree")) {
      for (const auto& [budget, v] : j["ddtree"].items()) {
        s.ddtree_tau[std::stoi(budget)] = {v.value("tau", 0.0), v.value("tau_pooled", 0.0)};
      }
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("results database: a summary column: ", e.what()));
  }
  return s;
}

// The per-prompt steps of a summary column (rows written before they were kept have none).
absl::StatusOr<std::vector<PromptSteps>> PromptStepsFromJsonText(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  std::vector<PromptSteps> out;
  if (j.is_discarded() || !j.is_object() || !j.contains("prompt_steps")) return out;
  try {
    for (const json& p : j["prompt_steps"]) {
      out.push_back({p.at("prompt_index").get<int64_t>(),
                     p.value("trajectory_digest", std::string()),
                     p.at("step_lengths").get<std::vector<int32_t>>(),
                     p.value("prompt_tokens", int64_t{0}),
                     p.value("trajectory", std::vector<int64_t>{})});
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat("results database: prompt_steps: ", e.what()));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ResultsDb>> ResultsDb::Open(const std::string& path) {
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::unique_ptr<ResultsDb> db(new ResultsDb());
  db->path_ = path;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db->db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    return absl::FailedPreconditionError(absl::StrCat(
        "results database ", path, ": ", db->db_ ? sqlite3_errmsg(db->db_) : sqlite3_errstr(rc)));
  }
  sqlite3_busy_timeout(db->db_, 10000);
  // WAL: sqlite3 readers alongside the scorer; FULL: a committed row survives a power cut too.
  if (absl::Status s = db->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"); !s.ok()) {
    return s;
  }
  if (absl::Status s = db->Exec(kSchema); !s.ok()) return s;
  return db;
}

ResultsDb::~ResultsDb() {
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

absl::Status ResultsDb::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("results database ", path_, ": ", msg));
  }
  return absl::OkStatus();
}

absl::Status ResultsDb::Record(const CheckpointResult& r) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool ok = r.status == "ok";
  json ddtree = json::object();
  for (const auto& [budget, tau] : r.summary.ddtree_tau) ddtree[std::to_string(budget)] = tau.first;
  const std::string ddtree_text = ok ? ddtree.dump() : "{}";
  const std::string positions = ok ? json(r.summary.per_position_acceptance).dump() : "[]";
  std::string summary = "{}";
  if (ok) {
    json j = json::parse(SummaryToJsonText(r.summary));
    json steps = json::array();
    for (const PromptSteps& p : r.prompts) {
      steps.push_back({{"prompt_index", p.prompt_index},
                       {"trajectory_digest", p.trajectory_digest},
                       {"step_lengths", p.step_lengths},
                       {"prompt_tokens", p.prompt_tokens},
                       {"trajectory", p.trajectory}});
    }
    j["prompt_steps"] = steps;
    if (!r.target_canary.empty()) j["target_canary"] = json::parse(CanaryToJson(r.target_canary));
    if (!r.provenance.empty()) {
      json p = json::parse(r.provenance, nullptr, false);
      if (!p.is_object()) return absl::InvalidArgumentError("provenance: not a JSON object");
      j["provenance"] = std::move(p);
    }
    summary = j.dump();
  }
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  Statement st;
  const char* sql =
      "INSERT OR REPLACE INTO checkpoint_results (run, step, dataset, status, error, source, "
      "checkpoint_path, checkpoint_digest, fingerprint, tau, tau_pooled, ddtree_tau, "
      "per_position_acceptance, summary, started_at, finished_at) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";
  int rc = sqlite3_prepare_v2(db_, sql, -1, &st.s, nullptr);
  if (rc == SQLITE_OK) {
    auto text = [&](int i, const std::string& v) {
      sqlite3_bind_text(st.s, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    };
    text(1, r.run);
    sqlite3_bind_int64(st.s, 2, r.step);
    text(3, r.dataset);
    text(4, r.status);
    text(5, r.error);
    text(6, r.source);
    text(7, r.checkpoint_path);
    text(8, r.checkpoint_digest);
    text(9, r.fingerprint);
    if (ok) {
      sqlite3_bind_double(st.s, 10, r.summary.tau_mean_of_means);
      sqlite3_bind_double(st.s, 11, r.summary.tau_pooled);
    } else {
      sqlite3_bind_null(st.s, 10);
      sqlite3_bind_null(st.s, 11);
    }
    text(12, ddtree_text);
    text(13, positions);
    text(14, summary);
    text(15, r.started_at);
    text(16, r.finished_at);
    rc = sqlite3_step(st.s);
  }
  if (rc != SQLITE_DONE) {
    const std::string msg = sqlite3_errmsg(db_);
    Exec("ROLLBACK").IgnoreError();
    return absl::InternalError(absl::StrCat("results database ", path_, ": recording run ", r.run,
                                            " step ", r.step, " dataset ", r.dataset, ": ", msg));
  }
  return Exec("COMMIT");
}

absl::StatusOr<std::vector<CheckpointResult>> ResultsDb::Query(
    const std::string& where, const std::vector<std::string>& text_args,
    std::optional<int64_t> step) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement st;
  const std::string sql = absl::StrCat("SELECT ", kColumns, " FROM checkpoint_results ", where,
                                       " ORDER BY run, step, dataset");
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &st.s, nullptr) != SQLITE_OK) {
    return absl::InternalError(absl::StrCat("results database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  int i = 1;
  for (const std::string& a : text_args) {
    sqlite3_bind_text(st.s, i++, a.data(), static_cast<int>(a.size()), SQLITE_TRANSIENT);
  }
  if (step) sqlite3_bind_int64(st.s, i++, *step);
  std::vector<CheckpointResult> rows;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    CheckpointResult r;
    r.run = Column(st.s, 0);
    r.step = sqlite3_column_int64(st.s, 1);
    r.dataset = Column(st.s, 2);
    r.status = Column(st.s, 3);
    r.error = Column(st.s, 4);
    r.source = Column(st.s, 5);
    r.checkpoint_path = Column(st.s, 6);
    r.checkpoint_digest = Column(st.s, 7);
    r.fingerprint = Column(st.s, 8);
    if (r.status == "ok") {
      const std::string text = Column(st.s, 9);
      auto summary = SummaryFromJsonText(text);
      if (!summary.ok()) return summary.status();
      r.summary = *std::move(summary);
      auto prompts = PromptStepsFromJsonText(text);
      if (!prompts.ok()) return prompts.status();
      r.prompts = *std::move(prompts);
      const json j = json::parse(text, nullptr, false);
      if (j.is_object() && j.contains("target_canary")) {
        auto canary = CanaryFromJson(j["target_canary"].dump());
        if (!canary.ok()) {
          return absl::DataLossError(absl::StrCat("results database: target_canary: ",
                                                  canary.status().message()));
        }
        r.target_canary = *std::move(canary);
      }
      if (j.is_object() && j.contains("provenance") && j["provenance"].is_object()) {
        r.provenance = j["provenance"].dump();
      }
    }
    r.started_at = Column(st.s, 10);
    r.finished_at = Column(st.s, 11);
    rows.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) {
    return absl::InternalError(absl::StrCat("results database ", path_, ": ", sqlite3_errmsg(db_)));
  }
  return rows;
}

absl::StatusOr<std::optional<CheckpointResult>> ResultsDb::Find(const std::string& run,
                                                                int64_t step,
                                                                const std::string& dataset) {
  auto rows = Query("WHERE run = ?1 AND dataset = ?2 AND step = ?3", {run, dataset}, step);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::optional<CheckpointResult>();
  return std::optional<CheckpointResult>(std::move(rows->front()));
}

absl::StatusOr<std::vector<CheckpointResult>> ResultsDb::All() { return Query("", {}, {}); }

}  // namespace specwire
