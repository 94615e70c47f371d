// The drafter families behind one seam. A family is one file (its drafter and its Drafter
// implementation) plus one row of DrafterFamilies(): how its config.json declares it and how it
// loads. The loaded Drafter tells everything outside the family what it needs (a DrafterSpec:
// label, format, sizes, target layers, its tree) and drafts through the BlockDrafter interface
// (block_drafter.h); nothing else in the scorer names a family. docs/ARCHITECTURE.md has the
// recipe for adding one.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint.h"
#include "nlohmann/json.hpp"
#include "services/scorer/acceptance/acceptance.h"
#include "services/scorer/drafters/block_drafter.h"
#include "services/scorer/drafters/drafter_spec.h"

namespace specwire {

// A loaded drafter of any family.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // What the job side, reports and metrics may know of it.
  virtual const DrafterSpec& spec() const = 0;
  virtual at::ScalarType dtype() const = 0;
  virtual const at::Device& device() const = 0;
  // Resolves what the drafter leaves to its target's depth (EAGLE-3's default auxiliary layers,
  // an MTP head's input layer) and checks its layer ids in its own convention; spec() is
  // updated. FAILED_PRECONDITION naming the key.
  virtual absl::Status FitTargetLayers(int64_t target_layers) {
    (void)target_layers;
    return absl::OkStatus();
  }
  // The target's embedding and lm_head, [V, H] each, in the drafter's dtype and device (shared,
  // not copied). INVALID_ARGUMENT when their shapes do not fit the drafter.
  virtual absl::Status SetTargetHead(const at::Tensor& embed_tokens, const at::Tensor& lm_head) = 0;
  // The family's drafting: its block, chain or path (the replay's chain acceptance, the
  // teacher-forced acceptance at T > 0 and the live loop). References this drafter.
  virtual std::unique_ptr<BlockDrafter> Chain() = 0;
  // Its own tree for a node budget (spec().tree == kTreeEagle), or nullptr: the DDTree of a
  // kTreeDDTree family is built by the replay from Chain()'s per-position marginals.
  // `record`, when not null, receives every step's tree in the order the steps ran.
  virtual std::unique_ptr<BlockDrafter> Tree(const TreeSettings& trees, int32_t budget,
                                             std::vector<DraftTree>* record = nullptr) {
    (void)trees;
    (void)budget;
    (void)record;
    return nullptr;
  }
};

// One row of the table.
struct DrafterFamily {
  const char* name;  // the method label, e.g. "dflash"
  const char* what;  // one line for help texts and errors
  // The format (e.g. "speculators") when `config` (a drafter directory's config.json, parsed)
  // declares this family; nullopt when it does not; INVALID_ARGUMENT naming the file and key
  // when it declares it inconsistently.
  absl::StatusOr<std::optional<std::string>> (*detect)(const nlohmann::json& config,
                                                       const std::string& source);
  // Loads the drafter in `dir` (config.json + *.safetensors) read in `format`; every expected
  // tensor must be there with its shape and every other tensor is an error naming it.
  absl::StatusOr<std::unique_ptr<Drafter>> (*load)(const std::string& dir,
                                                   const std::string& format, at::ScalarType dtype,
                                                   const at::Device& device);
};

// Every family, most specific declaration first (a DSpark checkpoint is a DFlash one too).
const std::vector<DrafterFamily>& DrafterFamilies();

// The family `dir`'s config.json declares and the drafter loaded in its format. A declaration no
// family claims (an unknown speculators_model_type, say) is INVALID_ARGUMENT naming the file,
// the key and the families known.
absl::StatusOr<std::unique_ptr<Drafter>> LoadDrafter(const std::string& dir, at::ScalarType dtype,
                                                     const at::Device& device);

// A family's load function: its own loader's result on `dir` wrapped in
// FamilyDrafter(drafter, dir, config.json's text).
template <typename FamilyDrafter, typename Loaded>
absl::StatusOr<std::unique_ptr<Drafter>> MakeFamilyDrafter(
    const std::string& dir, absl::StatusOr<std::unique_ptr<Loaded>> loaded) {
  if (!loaded.ok()) return loaded.status();
  absl::StatusOr<ConfigFile> config = ReadConfigFile(dir);
  if (!config.ok()) return config.status();
  return std::unique_ptr<Drafter>(
      new FamilyDrafter(*std::move(loaded), dir, std::move(config->text)));
}

// "dflash, dflash2, eagle3, ...": the families' names, for messages.
std::string DrafterFamilyNames();

}  // namespace specwire
