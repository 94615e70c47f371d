// specwire-score --reconcile DIR: served acceptance against the canonical one.
//
// The reconciliation itself (reading vLLM's and SGLang's records, the engines' accounting, the
// intervals, the diagnosis by scoring each known cause) is specwire_client.reconcile, the
// Python API training pipelines call; this is the CLI's way into it, so that the one
// implementation answers both. specwire-score maps its own flags onto the reconciliation's
// options (--drafter, --target_checkpoint, --extractor, --prompts_file, --max_new_tokens,
// --bootstrap_resamples, --bootstrap_seed, --json_out, --html_out), passes what follows "--" as
// is (--drive URL, --metrics_after F, --diagnose always, --features F, ...), names itself and
// the specwire-replay beside it as the binaries the canonical side runs, and hands the process
// over to the first Python that has the client.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specwire {

struct ReconcileRequest {
  std::string served_dir;   // --reconcile: the served record (drive_openai's directory)
  std::string drafter;      // --drafter
  std::string target;       // --target_checkpoint: the target checkpoint the engine serves
  std::string extractor;    // --extractor: for T > 0 (the live loop) and --features
  std::string prompts_file; // --prompts_file: the prompts' token ids, in request order
  std::optional<int64_t> max_tokens;             // --max_new_tokens, where given
  std::optional<int32_t> bootstrap_resamples;    // where given
  std::optional<uint64_t> bootstrap_seed;        // where given
  std::string json_out, html_out;
  std::string score_binary, replay_binary;  // "" : the client finds them
  std::vector<std::string> passthrough;     // after "--"
};

// The arguments of `python -m specwire_client.reconcile` for `request` (after the module).
// INVALID_ARGUMENT naming the flag: no --drafter or --target_checkpoint, --reconcile not a
// directory (unless --drive records into it), or a passthrough option that one of
// specwire-score's own flags already gives.
absl::StatusOr<std::vector<std::string>> ReconcileArguments(const ReconcileRequest& request);

// Where to look for a Python with specwire_client, in order: $SPECWIRE_PYTHON alone when set;
// else the .venv/bin/python of each folder above the binary (a checkout's build tree), then
// python3 and python on PATH.
std::vector<std::string> ReconcilePythonCandidates(const std::string& binary_path,
                                                   const char* specwire_python,
                                                   const char* path_env);

// The first candidate that imports specwire_client.reconcile. FAILED_PRECONDITION naming every
// candidate tried and how to install the client when none does.
absl::StatusOr<std::string> FindReconcilePython(const std::vector<std::string>& candidates);

// Replaces this process with `python -m specwire_client.reconcile <arguments>` (its exit status
// is the command's: 0 agree, 1 differ, 2 bad input). Returns only when it could not start.
absl::Status ExecReconcile(const std::string& python, const std::vector<std::string>& arguments);

}  // namespace specwire
