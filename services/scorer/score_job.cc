#include "services/scorer/score_job.h"

#include <fcntl.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint.h"
#include "common/digest.h"
#include "common/model_config.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace specwire {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kEmbedName[] = "model.embed_tokens.weight";
constexpr char kLmHeadName[] = "lm_head.weight";

double MeanStepLength(const std::vector<int32_t>& lengths) {
  if (lengths.empty()) return 0;
  int64_t sum = 0;
  for (int32_t v : lengths) sum += v;
  return static_cast<double>(sum) / static_cast<double>(lengths.size());
}

// ---------------------------------------------------------------------------------------------
// Contracts

absl::Status CheckDrafterContract(const DrafterSpec& d, const ExtractionContract& t) {
  std::vector<std::string> problems;
  if (d.num_target_layers > 0 && d.num_target_layers != t.num_layers) {
    problems.push_back(absl::StrCat("num_target_layers: drafter expects ", d.num_target_layers,
                                    ", extractor serves ", t.num_layers));
  }
  if (d.target_hidden_size != t.hidden_size) {
    problems.push_back(absl::StrCat("hidden_size: drafter expects ", d.target_hidden_size,
                                    " (fc in_features ", d.fc_in_features, " / ",
                                    d.target_layer_ids.size(), " target layers), extractor serves ",
                                    t.hidden_size));
  }
  if (d.vocab_size != t.vocab_size) {
    problems.push_back(absl::StrCat("vocab_size: drafter expects ", d.vocab_size,
                                    ", extractor serves ", t.vocab_size));
  }
  for (size_t i = 0; i < d.target_layer_ids.size(); ++i) {
    const int64_t id = d.target_layer_ids[i];
    if (id < 0 || id >= t.num_layers) {
      problems.push_back(absl::StrCat("target_layer_ids[", i, "]: drafter uses layer ", id,
                                      ", extractor serves layers [0, ", t.num_layers, ")"));
    }
  }
  if (d.mask_token_id < 0 || d.mask_token_id >= t.vocab_size) {
    problems.push_back(absl::StrCat("mask_token_id: drafter uses ", d.mask_token_id,
                                    ", extractor's vocabulary is [0, ", t.vocab_size, ")"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("drafter ", d.path, " does not fit the extractor's target (", t.architecture,
                   ", ", t.weights_digest, "): ", absl::StrJoin(problems, "; ")));
}

absl::Status CheckSameTarget(const std::string& address_a, const ExtractionContract& a,
                             const std::string& address_b, const ExtractionContract& b) {
  auto differ = [&](const char* field, const auto& va, const auto& vb) -> absl::Status {
    if (va == vb) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("extractors serve different targets: ", field,
                                                      ": ", address_a, " serves ", va, ", ",
                                                      address_b, " serves ", vb));
  };
  SW_RETURN_IF_ERROR(differ("weights_digest", a.weights_digest, b.weights_digest));
  SW_RETURN_IF_ERROR(differ("architecture", a.architecture, b.architecture));
  SW_RETURN_IF_ERROR(differ("num_layers", a.num_layers, b.num_layers));
  SW_RETURN_IF_ERROR(differ("hidden_size", a.hidden_size, b.hidden_size));
  SW_RETURN_IF_ERROR(differ("vocab_size", a.vocab_size, b.vocab_size));
  SW_RETURN_IF_ERROR(differ("tokenizer_digest", a.tokenizer_digest, b.tokenizer_digest));
  // Features of a bf16 and an fp32 target differ: one job would mix two sets of numbers.
  SW_RETURN_IF_ERROR(differ("compute_dtype", a.compute_dtype, b.compute_dtype));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Prompts

absl::StatusOr<std::vector<InputSequence>> ReadPromptDataset(const std::string& path,
                                                             int64_t max_prompts) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("dataset ", path, ": cannot open"));
  std::vector<InputSequence> out;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (max_prompts > 0 && static_cast<int64_t>(out.size()) >= max_prompts) break;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat("dataset ", path, " line ", line_no);
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
    }
    if (j.contains("input_ids")) {
      const json& ids = j.at("input_ids");
      if (!ids.is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": input_ids must be a list"));
      }
      std::vector<int64_t> v;
      for (const json& x : ids) {
        if (!x.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": input_ids must hold integers, got ", x.dump()));
        }
        v.push_back(x.get<int64_t>());
      }
      out.push_back(InputSequence::Tokens(std::move(v)));
    } else if (j.contains("prompt")) {
      if (!j.at("prompt").is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": prompt must be a string"));
      }
      out.push_back(InputSequence::Text(j.at("prompt").get<std::string>()));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected {\"prompt\": str} or {\"input_ids\": [int, ...]}"));
    }
  }
  if (in.bad()) return absl::DataLossError(absl::StrCat("dataset ", path, ": read error"));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Features

RequestedStates DrafterStates(const std::vector<int64_t>& ids, int64_t num_layers) {
  RequestedStates s;
  for (int64_t id : ids) {
    if (id == num_layers - 1) {
      s.final_norm = true;
    } else if (std::find(s.layer_ids.begin(), s.layer_ids.end(), id) == s.layer_ids.end()) {
      s.layer_ids.push_back(static_cast<int32_t>(id));
    }
  }
  return s;
}

