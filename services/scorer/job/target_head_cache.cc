#include "services/scorer/job/target_head_cache.h"

#include <filesystem>
#include <map>
#include <memory>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint.h"
#include "common/digest.h"
#include "common/model_config.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "services/scorer/job/extractor_pool.h"

namespace specwire {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kEmbedName[] = "model.embed_tokens.weight";
constexpr char kLmHeadName[] = "lm_head.weight";

std::string FileSafe(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      c = '-';
  }
  return out;
}

namespace {

absl::Status CheckHeadShape(const HeldTensor& t, const ExtractionContract& c,
                            absl::string_view source) {
  if (t.shape != std::vector<int64_t>{c.vocab_size, c.hidden_size}) {
    return absl::FailedPreconditionError(
        absl::StrCat(source, ": ", t.name, " is [", absl::StrJoin(t.shape, ", "),
                     "], the extractor's contract says [", c.vocab_size, ", ", c.hidden_size,
                     "] (vocab_size, hidden_size)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TargetHead> LoadCachedTargetHead(const std::string& cache_dir,
                                                const std::string& weights_digest) {
  const fs::path index = fs::path(cache_dir) / "targets" / (FileSafe(weights_digest) + ".json");
  SW_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index.string()));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(absl::StrCat(index.string(), ": not a JSON object"));
  }
  TargetHead head;
  head.key = weights_digest;
  for (const char* name : {kEmbedName, kLmHeadName}) {
    if (!j.contains(name) || !j.at(name).is_string()) {
      return absl::DataLossError(absl::StrCat(index.string(), ": no digest for ", name));
    }
    const std::string digest = j.at(name).get<std::string>();
    const fs::path file = fs::path(cache_dir) / "tensors" / (FileSafe(digest) + ".safetensors");
    SW_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(file.string()));
    const TensorView* v = f->Find("tensor");
    if (v == nullptr) return absl::DataLossError(absl::StrCat(file.string(), ": no tensor"));
    const std::span<const std::byte> bytes(v->data, v->nbytes);
    if (DigestBytes(bytes) != digest) {
      return absl::DataLossError(
          absl::StrCat(file.string(), ": content does not match its digest"));
    }
    HeldTensor t;
    t.name = name;
    t.shape = v->shape;
    t.dtype = v->dtype;
    t.bytes = bytes;
    t.owner = std::shared_ptr<const SafetensorsFile>(std::move(f));
    (std::string(name) == kEmbedName ? head.embed_tokens : head.lm_head) = std::move(t);
  }
  return head;
}

absl::Status StoreTargetHead(const std::string& cache_dir, const std::string& weights_digest,
                             const TargetHead& head) {
  json index = json::object();
  for (const HeldTensor* t : {&head.embed_tokens, &head.lm_head}) {
    const std::string digest = DigestBytes(t->bytes);
    index[t->name] = digest;
    const fs::path file = fs::path(cache_dir) / "tensors" / (FileSafe(digest) + ".safetensors");
    std::error_code ec;
    if (fs::exists(file, ec)) {
      // The same bytes (a tied head, an earlier target) unless the file went bad.
      auto f = SafetensorsFile::Open(file.string());
      const TensorView* v = f.ok() ? (*f)->Find("tensor") : nullptr;
      if (v != nullptr && DigestBytes({v->data, v->nbytes}) == digest) continue;
    }
    fs::create_directories(file.parent_path(), ec);
    SW_RETURN_IF_ERROR(WriteSafetensors(file.string(), {{"tensor", t->dtype, t->shape, t->bytes}},
                                        {{"digest", digest}, {"name", t->name}}));
  }
  const fs::path index_path = fs::path(cache_dir) / "targets" / (FileSafe(weights_digest) + ".json");
  return WriteFileAtomically(index_path.string(), index.dump(2));
}

