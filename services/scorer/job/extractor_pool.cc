#include "services/scorer/job/extractor_pool.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "services/scorer/job/contract_checks.h"

namespace specwire {

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
  absl::StatusOr<std::unique_ptr<ExtractorSession>> OpenSession(
      const SessionOpenParams& params) override {
    return client_.OpenSession(params);
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
double ExtractorRetryPolicy::Backoff(int attempts_made) const {
  const double b = initial_backoff_s * std::pow(backoff_multiplier, std::max(attempts_made - 1, 0));
  return std::min(b, max_backoff_s);
}

bool IsRetryableExtractorError(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsAborted(s);
}
absl::StatusOr<ConnectedTarget> ConnectTarget(ExtractorPool& pool,
                                              const ExtractorRetryPolicy& retry,
                                              const std::atomic<bool>& cancelled,
                                              const std::function<void(const std::string&)>& log) {
  auto Log = [&](const std::string& line) {
    if (log) log(line);
  };
  SW_ASSIGN_OR_RETURN(std::vector<ExtractorEndpoint*> resolved, pool.Endpoints());
  ConnectedTarget target;
  std::vector<ExtractionContract> contracts;
  absl::Status first_error;
  for (ExtractorEndpoint* e : resolved) {
    auto c = e->Info();
    // A listed extractor that is restarting gets the retry policy's time to come back; behind a
    // DNS name an unanswering replica is left out instead (below).
    for (int attempt = 1; !c.ok() && IsRetryableExtractorError(c.status()) &&
                          !pool.resolves_by_dns() && attempt < retry.max_attempts && !cancelled;
         ++attempt) {
      Log(absl::StrCat("extractor ", e->address(), " GetModelInfo failed (attempt ", attempt,
                       "), retrying: ", c.status().ToString()));
      std::this_thread::sleep_for(std::chrono::duration<double>(retry.Backoff(attempt)));
      c = e->Info();
    }
    if (!c.ok()) {
      absl::Status s =
          Annotate(c.status(), absl::StrCat("extractor ", e->address(), " GetModelInfo"));
      if (!pool.resolves_by_dns() || !absl::IsUnavailable(s)) return s;
      Log(absl::StrCat("leaving out ", e->address(), ": ", s.message()));
      if (first_error.ok()) first_error = s;
      continue;
    }
    target.endpoints.push_back(e);
    contracts.push_back(std::move(*c));
  }
  if (target.endpoints.empty()) {
    return first_error.ok() ? absl::FailedPreconditionError("no extractor to score against")
                            : first_error;
  }
  for (size_t i = 1; i < target.endpoints.size(); ++i) {
    SW_RETURN_IF_ERROR(CheckSameTarget(target.endpoints[0]->address(), contracts[0],
                                       target.endpoints[i]->address(), contracts[i]));
  }
  target.contract = std::move(contracts[0]);
  return target;
}

}  // namespace specwire