absl::StatusOr<Trajectory> TrajectoryFromReply(GenerateReply& reply,
                                               const std::vector<int64_t>& ids, int64_t num_layers,
                                               int64_t max_new_tokens) {
  if (reply.completions.size() != 1) {
    return absl::InternalError(
        absl::StrCat("expected one completion, got ", reply.completions.size()));
  }
  const ReceivedCompletion& c = reply.completions[0];
  Trajectory t;
  t.tokens = c.prompt_token_ids;
  t.tokens.insert(t.tokens.end(), c.completion_token_ids.begin(), c.completion_token_ids.end());
  t.prompt_len = static_cast<int64_t>(c.prompt_token_ids.size());
  t.max_length = t.prompt_len + max_new_tokens;
  std::map<std::string, ReceivedState*> by_name;
  for (ReceivedState& s : reply.states) by_name[s.state] = &s;
  std::set<std::string> moved;
  for (int64_t id : ids) {
    const std::string name = id == num_layers - 1 ? "final_norm" : absl::StrCat("layer.", id);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      return absl::DataLossError(
          absl::StrCat("Generate reply lacks the state ", name, " (for target layer ", id, ")"));
    }
    ReceivedState& s = *it->second;
    FeatureState f;
    f.layer_id = id;
    f.dtype = s.dtype;
    f.rows = s.rows;
    f.hidden = s.hidden;
    // A layer listed twice in target_layer_ids keeps a copy for its second use.
    if (moved.insert(name).second) {
      f.bytes = std::move(s.bytes);
    } else {
      for (const FeatureState& prev : t.states) {
        if (prev.layer_id == id) f.bytes = prev.bytes;
      }
    }
    if (f.rows != static_cast<int64_t>(t.tokens.size())) {
      return absl::DataLossError(
          absl::StrCat("state ", name, " has ", f.rows, " rows for ", t.tokens.size(), " tokens"));
    }
    t.states.push_back(std::move(f));
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Extractors

namespace {

class ClientEndpoint : public ExtractorEndpoint {
 public:
  explicit ClientEndpoint(ExtractorClientOptions o) : client_(std::move(o)) {}
  std::string address() const override { return client_.options().target; }
  absl::StatusOr<ExtractionContract> Info() override { return client_.Info(); }
  absl::StatusOr<std::vector<std::vector<int64_t>>> Tokenize(const std::vector<std::string>& texts,
                                                             bool add_special) override {
    return client_.Tokenize(texts, add_special);
  }
  absl::StatusOr<GenerateReply> Generate(const GenerateParams& params) override {
    return client_.Generate(params);
  }
  absl::StatusOr<std::map<std::string, ReceivedTensor>> GetTensors(
      const std::vector<std::string>& names) override {
    return client_.GetTensors(names);
  }

 private:
  ExtractorClient client_;
};

absl::StatusOr<std::pair<std::string, std::string>> SplitHostPort(absl::string_view addr) {
  const size_t colon = addr.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == addr.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("extractor address \"", addr, "\": expected host:port"));
  }
  std::string host(addr.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, std::string(addr.substr(colon + 1)));
}

}  // namespace

std::unique_ptr<ExtractorEndpoint> MakeClientEndpoint(ExtractorClientOptions options) {
  return std::make_unique<ClientEndpoint>(std::move(options));
}

absl::StatusOr<std::vector<std::string>> ResolveExtractorAddresses(const std::string& spec_in) {
  const std::string spec(absl::StripAsciiWhitespace(spec_in));
  if (spec.empty()) return absl::InvalidArgumentError("extractor: no address given");
  std::vector<std::string> out;
  if (absl::StartsWith(spec, "dns:")) {
    // dns:///name:port or dns://authority/name:port (the authority is ignored: the system
    // resolver answers).
    std::string rest = spec.substr(4);
    if (absl::StartsWith(rest, "//")) {
      const size_t slash = rest.find('/', 2);
      if (slash == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("extractor \"", spec, "\": expected dns:///name:port"));
      }
      rest = rest.substr(slash + 1);
    }
    SW_ASSIGN_OR_RETURN(auto hp, SplitHostPort(rest));
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(hp.first.c_str(), hp.second.c_str(), &hints, &res);
    if (rc != 0) {
      return absl::UnavailableError(absl::StrCat("extractor \"", spec, "\": cannot resolve ",
                                                 hp.first, ": ", gai_strerror(rc)));
    }
    std::set<std::string> seen;
    for (addrinfo* p = res; p != nullptr; p = p->ai_next) {
      char host[NI_MAXHOST];
      if (getnameinfo(p->ai_addr, p->ai_addrlen, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) !=
          0) {
        continue;
      }
      const std::string a = p->ai_family == AF_INET6 ? absl::StrCat("[", host, "]:", hp.second)
                                                     : absl::StrCat(host, ":", hp.second);
      if (seen.insert(a).second) out.push_back(a);
    }
    freeaddrinfo(res);
    // The resolver's order may change between calls; a sorted list keeps jobs reproducible.
    std::sort(out.begin(), out.end());
    if (out.empty()) {
      return absl::UnavailableError(absl::StrCat("extractor \"", spec, "\": no address"));
    }
    return out;
  }
  std::string list = spec;
  if (absl::StartsWith(list, "ipv4:") || absl::StartsWith(list, "ipv6:")) list = list.substr(5);
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    SW_RETURN_IF_ERROR(SplitHostPort(part).status());
    out.emplace_back(part);
  }
  if (out.empty()) return absl::InvalidArgumentError("extractor: no address given");
  return out;
}

