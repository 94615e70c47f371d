#include "services/scorer/drafters/registry.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint.h"
#include "common/status.h"
#include "services/scorer/drafters/dflash_drafter.h"
#include "services/scorer/drafters/domino_drafter.h"
#include "services/scorer/drafters/dspark_drafter.h"
#include "services/scorer/drafters/eagle3_drafter.h"
#include "services/scorer/drafters/mtp_drafter.h"
#include "services/scorer/drafters/peagle_drafter.h"
#include "services/scorer/drafters/xpress_drafter.h"

namespace specwire {

const std::vector<DrafterFamily>& DrafterFamilies() {
  static const std::vector<DrafterFamily> families = {
      DSparkFamily(),
      DominoFamily(),
      XPressFamily(),
      DFlash2Family(),
      PEagleFamily(),  // before EAGLE-3: a P-EAGLE checkpoint is read by its loader
      Eagle3Family(),
      MtpFamily(),
      DFlashFamily(),  // last: the other DFlash-based families declare themselves first
  };
  return families;
}

std::string DrafterFamilyNames() {
  std::vector<std::string> names;
  for (const DrafterFamily& f : DrafterFamilies()) names.push_back(f.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<std::unique_ptr<Drafter>> LoadDrafter(const std::string& dir, at::ScalarType dtype,
                                                     const at::Device& device) {
  SW_ASSIGN_OR_RETURN(ConfigFile file, ReadConfigFile(dir));
  const std::string& source = file.path;
  const nlohmann::json config =
      nlohmann::json::parse(file.text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  for (const DrafterFamily& family : DrafterFamilies()) {
    SW_ASSIGN_OR_RETURN(std::optional<std::string> format, family.detect(config, source));
    if (format) return family.load(dir, *format, dtype, device);
  }
  std::vector<std::string> known;
  for (const DrafterFamily& f : DrafterFamilies()) known.push_back(f.what);
  if (config.contains("speculators_model_type")) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": key \"speculators_model_type\" is ", config["speculators_model_type"].dump(),
        ", which no drafter family specwire reads declares (", absl::StrJoin(known, "; "), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": declares no drafter family specwire reads (",
                   absl::StrJoin(known, "; "),
                   "): neither speculators_model_type, nor architectures, nor dflash_config"));
}

}  // namespace specwire
