#include "services/scorer/report/reconcile_command.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace specwire {
namespace {

constexpr const char* kModule = "specwire_client.reconcile";

// The reconciliation's options that specwire-score's own flags give (reconcile option -> flag).
struct Mapped {
  const char* option;
  const char* flag;
};
constexpr Mapped kMapped[] = {
    {"--served", "--reconcile"},         {"--drafter", "--drafter"},
    {"--target", "--target_checkpoint"}, {"--extractor", "--extractor"},
    {"--prompts", "--prompts_file"},     {"--max_tokens", "--max_new_tokens"},
    {"--bootstrap_resamples", "--bootstrap_resamples"},
    {"--seed", "--bootstrap_seed"},      {"--json", "--json_out"},
    {"--html", "--html_out"},
};
// The binaries of the canonical side: specwire-score names itself and its specwire-replay.
constexpr const char* kOwn[] = {"--replay", "--score"};

// "--name=value" and "--name" both name "--name".
std::string OptionName(const std::string& arg) {
  return arg.substr(0, arg.find('='));
}

// Runs `argv` with its output discarded; true when it exits 0.
bool Succeeds(const std::vector<std::string>& argv) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return false;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return false;
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReconcileArguments(const ReconcileRequest& r) {
  if (r.drafter.empty()) {
    return absl::InvalidArgumentError(
        "--reconcile needs --drafter (the drafter the engine served)");
  }
  if (r.target.empty()) {
    return absl::InvalidArgumentError(
        "--reconcile needs --target_checkpoint (the target checkpoint directory the engine "
        "served: the canonical side replays it in process)");
  }
  bool drives = false;
  for (const std::string& arg : r.passthrough) {
    const std::string name = OptionName(arg);
    if (name == "--drive") drives = true;
    for (const char* own : kOwn) {
      if (name == own) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--reconcile: ", name, " after \"--\": specwire-score runs itself and the "
            "specwire-replay beside it"));
      }
    }
    for (const Mapped& m : kMapped) {
      if (name == m.option) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--reconcile: ", name, " after \"--\" is given by specwire-score's ", m.flag,
            " (give that flag before \"--\")"));
      }
    }
  }
  std::error_code ec;
  if (r.served_dir.empty() || (!drives && !std::filesystem::is_directory(r.served_dir, ec))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reconcile \"", r.served_dir,
        "\": not a directory (give the served record: metrics_before.prom, metrics_after.prom, "
        "responses.jsonl, settings.json, prompts.json, as specwire_client.served.drive_openai "
        "writes it; or \"-- --drive URL --served_model M\" to record it there first)"));
  }
  std::vector<std::string> out = {"--served", r.served_dir, "--drafter", r.drafter,
                                  "--target", r.target};
  auto add = [&out](const char* option, const std::string& value) {
    if (value.empty()) return;
    out.push_back(option);
    out.push_back(value);
  };
  add("--extractor", r.extractor);
  add("--prompts", r.prompts_file);
  if (r.max_tokens) add("--max_tokens", std::to_string(*r.max_tokens));
  if (r.bootstrap_resamples) add("--bootstrap_resamples", std::to_string(*r.bootstrap_resamples));
  if (r.bootstrap_seed) add("--seed", std::to_string(*r.bootstrap_seed));
  add("--json", r.json_out);
  add("--html", r.html_out);
  add("--score", r.score_binary);
  add("--replay", r.replay_binary);
  out.insert(out.end(), r.passthrough.begin(), r.passthrough.end());
  return out;
}

std::vector<std::string> ReconcilePythonCandidates(const std::string& binary_path,
                                                   const char* specwire_python,
                                                   const char* path_env) {
  if (specwire_python != nullptr && *specwire_python != '\0') return {specwire_python};
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto add = [&](const std::filesystem::path& p) {
    if (seen.insert(p.string()).second) out.push_back(p.string());
  };
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::path(binary_path).parent_path();
  for (int up = 0; up < 6 && !dir.empty(); ++up) {
    const std::filesystem::path venv = dir / ".venv" / "bin" / "python";
    if (std::filesystem::exists(venv, ec)) add(venv);
    if (dir == dir.parent_path()) break;
    dir = dir.parent_path();
  }
  for (const char* name : {"python3", "python"}) {
    for (absl::string_view part : absl::StrSplit(path_env ? path_env : "", ':')) {
      if (part.empty()) continue;
      const std::filesystem::path p = std::filesystem::path(std::string(part)) / name;
      if (access(p.c_str(), X_OK) == 0) add(p);
    }
  }
  return out;
}

absl::StatusOr<std::string> FindReconcilePython(const std::vector<std::string>& candidates) {
  for (const std::string& python : candidates) {
    if (Succeeds({python, "-c", absl::StrCat("import ", kModule)})) return python;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--reconcile runs ", kModule, " (specwire's Python client) and no Python here has it (tried: ",
      candidates.empty() ? "none found" : absl::StrJoin(candidates, ", "),
      "): pip install clients/python, or set SPECWIRE_PYTHON to a Python that has it"));
}

absl::Status ExecReconcile(const std::string& python, const std::vector<std::string>& arguments) {
  std::vector<std::string> argv = {python, "-m", kModule};
  argv.insert(argv.end(), arguments.begin(), arguments.end());
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  execv(cargv[0], cargv.data());
  return absl::FailedPreconditionError(
      absl::StrCat("--reconcile: could not start ", python, ": ", std::strerror(errno)));
}

}  // namespace specwire