absl::StatusOr<std::unique_ptr<ExtractorPool>> ExtractorPool::Create(const std::string& spec,
                                                                     ExtractorClientOptions base) {
  std::unique_ptr<ExtractorPool> pool(new ExtractorPool());
  pool->spec_ = spec;
  pool->base_ = std::move(base);
  pool->dns_ = absl::StartsWith(absl::StripAsciiWhitespace(spec), "dns:");
  if (!pool->dns_) {
    SW_RETURN_IF_ERROR(ResolveExtractorAddresses(spec).status());
  }
  return pool;
}

std::unique_ptr<ExtractorPool> ExtractorPool::FromEndpoints(
    std::vector<std::unique_ptr<ExtractorEndpoint>> endpoints, bool as_dns) {
  std::unique_ptr<ExtractorPool> pool(new ExtractorPool());
  pool->fixed_ = true;
  pool->dns_ = as_dns;
  for (auto& e : endpoints) {
    const std::string a = absl::StrCat(e->address(), "#", pool->fixed_list_.size());
    pool->fixed_list_.push_back(e.get());
    pool->by_address_[a] = std::move(e);
  }
  std::vector<std::string> names;
  for (ExtractorEndpoint* e : pool->fixed_list_) names.push_back(e->address());
  pool->spec_ = absl::StrJoin(names, ",");
  return pool;
}

ExtractorPool::~ExtractorPool() = default;

