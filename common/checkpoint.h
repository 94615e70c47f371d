// A Hugging Face checkpoint directory: config.json plus either one model.safetensors or shards
// listed in model.safetensors.index.json ({"weight_map": {tensor: shard file}}).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"

namespace specwire {

class Checkpoint {
 public:
  // Opens every shard of the checkpoint in `dir`. With an index, every shard it names must exist
  // and hold exactly the tensors the index assigns to it (a tensor listed under the wrong shard or
  // missing from its shard is an error naming both). Without an index, model.safetensors is used;
  // failing that, the single *.safetensors file in the directory (NOT_FOUND if there is none or
  // several). Shard errors keep the shard's code and are prefixed with the index and shard name.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // All tensors across shards, sorted by name. Views stay valid while the Checkpoint lives.
  const std::map<std::string, const TensorView*>& tensors() const { return tensors_; }
  const TensorView* Find(const std::string& name) const;
  // Total bytes of tensor data across shards.
  uint64_t total_bytes() const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*> tensors_;
};

// Reads a whole small file (config.json, tokenizer.json). NOT_FOUND names the path.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// A checkpoint directory's config.json: its path (which parse errors name) and its text.
struct ConfigFile {
  std::string path;
  std::string text;
};
absl::StatusOr<ConfigFile> ReadConfigFile(const std::string& dir);

// Writes `bytes` to `path` through `path`.tmp.<pid>, fsync and a rename (creating the parent
// directories), so a reader sees the old file or the whole new one, never half of it.
absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace specwire
