#include "services/scorer/job/target_drafter.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/digest.h"
#include "common/safetensors.h"
#include "common/status.h"

namespace specwire {

absl::StatusOr<std::string> TargetMtpDrafterDir(
    const TargetHeadOptions& options, ExtractorEndpoint& endpoint,
    const ExtractionContract& contract, const std::function<void(const std::string&)>& log) {
  namespace fs = std::filesystem;
  if (!options.target_checkpoint.empty()) return options.target_checkpoint;
  const std::string what = absl::StrCat("drafter_path \"", kTargetMtpDrafter, "\"");
  std::vector<std::string> names;
  std::string digest;  // of the head's tensors: the trunk's weights_digest does not cover them
  for (const SkippedTensors& s : contract.skipped) {
    if (s.prefix == "mtp.") {
      names = s.names;
      digest = s.digest;
    }
  }
  if (names.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the target the extractor serves (", contract.architecture,
        ") has no multi-token-prediction head: its contract names no mtp.* tensors"));
  }
  if (contract.config_json.empty() || digest.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the extractor does not send the target's config.json "
              "(ExtractionContract.config_json) or a digest of its head (an extractor older than "
              "the scorer); give the "
              "scorer the checkpoint (--target_checkpoint) instead"));
  }
  std::error_code ec;
  const fs::path root =
      (options.cache_dir.empty() ? fs::temp_directory_path(ec) / "specwire-scorer"
                                 : fs::path(options.cache_dir)) /
      "target-mtp";
  // Keyed by the head and the config it is built from: the same trunk with another head (or
  // another config) gets a directory of its own.
  const std::string config_digest = DigestBytes(std::as_bytes(std::span(contract.config_json)));
  const fs::path dir = root / FileSafe(absl::StrCat(digest, "-", config_digest));
  if (fs::exists(dir / "config.json") && fs::exists(dir / "model.safetensors")) {
    return dir.string();
  }
  auto fetched = endpoint.GetTensors(names);
  if (!fetched.ok()) {
    return Annotate(fetched.status(),
                    absl::StrCat(what, ": GetTensors of the mtp.* tensors on ", endpoint.address()));
  }
  std::vector<TensorToWrite> tensors;
  int64_t bytes = 0;
  for (const auto& [name, t] : *fetched) {
    tensors.push_back({name, t.dtype, t.shape, std::span<const std::byte>(t.bytes)});
    bytes += static_cast<int64_t>(t.bytes.size());
  }
  // Written beside, then renamed into place: a directory that exists is complete.
  const fs::path tmp = root / absl::StrCat(dir.filename().string(), ".tmp.", getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(what, ": cannot create ", tmp.string(), ": ",
                                            ec.message()));
  }
  SW_RETURN_IF_ERROR(WriteSafetensors((tmp / "model.safetensors").string(), tensors));
  {
    std::ofstream out(tmp / "config.json", std::ios::binary);
    out << contract.config_json;
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat(what, ": cannot write ", tmp.string()));
    }
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);  // another job wrote it first
    if (!fs::exists(dir / "model.safetensors")) {
      return absl::InternalError(absl::StrCat(what, ": cannot move the head into ", dir.string()));
    }
  }
  if (log) {
    log(absl::StrCat("the target's MTP head (", names.size(), " tensors, ", bytes >> 10,
                     " KiB) fetched from ", endpoint.address(), " into ", dir.string()));
  }
  return dir.string();
}

}  // namespace specwire