absl::StatusOr<std::vector<ExtractorEndpoint*>> ExtractorPool::Endpoints() {
  if (fixed_) return fixed_list_;
  SW_ASSIGN_OR_RETURN(std::vector<std::string> addresses, ResolveExtractorAddresses(spec_));
  std::vector<ExtractorEndpoint*> out;
  for (const std::string& a : addresses) {
    auto it = by_address_.find(a);
    if (it == by_address_.end()) {
      ExtractorClientOptions o = base_;
      o.target = a;
      it = by_address_.emplace(a, MakeClientEndpoint(o)).first;
    }
    out.push_back(it->second.get());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Target head

namespace {

std::string FileSafe(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      c = '-';
  }
  return out;
}

absl::Status WriteFileAtomically(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

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
  return WriteFileAtomically(fs::path(cache_dir) / "targets" / (FileSafe(weights_digest) + ".json"),
                             index.dump(2));
}

absl::StatusOr<TargetHead> LoadCheckpointTargetHead(const std::string& dir,
                                                    const ExtractionContract& contract) {
  const std::string where = absl::StrCat("target_checkpoint ", dir);
  SW_ASSIGN_OR_RETURN(std::string config_text,
                      ReadFileToString((fs::path(dir) / "config.json").string()));
  SW_ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(config_text));
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

// ---------------------------------------------------------------------------------------------
// Retries and the results journal

double ExtractorRetryPolicy::Backoff(int attempts_made) const {
  const double b = initial_backoff_s * std::pow(backoff_multiplier, std::max(attempts_made - 1, 0));
  return std::min(b, max_backoff_s);
}

bool IsRetryableExtractorError(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsAborted(s);
}

namespace {

json ScoreToJson(const PromptScore& s, const std::string& key) {
  json ddtree = json::object();
  for (const auto& [budget, lengths] : s.acceptance.ddtree_step_lengths) {
    ddtree[std::to_string(budget)] = lengths;
  }
  return {{"key", key},
          {"prompt_index", s.prompt_index},
          {"prompt_tokens", s.acceptance.prompt_tokens},
          {"completion_tokens", s.acceptance.completion_tokens},
          {"step_lengths", s.acceptance.step_lengths},
          {"ddtree", ddtree},
          {"finish_reason", s.finish_reason}};
}

// One journal line back into a PromptScore; nullopt for a line that is not one (torn, edited).
std::optional<PromptScore> ScoreFromJson(const json& j) {
  try {
    PromptScore s;
    s.prompt_index = j.at("prompt_index").get<int64_t>();
    s.acceptance.prompt_tokens = j.at("prompt_tokens").get<int64_t>();
    s.acceptance.completion_tokens = j.at("completion_tokens").get<int64_t>();
    s.acceptance.step_lengths = j.at("step_lengths").get<std::vector<int32_t>>();
    for (const auto& [budget, lengths] : j.at("ddtree").items()) {
      s.acceptance.ddtree_step_lengths[std::stoi(budget)] = lengths.get<std::vector<int32_t>>();
    }
    s.finish_reason = j.at("finish_reason").get<std::string>();
    s.tau = MeanStepLength(s.acceptance.step_lengths);
    s.resumed = true;
    if (s.prompt_index < 0) return std::nullopt;
    return s;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

absl::Status ErrnoError(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("results journal ", path, ": ", what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResultsJournal>> ResultsJournal::Open(const std::string& path,
                                                                     const std::string& key) {
  std::error_code ec;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  std::unique_ptr<ResultsJournal> j(new ResultsJournal());
  j->path_ = path;
  j->key_ = key;
  j->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (j->fd_ < 0) return ErrnoError("cannot open", path);
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t got = ::read(j->fd_, buf, sizeof(buf));
    if (got < 0) return ErrnoError("cannot read", path);
    if (got == 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  // Only newline-terminated lines were written completely; a tail without one is a torn write,
  // cut off so the next line starts on a line of its own.
  const size_t complete = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (complete < text.size()) {
    ++j->ignored_lines_;
    if (::ftruncate(j->fd_, static_cast<off_t>(complete)) != 0) {
      return ErrnoError("cannot cut the torn last line", path);
    }
  }
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(text).substr(0, complete), '\n', absl::SkipWhitespace())) {
    json v = json::parse(line, nullptr, false);
    if (v.is_discarded() || !v.is_object() || !v.contains("key") || v.at("key") != key) {
      ++j->ignored_lines_;
      continue;
    }
    std::optional<PromptScore> score = ScoreFromJson(v);
    if (!score) {
      ++j->ignored_lines_;
      continue;
    }
    j->completed_[score->prompt_index] = std::move(*score);
  }
  if (::lseek(j->fd_, 0, SEEK_END) < 0) return ErrnoError("cannot seek", path);
  return j;
}

ResultsJournal::~ResultsJournal() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ResultsJournal::Append(const PromptScore& score) {
  const std::string line = ScoreToJson(score, key_).dump() + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot append", path_);
    }
    done += static_cast<size_t>(n);
  }
  // The line counts as kept only once it is on disk: a resumed job trusts every complete line.
  if (::fsync(fd_) != 0) return ErrnoError("cannot fsync", path_);
  PromptScore kept = score;
  kept.resumed = true;
  completed_[score.prompt_index] = std::move(kept);
  return absl::OkStatus();
}

absl::StatusOr<std::string> DigestDrafterFiles(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() &&
        (name == "config.json" || absl::EndsWith(name, ".safetensors"))) {
      files.push_back(entry.path());
    }
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("drafter_path ", dir, ": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  ContentDigest d;
  std::vector<char> buf(1 << 20);
  for (const fs::path& f : files) {
    d.UpdateField(f.filename().string());
    std::ifstream in(f, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("drafter file ", f.string(), ": cannot open"));
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const std::streamsize got = in.gcount();
      if (got > 0) d.Update(std::string_view(buf.data(), static_cast<size_t>(got)));
    }
  }
  return d.Hex();
}

std::string JobKey(const ScoreSpec& spec, const ExtractionContract& contract,
                   const DrafterSpec& drafter, const std::string& drafter_digest,
                   const std::vector<std::vector<int64_t>>& prompts, DType wire_dtype) {
  ContentDigest d;
  d.UpdateField("specwire-score-job-v1");
  d.UpdateField(spec.job_id);
  d.UpdateField(contract.weights_digest);
  d.UpdateField(contract.tokenizer_digest);
  d.UpdateField(contract.compute_dtype);
  d.UpdateField(drafter_digest);
  d.UpdateField(drafter.dtype);
  d.UpdateField(drafter.device);
  d.UpdateField(absl::StrCat(spec.max_new_tokens));
  d.UpdateField(absl::StrJoin(spec.ddtree_budgets, ","));
  d.UpdateField(absl::StrCat(static_cast<int>(wire_dtype)));
  d.UpdateField(absl::StrCat(prompts.size()));
  for (const auto& p : prompts) d.UpdateField(absl::StrJoin(p, ","));
  return d.Hex();
}

// ---------------------------------------------------------------------------------------------
// The runner

absl::Status ValidateSpec(const ScoreSpec& spec, const ScoreRunnerOptions& o) {
  if (spec.drafter_path.empty()) return absl::InvalidArgumentError("drafter_path: empty");
  if (spec.prompts.empty() && spec.dataset_path.empty()) {
    return absl::InvalidArgumentError("prompts: none given (give prompts or dataset_path)");
  }
  if (!spec.prompts.empty() && !spec.dataset_path.empty()) {
    return absl::InvalidArgumentError("give either prompts or dataset_path, not both");
  }
  if (spec.max_prompts < 0) return absl::InvalidArgumentError("max_prompts: negative");
  if (spec.job_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job_id: ", spec.job_id.size(), " characters, at most 128"));
  }
  for (char c : spec.job_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "job_id: \"", spec.job_id, "\" may hold only letters, digits, '.', '_' and '-'"));
    }
  }
  if (!spec.job_id.empty() && spec.job_id.find_first_not_of('.') == std::string::npos) {
    return absl::InvalidArgumentError("job_id: \".\" and \"..\" are not ids");
  }
  if (static_cast<int64_t>(spec.prompts.size()) > o.max_prompts) {
    return absl::InvalidArgumentError(absl::StrCat("prompts: ", spec.prompts.size(),
                                                   " exceed the limit of ", o.max_prompts,
                                                   " (--max_prompts)"));
  }
  if (spec.max_new_tokens < 1 || spec.max_new_tokens > o.max_new_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_tokens: ", spec.max_new_tokens,
                                                   " is outside [1, ", o.max_new_tokens,
                                                   "] (--max_new_tokens)"));
  }
  if (static_cast<int64_t>(spec.ddtree_budgets.size()) > o.max_ddtree_budgets) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ddtree_budgets: ", spec.ddtree_budgets.size(), " budgets exceed the limit of ",
        o.max_ddtree_budgets, " (--max_ddtree_budgets)"));
  }
  for (size_t i = 0; i < spec.ddtree_budgets.size(); ++i) {
    const int64_t b = spec.ddtree_budgets[i];
    if (b < 1 || b > o.max_ddtree_budget) {
      return absl::InvalidArgumentError(absl::StrCat("ddtree_budgets[", i, "]: ", b,
                                                     " is outside [1, ", o.max_ddtree_budget,
                                                     "] (--max_ddtree_budget)"));
    }
  }
  if (!o.data_root.empty()) {
    std::error_code ec;
    const fs::path root = fs::weakly_canonical(o.data_root, ec);
    for (const auto& [field, path] :
         {std::pair<const char*, const std::string&>{"drafter_path", spec.drafter_path},
          {"dataset_path", spec.dataset_path}}) {
      if (path.empty()) continue;
      const fs::path p = fs::weakly_canonical(path, ec);
      const auto rel = p.lexically_relative(root);
      if (ec || rel.empty() || *rel.begin() == "..") {
        return absl::PermissionDeniedError(
            absl::StrCat(field, ": ", path, " is outside --data_root ", o.data_root));
      }
    }
  }
  return absl::OkStatus();
}

