#include "common/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

using Json = nlohmann::json;

constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Parses the index's weight_map: tensor → shard file.
absl::StatusOr<std::map<std::string, std::string>> ParseIndex(const std::string& index_path) {
  SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  if (!index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": is a JSON ", index.type_name(), ", not an object"));
  }
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing object \"weight_map\""));
  }
  if (map_it->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": \"weight_map\" is empty"));
  }
  std::map<std::string, std::string> weight_map;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor \"", tensor,
                                                     "\" maps to ", shard.dump(), ", not a file"));
    }
    const auto& file = shard.get_ref<const std::string&>();
    // Shards live beside the index; a path here would let an index reach outside the checkpoint.
    if (file.empty() || file == "." || file == ".." || absl::StrContains(file, '/')) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor \"", tensor,
                                                     "\" maps to \"", file,
                                                     "\", not a file name in the directory"));
    }
    weight_map.emplace(tensor, file);
  }
  return weight_map;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(dir, ": cannot open checkpoint directory"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": not a directory"));
  }
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;

  const std::string index_path = absl::StrCat(dir, "/", kIndexFile);
  if (PathExists(index_path)) {
    SW_ASSIGN_OR_RETURN(auto weight_map, ParseIndex(index_path));
    std::set<std::string> files;
    for (const auto& [name, file] : weight_map) files.insert(file);

    // Where each tensor actually is, so a misplaced tensor's error can name both shards.
    std::map<std::string, std::string> actual_shard;
    for (const std::string& file : files) {
      auto shard = SafetensorsFile::Open(absl::StrCat(dir, "/", file));
      if (!shard.ok()) {
        return Annotate(shard.status(), absl::StrCat(index_path, ": shard \"", file, "\""));
      }
      for (const auto& [name, view] : (*shard)->tensors()) {
        auto [it, inserted] = actual_shard.emplace(name, file);
        if (!inserted) {
          return absl::InvalidArgumentError(absl::StrCat(dir, ": tensor \"", name,
                                                         "\" appears in both shard \"", it->second,
                                                         "\" and shard \"", file, "\""));
        }
        ckpt->tensors_.emplace(name, &view);
      }
      ckpt->shards_.push_back(*std::move(shard));
    }

    for (const auto& [name, file] : weight_map) {
      auto it = actual_shard.find(name);
      if (it == actual_shard.end()) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor \"", name,
                                                       "\" is listed in shard \"", file,
                                                       "\", which does not hold it"));
      }
      if (it->second != file) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor \"", name,
                                                       "\" is listed in shard \"", file,
                                                       "\" but is in shard \"", it->second, "\""));
      }
    }
    for (const auto& [name, file] : actual_shard) {
      if (!weight_map.contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": shard \"", file,
                                                       "\" holds tensor \"", name,
                                                       "\", which the index does not list"));
      }
    }
    return ckpt;
  }

  std::string single = absl::StrCat(dir, "/", kSingleFile);
  if (!PathExists(single)) {
    std::vector<std::string> candidates;
    std::error_code ec;
    // Explicit increment(ec): the range-for form throws on a failed step.
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".safetensors") {
        candidates.push_back(it->path().filename().string());
      }
    }
    if (ec) {
      return absl::ErrnoToStatus(ec.value(), absl::StrCat(dir, ": cannot list directory"));
    }
    if (candidates.empty()) {
      return absl::NotFoundError(absl::StrCat(dir, ": no ", kIndexFile, ", ", kSingleFile,
                                              " or other *.safetensors file"));
    }
    if (candidates.size() > 1) {
      std::sort(candidates.begin(), candidates.end());
      return absl::NotFoundError(absl::StrCat(
          dir, ": no ", kIndexFile, " or ", kSingleFile, ", and several *.safetensors files (",
          absl::StrJoin(candidates, ", "), "); cannot tell which is the model"));
    }
    single = absl::StrCat(dir, "/", candidates[0]);
  }
  SW_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single));
  for (const auto& [name, view] : file->tensors()) ckpt->tensors_.emplace(name, &view);
  ckpt->shards_.push_back(std::move(file));
  return ckpt;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, view] : tensors_) n += view->nbytes;
  return n;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot read"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

absl::StatusOr<ConfigFile> ReadConfigFile(const std::string& dir) {
  ConfigFile file{(std::filesystem::path(dir) / "config.json").string(), ""};
  SW_ASSIGN_OR_RETURN(file.text, ReadFileToString(file.path));
  return file;
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(tmp, ": cannot create"));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = done == bytes.size() && ::fsync(fd) == 0;
  int err = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace specwire