absl::StatusOr<TargetHead> LoadCheckpointTargetHead(const std::string& dir,
                                                    const ExtractionContract& contract) {
  const std::string where = absl::StrCat("target_checkpoint ", dir);
  SW_ASSIGN_OR_RETURN(ConfigFile config_file, ReadConfigFile(dir));
  SW_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(config_file.text));
  for (const auto& [field, ours, theirs] :
       {std::tuple<const char*, int64_t, int64_t>{"num_layers", config.num_layers,
                                                  contract.num_layers},
        {"hidden_size", config.hidden_size, contract.hidden_size},
        {"vocab_size", config.vocab_size, contract.vocab_size}}) {
    if (ours != theirs) {
      return absl::FailedPreconditionError(absl::StrCat(where, ": ", field, ": checkpoint has ",
                                                        ours, ", extractor serves ", theirs));
    }
  }
  SW_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  std::shared_ptr<const Checkpoint> owner(std::move(ckpt));
  const std::string prefix = config.vlm_packaged ? "model.language_model." : "model.";
  auto take = [&](const std::string& canonical,
                  const std::string& stored) -> absl::StatusOr<HeldTensor> {
    const TensorView* v = owner->Find(stored);
    if (v == nullptr) {
      return absl::NotFoundError(absl::StrCat(where, ": no tensor ", stored));
    }
    if (!IsFloat(v->dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", stored, " is ",
                                                     DTypeName(v->dtype),
                                                     "; weights must be BF16, F16 or F32"));
    }
    HeldTensor t;
    t.name = canonical;
    t.shape = v->shape;
    t.dtype = v->dtype;
    t.bytes = std::span<const std::byte>(v->data, v->nbytes);
    t.owner = owner;
    return t;
  };
  TargetHead head;
  head.key = contract.weights_digest;
  const std::string embed = prefix + "embed_tokens.weight";
  SW_ASSIGN_OR_RETURN(head.embed_tokens, take(kEmbedName, embed));
  const bool tied = config.tie_word_embeddings || owner->Find(kLmHeadName) == nullptr;
  if (tied && !config.tie_word_embeddings) {
    return absl::NotFoundError(absl::StrCat(where,
                                            ": no tensor lm_head.weight (and the config "
                                            "does not tie it to the embedding)"));
  }
  SW_ASSIGN_OR_RETURN(head.lm_head, take(kLmHeadName, tied ? embed : std::string(kLmHeadName)));
  return head;
}
absl::Status EnsureTargetHead(const TargetHeadOptions& options, ScorerBackend& backend,
                              ExtractorEndpoint& endpoint, const ExtractionContract& contract,
                              const std::function<void(const std::string&)>& log) {
  auto Log = [&](const std::string& line) {
    if (log) log(line);
  };
  const std::string& key = contract.weights_digest;
  if (!key.empty() && backend.target_head_key() == key) return absl::OkStatus();
  TargetHead head;
  std::string source;
  if (!options.target_checkpoint.empty()) {
    SW_ASSIGN_OR_RETURN(head, LoadCheckpointTargetHead(options.target_checkpoint, contract));
    source = absl::StrCat("target head from the local checkpoint ", options.target_checkpoint);
  } else {
    bool cached = false;
    if (!options.cache_dir.empty() && !key.empty()) {
      auto c = LoadCachedTargetHead(options.cache_dir, key);
      if (c.ok()) {
        head = std::move(*c);
        cached = true;
        source = absl::StrCat("target head from the cache ", options.cache_dir);
      } else if (!absl::IsNotFound(c.status())) {
        Log(absl::StrCat("target head cache unusable, fetching again: ", c.status().ToString()));
      }
    }
    if (!cached) {
      auto fetched = endpoint.GetTensors({kEmbedName, kLmHeadName});
      if (!fetched.ok()) {
        return Annotate(fetched.status(), absl::StrCat("GetTensors on ", endpoint.address()));
      }
      auto tensors = std::make_shared<std::map<std::string, ReceivedTensor>>(std::move(*fetched));
      auto held = [&](const char* name) {
        const ReceivedTensor& r = tensors->at(name);
        HeldTensor t;
        t.name = name;
        t.shape = r.shape;
        t.dtype = r.dtype;
        t.bytes = r.bytes;
        t.owner = tensors;
        return t;
      };
      head.key = key;
      head.embed_tokens = held(kEmbedName);
      head.lm_head = held(kLmHeadName);
      int64_t bytes = 0;
      for (const auto& [n, t] : *tensors) bytes += static_cast<int64_t>(t.bytes.size());
      source =
          absl::StrCat("target head fetched from ", endpoint.address(), " (", bytes >> 20, " MiB)");
      if (!options.cache_dir.empty() && !key.empty()) {
        SW_RETURN_IF_ERROR(CheckHeadShape(head.embed_tokens, contract, "GetTensors"));
        SW_RETURN_IF_ERROR(CheckHeadShape(head.lm_head, contract, "GetTensors"));
        absl::Status stored = StoreTargetHead(options.cache_dir, key, head);
        if (stored.ok()) {
          absl::StrAppend(&source, ", cached in ", options.cache_dir);
        } else {
          Log(absl::StrCat("target head not cached: ", stored.ToString()));
        }
      }
    }
  }
  SW_RETURN_IF_ERROR(CheckHeadShape(head.embed_tokens, contract, source));
  SW_RETURN_IF_ERROR(CheckHeadShape(head.lm_head, contract, source));
  head.key = key;
  SW_RETURN_IF_ERROR(backend.SetTargetHead(head));
  Log(source);
  return absl::OkStatus();
}
}  // namespace specwire