ScoreLabels ResolveLabels(const ScoreSpec& spec) {
  ScoreLabels l = spec.labels;
  if (l.drafter.empty()) {
    const fs::path p = fs::path(spec.drafter_path).lexically_normal();
    l.drafter = p.filename().string();
    if (l.drafter.empty()) l.drafter = p.parent_path().filename().string();  // "dir/"
  }
  if (l.dataset.empty()) {
    l.dataset = spec.dataset_path.empty() ? "inline" : fs::path(spec.dataset_path).stem().string();
  }
  if (l.method.empty()) l.method = "dflash";
  return l;
}

ScoreRunner::ScoreRunner(ScorerBackend* backend, ExtractorPool* pool, ScoreRunnerOptions options)
    : backend_(backend), pool_(pool), options_(std::move(options)) {}

void ScoreRunner::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> ScoreRunner::ResolvePrompts(
    const ScoreSpec& spec, ExtractorEndpoint* tokenizer, const ExtractionContract& contract) {
  std::vector<InputSequence> inputs;
  std::string field = "prompts";
  if (!spec.dataset_path.empty()) {
    // Reading stops one prompt past the limit: a huge file is refused without being held.
    const int64_t read_at_most =
        spec.max_prompts > 0 ? spec.max_prompts : options_.max_prompts + 1;
    SW_ASSIGN_OR_RETURN(inputs, ReadPromptDataset(spec.dataset_path, read_at_most));
    field = absl::StrCat("dataset ", spec.dataset_path, " prompt");
    if (static_cast<int64_t>(inputs.size()) > options_.max_prompts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dataset ", spec.dataset_path, ": more than ", options_.max_prompts,
          " prompts, the limit (--max_prompts; or set max_prompts)"));
    }
  } else {
    inputs = spec.prompts;
    if (spec.max_prompts > 0 && static_cast<int64_t>(inputs.size()) > spec.max_prompts) {
      inputs.resize(spec.max_prompts);
    }
  }
  if (inputs.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": no prompt"));
  std::vector<std::vector<int64_t>> out(inputs.size());
  // Text prompts are tokenized by the extractor (the target's own tokenizer), in batches.
  std::vector<size_t> text_index;
  std::vector<std::string> texts;
  auto flush = [&]() -> absl::Status {
    if (texts.empty()) return absl::OkStatus();
    auto ids = tokenizer->Tokenize(texts, spec.add_special_tokens);
    if (!ids.ok()) {
      return Annotate(ids.status(),
                      absl::StrCat(field, "[", text_index.front(), "].text (Tokenize on ",
                                   tokenizer->address(), ")"));
    }
    if (ids->size() != texts.size()) {
      return absl::DataLossError(absl::StrCat("Tokenize returned ", ids->size(), " sequences for ",
                                              texts.size(), " texts"));
    }
    for (size_t k = 0; k < texts.size(); ++k) out[text_index[k]] = std::move((*ids)[k]);
    texts.clear();
    text_index.clear();
    return absl::OkStatus();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_text) {
      text_index.push_back(i);
      texts.push_back(inputs[i].text);
      if (texts.size() == 64) {
        SW_RETURN_IF_ERROR(flush());
      }
    } else {
      out[i] = inputs[i].token_ids;
    }
  }
  SW_RETURN_IF_ERROR(flush());
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: empty"));
    for (size_t j = 0; j < out[i].size(); ++j) {
      if (out[i][j] < 0 || out[i][j] >= contract.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "] token ", j, " = ",
                                                       out[i][j], " is outside the vocabulary [0, ",
                                                       contract.vocab_size, ")"));
      }
    }
  }
  return out;
}

