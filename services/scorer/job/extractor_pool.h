// The extractors a job runs against: one endpoint per address (ExtractorClient in production,
// fakes in tests), the pool that resolves a job's address spec into endpoints, the retry policy
// for calls a retry can fix, and ConnectTarget (step 1 of a job: every extractor's contract,
// checked to be one target).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "clients/cpp/extractor_client.h"
#include "common/contract.h"

namespace specwire {

// One extractor, as the job sees it. Calls may come from several threads at once.
class ExtractorEndpoint {
 public:
  virtual ~ExtractorEndpoint() = default;
  virtual std::string address() const = 0;
  virtual absl::StatusOr<ExtractionContract> Info() = 0;
  virtual absl::StatusOr<std::vector<std::vector<int64_t>>> Tokenize(
      const std::vector<std::string>& texts, bool add_special_tokens) = 0;
  virtual absl::StatusOr<GenerateReply> Generate(const GenerateParams& params) = 0;
  virtual absl::StatusOr<std::map<std::string, ReceivedTensor>> GetTensors(
      const std::vector<std::string>& names) = 0;
  // A live verification session (live jobs); UNIMPLEMENTED where the endpoint has none.
  virtual absl::StatusOr<std::unique_ptr<ExtractorSession>> OpenSession(
      const SessionOpenParams& params) {
    (void)params;
    return absl::UnimplementedError(absl::StrCat(address(), ": no live sessions"));
  }
};

std::unique_ptr<ExtractorEndpoint> MakeClientEndpoint(ExtractorClientOptions options);

// The extractors of a job. The spec is "host:port", a comma list of them, or "dns:///name:port"
// (every address of the name, resolved again for each job, so a scaled deployment is picked
// up). The C++ client talks to one address per channel, so each address gets its own client and
// prompts are spread over them: each extractor takes the next prompt when it is free.
class ExtractorPool {
 public:
  static absl::StatusOr<std::unique_ptr<ExtractorPool>> Create(const std::string& spec,
                                                               ExtractorClientOptions base);
  // A fixed set (tests); `as_dns` gives it the dns: behaviour (unanswering addresses left out).
  static std::unique_ptr<ExtractorPool> FromEndpoints(
      std::vector<std::unique_ptr<ExtractorEndpoint>> endpoints, bool as_dns = false);
  ~ExtractorPool();

  const std::string& spec() const { return spec_; }
  // A dns: spec: the address set may change between jobs, and a job leaves out addresses that
  // do not answer (UNAVAILABLE) as long as one does.
  bool resolves_by_dns() const { return dns_; }
  // The endpoints for one job (re-resolving a dns:/// spec). Thread-compatible.
  absl::StatusOr<std::vector<ExtractorEndpoint*>> Endpoints();

 private:
  ExtractorPool() = default;
  std::string spec_;
  ExtractorClientOptions base_;
  bool fixed_ = false;
  bool dns_ = false;
  std::map<std::string, std::unique_ptr<ExtractorEndpoint>> by_address_;
  std::vector<ExtractorEndpoint*> fixed_list_;
};

// Splits "a:1, b:2" (or resolves "dns:///name:port") into host:port addresses.
absl::StatusOr<std::vector<std::string>> ResolveExtractorAddresses(const std::string& spec);

// How a job retries an extractor call that failed for a reason a retry can fix (the extractor
// went away: UNAVAILABLE, which is also what a reset connection or a server killed in the middle
// of a stream gives; ABORTED). Greedy trajectories are deterministic, so asking again is safe.
// Other codes (INVALID_ARGUMENT, FAILED_PRECONDITION, DATA_LOSS, ...) fail the job at once.
struct ExtractorRetryPolicy {
  int max_attempts = 6;             // per prompt, the first included; 1: no retry
  double initial_backoff_s = 0.1;   // before the second attempt
  double backoff_multiplier = 2.0;  // each later wait grows by this factor
  double max_backoff_s = 2.0;       // the longest wait
  // The wait before attempt n + 1 (n >= 1 attempts made).
  double Backoff(int attempts_made) const;
};
bool IsRetryableExtractorError(const absl::Status& s);

// The extractors a job runs on, all serving `contract`.
struct ConnectedTarget {
  std::vector<ExtractorEndpoint*> endpoints;
  ExtractionContract contract;
};

// Step 1 of a job: the contract of every extractor of the pool. A listed extractor that is
// restarting (UNAVAILABLE) gets the retry policy's time to come back; behind a DNS name an
// unanswering replica is left out instead, as long as one answers. Every extractor must serve
// the same target (CheckSameTarget).
absl::StatusOr<ConnectedTarget> ConnectTarget(ExtractorPool& pool,
                                              const ExtractorRetryPolicy& retry,
                                              const std::atomic<bool>& cancelled,
                                              const std::function<void(const std::string&)>& log);

}  // namespace specwire