absl::Status ScoreRunner::EnsureTargetHead(ExtractorEndpoint* endpoint,
                                           const ExtractionContract& contract) {
  const std::string& key = contract.weights_digest;
  if (!key.empty() && backend_->target_head_key() == key) return absl::OkStatus();
  TargetHead head;
  std::string source;
  if (!options_.target_checkpoint.empty()) {
    SW_ASSIGN_OR_RETURN(head, LoadCheckpointTargetHead(options_.target_checkpoint, contract));
    source = absl::StrCat("target head from the local checkpoint ", options_.target_checkpoint);
  } else {
    bool cached = false;
    if (!options_.cache_dir.empty() && !key.empty()) {
      auto c = LoadCachedTargetHead(options_.cache_dir, key);
      if (c.ok()) {
        head = std::move(*c);
        cached = true;
        source = absl::StrCat("target head from the cache ", options_.cache_dir);
      } else if (!absl::IsNotFound(c.status())) {
        Log(absl::StrCat("target head cache unusable, fetching again: ", c.status().ToString()));
      }
    }
    if (!cached) {
      auto fetched = endpoint->GetTensors({kEmbedName, kLmHeadName});
      if (!fetched.ok()) {
        return Annotate(fetched.status(), absl::StrCat("GetTensors on ", endpoint->address()));
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
      source = absl::StrCat("target head fetched from ", endpoint->address(), " (", bytes >> 20,
                            " MiB)");
      if (!options_.cache_dir.empty() && !key.empty()) {
        SW_RETURN_IF_ERROR(CheckHeadShape(head.embed_tokens, contract, "GetTensors"));
        SW_RETURN_IF_ERROR(CheckHeadShape(head.lm_head, contract, "GetTensors"));
        absl::Status stored = StoreTargetHead(options_.cache_dir, key, head);
        if (stored.ok()) {
          absl::StrAppend(&source, ", cached in ", options_.cache_dir);
        } else {
          Log(absl::StrCat("target head not cached: ", stored.ToString()));
        }
      }
    }
  }
  SW_RETURN_IF_ERROR(CheckHeadShape(head.embed_tokens, contract, source));
  SW_RETURN_IF_ERROR(CheckHeadShape(head.lm_head, contract, source));
  head.key = key;
  SW_RETURN_IF_ERROR(backend_->SetTargetHead(head));
  Log(source);
  return absl::OkStatus();
}

namespace {

// Trajectories fetched by the extractor threads, handed to the replay thread. A fetcher takes a
// slot before it calls Generate and the replay returns it after taking the trajectory, so at most
// `slots` trajectories (fetched or in flight) exist at once.
class TrajectoryQueue {
 public:
  struct Item {
    int64_t index = 0;
    absl::StatusOr<Trajectory> trajectory;
    std::string finish_reason;
  };

  explicit TrajectoryQueue(int64_t slots) : free_slots_(slots) {}

  // False when the job stopped.
  bool AcquireSlot() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopped_ || free_slots_ > 0; });
    if (stopped_) return false;
    --free_slots_;
    return true;
  }
  // Gives a slot back without an item (a fetch that will be tried again).
  void ReleaseSlot() {
    std::lock_guard<std::mutex> lock(mu_);
    ++free_slots_;
    cv_.notify_all();
  }
  void Push(Item item) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(item));
    cv_.notify_all();
  }
  // Waits up to `wait` for an item; nullopt on timeout.
  std::optional<Item> Pop(std::chrono::milliseconds wait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, wait, [&] { return !items_.empty(); })) return std::nullopt;
    Item item = std::move(items_.front());
    items_.pop_front();
    ++free_slots_;
    cv_.notify_all();
    return item;
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  int64_t free_slots_;
  bool stopped_ = false;
};

// The prompts a job still has to fetch: fresh ones in index order, and those whose fetch failed
// with a retryable error (taken first, by whichever extractor asks next, so a second replica
// picks up the prompts of one that went away). The retry budget is per prompt and extractor: an
// extractor that used up its attempts at a prompt leaves it to the others, and the prompt fails
// only once every extractor of the job did. A fetcher waits for work while another one's prompt
// is in flight: that prompt may still come back for a retry.
class PromptTasks {
 public:
  struct Task {
    int64_t index = 0;
    std::map<const ExtractorEndpoint*, int> attempts;  // made so far, per extractor
    int total_attempts() const {
      int n = 0;
      for (const auto& [e, k] : attempts) n += k;
      return n;
    }
  };

  PromptTasks(std::vector<int64_t> todo, int max_attempts)
      : todo_(std::move(todo)), max_attempts_(max_attempts) {}

  // The next prompt for extractor `e`; nullopt when nothing is left (or the job stopped).
  std::optional<Task> Take(const ExtractorEndpoint* e) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<Task> t;
    cv_.wait(lock, [&] {
      if (stopped_) return true;
      for (auto it = retry_.begin(); it != retry_.end(); ++it) {
        if (Left(*it, e) > 0) {
          t = std::move(*it);
          retry_.erase(it);
          return true;
        }
      }
      if (next_ < todo_.size()) {
        t.emplace();
        t->index = todo_[next_++];
        return true;
      }
      return retry_.empty() && in_flight_ == 0;
    });
    if (stopped_ || !t) return std::nullopt;
    ++in_flight_;
    return t;
  }
  // Attempts extractor `e` has left at the task.
  int Left(const Task& t, const ExtractorEndpoint* e) const {
    auto it = t.attempts.find(e);
    return max_attempts_ - (it == t.attempts.end() ? 0 : it->second);
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    cv_.notify_all();
  }
  void Retry(Task t) {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    retry_.push_back(std::move(t));
    cv_.notify_all();
  }
  // Sleeps up to `seconds`; true when the job stopped meanwhile.
  bool WaitStopped(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return stopped_; });
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const std::vector<int64_t> todo_;
  const int max_attempts_;
  size_t next_ = 0;
  std::deque<Task> retry_;
  int64_t in_flight_ = 0;
  bool stopped_ = false;
};

}  // namespace

absl::Status ScoreRunner::Run(const ScoreSpec& spec_in, const ScoreEvents& events,
                              const std::atomic<bool>& cancelled) {
  SW_RETURN_IF_ERROR(ValidateSpec(spec_in, options_));
  ScoreSpec spec = spec_in;
  spec.labels = ResolveLabels(spec);

  // 1. The target, as every extractor states it. Behind a DNS name, an address that does not
  // answer is left out of this job (a replica going away); a listed address must answer.
  SW_ASSIGN_OR_RETURN(std::vector<ExtractorEndpoint*> resolved, pool_->Endpoints());
  std::vector<ExtractorEndpoint*> endpoints;
  std::vector<ExtractionContract> contracts;
  absl::Status first_error;
  for (ExtractorEndpoint* e : resolved) {
    auto c = e->Info();
    // A listed extractor that is restarting gets the retry policy's time to come back; behind a
    // DNS name an unanswering replica is left out instead (below).
    for (int attempt = 1;
         !c.ok() && IsRetryableExtractorError(c.status()) && !pool_->resolves_by_dns() &&
         attempt < options_.retry.max_attempts && !cancelled;
         ++attempt) {
      Log(absl::StrCat("extractor ", e->address(), " GetModelInfo failed (attempt ", attempt,
                       "), retrying: ", c.status().ToString()));
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.retry.Backoff(attempt)));
      c = e->Info();
    }
    if (!c.ok()) {
      absl::Status s =
          Annotate(c.status(), absl::StrCat("extractor ", e->address(), " GetModelInfo"));
      if (!pool_->resolves_by_dns() || !absl::IsUnavailable(s)) return s;
      Log(absl::StrCat("leaving out ", e->address(), ": ", s.message()));
      if (first_error.ok()) first_error = s;
      continue;
    }
    endpoints.push_back(e);
    contracts.push_back(std::move(*c));
  }
  if (endpoints.empty()) {
    return first_error.ok() ? absl::FailedPreconditionError("no extractor to score against")
                            : first_error;
  }
  for (size_t i = 1; i < endpoints.size(); ++i) {
    SW_RETURN_IF_ERROR(CheckSameTarget(endpoints[0]->address(), contracts[0],
                                       endpoints[i]->address(), contracts[i]));
  }
  const ExtractionContract& contract = contracts[0];

  // 2. The drafter, checked against it before any work.
  auto loaded = backend_->LoadDrafter(spec.drafter_path);
  if (!loaded.ok()) {
    return Annotate(loaded.status(), absl::StrCat("drafter_path ", spec.drafter_path));
  }
  const DrafterSpec drafter = std::move(*loaded);
  SW_RETURN_IF_ERROR(CheckDrafterContract(drafter, contract));

  // 3. Prompts, 4. the target head.
  SW_ASSIGN_OR_RETURN(std::vector<std::vector<int64_t>> prompts,
                      ResolvePrompts(spec, endpoints[0], contract));
  SW_RETURN_IF_ERROR(EnsureTargetHead(endpoints[0], contract));
  if (cancelled) return absl::CancelledError("request cancelled");

  const int64_t n = static_cast<int64_t>(prompts.size());
  std::unique_ptr<ResultsJournal> journal;
  std::string journal_path = options_.results_file;
  if (journal_path.empty() && !options_.results_dir.empty() && !spec.job_id.empty()) {
    journal_path = (fs::path(options_.results_dir) / (spec.job_id + ".jsonl")).string();
  }
  if (!journal_path.empty()) {
    SW_ASSIGN_OR_RETURN(const std::string drafter_digest, DigestDrafterFiles(spec.drafter_path));
    const std::string key =
        JobKey(spec, contract, drafter, drafter_digest, prompts, options_.wire_dtype);
    SW_ASSIGN_OR_RETURN(journal, ResultsJournal::Open(journal_path, key));
    int64_t resumed = 0;
    for (const auto& entry : journal->completed()) resumed += entry.first < n ? 1 : 0;
    Log(absl::StrCat(
        "results journal ", journal_path, ": ", resumed, " of ", n, " prompts already scored",
        journal->ignored_lines() > 0 ? absl::StrCat(" (", journal->ignored_lines(),
                                                    " lines of another job spec or torn, ignored)")
                                     : ""));
  }
  ScoreStart start;
  start.contract = contract;
  start.drafter = drafter;
  start.labels = spec.labels;
  start.prompts_total = n;
  for (ExtractorEndpoint* e : endpoints) start.extractors.push_back(e->address());
  if (events.on_start) events.on_start(start);
  ScoreProgress progress;
  progress.total = n;
  if (events.on_progress) events.on_progress(progress);

  // 5. Trajectories from the extractors (one thread each), replays here. Prompts a results
  // journal holds from an earlier run of the job are reported first and not fetched again.
  std::vector<ResponseAcceptance> results(n);
  double sum_of_means = 0;
  int64_t with_steps = 0, tokens = 0;
  auto record = [&](const PromptScore& score) {
    results[score.prompt_index] = score.acceptance;
    const ResponseAcceptance& r = score.acceptance;
    if (!r.step_lengths.empty()) {
      sum_of_means += score.tau;
      ++with_steps;
    }
    progress.steps += static_cast<int64_t>(r.step_lengths.size());
    for (int32_t v : r.step_lengths) tokens += v;
    ++progress.done;
    progress.tau_so_far = with_steps ? sum_of_means / static_cast<double>(with_steps) : 0;
    progress.tau_pooled_so_far =
        progress.steps ? static_cast<double>(tokens) / static_cast<double>(progress.steps) : 0;
    if (events.on_prompt) events.on_prompt(score);
    if (events.on_progress) events.on_progress(progress);
  };
  std::vector<int64_t> todo;
  if (journal) {
    for (const auto& [i, score] : journal->completed()) {
      if (i < n) record(score);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!journal || !journal->completed().count(i)) todo.push_back(i);
  }

  const RequestedStates states = DrafterStates(drafter.target_layer_ids, contract.num_layers);
  const int64_t workers = static_cast<int64_t>(endpoints.size());
  TrajectoryQueue queue(workers * (1 + std::max<int64_t>(options_.prefetch_per_extractor, 0)));
  PromptTasks tasks(std::move(todo), std::max(options_.retry.max_attempts, 1));
  // Cancels the Generate calls in flight when the job stops (cancelled, failed): the extractor
  // frees their work at once instead of finishing a completion nobody reads.
  CallCancellation in_flight;
  const ExtractorRetryPolicy retry = options_.retry;
  std::vector<std::thread> fetchers;
  for (ExtractorEndpoint* e : endpoints) {
    fetchers.emplace_back([&, e] {
      int failures_in_row = 0;  // this extractor's, for its backoff
      while (!cancelled) {
        if (!queue.AcquireSlot()) return;
        std::optional<PromptTasks::Task> task = tasks.Take(e);
        if (!task) return;
        const int64_t i = task->index;
        GenerateParams p;
        p.prompts = {InputSequence::Tokens(prompts[i])};
        p.max_new_tokens = static_cast<uint32_t>(spec.max_new_tokens);
        p.states = states;
        p.dtype = options_.wire_dtype;
        p.request_id = absl::StrCat("score-", spec.labels.drafter, "-", i);
        p.cancel = &in_flight;
        TrajectoryQueue::Item item;
        item.index = i;
        auto reply = e->Generate(p);
        ++task->attempts[e];
        // Retried while some extractor of the job has attempts left at this prompt.
        bool others_left = false;
        for (ExtractorEndpoint* other : endpoints) others_left |= tasks.Left(*task, other) > 0;
        if (!reply.ok() && IsRetryableExtractorError(reply.status()) && !cancelled && others_left) {
          ++failures_in_row;
          Log(absl::StrCat("prompt ", i, ": Generate on ", e->address(), " failed (attempt ",
                           task->attempts[e], " of ", retry.max_attempts,
                           " there), retrying: ", reply.status().ToString()));
          queue.ReleaseSlot();
          tasks.Retry(std::move(*task));
          if (tasks.WaitStopped(retry.Backoff(failures_in_row))) return;
          continue;
        }
        tasks.Done();
        if (!reply.ok()) {
          std::string where = absl::StrCat("prompt ", i, " (Generate on ", e->address());
          if (IsRetryableExtractorError(reply.status()) && task->total_attempts() > 1) {
            absl::StrAppend(&where, ", failed ", task->total_attempts(),
                            " times, the retry budget");
          }
          item.trajectory = Annotate(reply.status(), absl::StrCat(where, ")"));
        } else {
          failures_in_row = 0;
          item.finish_reason =
              reply->completions.empty() ? "" : reply->completions[0].finish_reason;
          item.trajectory = TrajectoryFromReply(*reply, drafter.target_layer_ids,
                                                contract.num_layers, spec.max_new_tokens);
          if (!item.trajectory.ok()) {
            item.trajectory = Annotate(item.trajectory.status(),
                                       absl::StrCat("prompt ", i, " (", e->address(), ")"));
          }
        }
        queue.Push(std::move(item));
      }
    });
  }
  auto stop_fetchers = [&] {
    queue.Stop();
    tasks.Stop();
    in_flight.Cancel();
    for (std::thread& t : fetchers) t.join();
    fetchers.clear();
  };

  absl::Status status;
  while (progress.done < n) {
    if (cancelled) {
      status = absl::CancelledError("request cancelled");
      break;
    }
    std::optional<TrajectoryQueue::Item> item = queue.Pop(std::chrono::milliseconds(50));
    if (!item) continue;
    if (!item->trajectory.ok()) {
      status = item->trajectory.status();
      break;
    }
    auto replayed = backend_->Replay(*item->trajectory, spec.ddtree_budgets);
    if (!replayed.ok()) {
      status = Annotate(replayed.status(), absl::StrCat("prompt ", item->index));
      break;
    }
    PromptScore score;
    score.prompt_index = item->index;
    score.acceptance = std::move(*replayed);
    score.acceptance.prompt_tokens = item->trajectory->prompt_len;
    score.acceptance.completion_tokens =
        static_cast<int64_t>(item->trajectory->tokens.size()) - score.acceptance.prompt_tokens;
    score.finish_reason = item->finish_reason;
    score.tau = MeanStepLength(score.acceptance.step_lengths);
    if (journal) {
      status = journal->Append(score);
      if (!status.ok()) break;
    }
    record(score);
  }
  stop_fetchers();
  SW_RETURN_IF_ERROR(status);

  // 6. The summary, over the prompts in index order.
  SW_RETURN_IF_ERROR(ValidateAcceptance(results, drafter.block_size));
  if (events.on_summary) events.on_summary(Summarize(results, drafter.block_size));
  return absl::OkStatus();
}

}  // namespace specwire
