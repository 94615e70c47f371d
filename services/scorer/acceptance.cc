#include "services/scorer/acceptance.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specwire {
namespace {

// τ of one list of step lengths per response: (mean of per-response means, pooled).
std::pair<double, double> Tau(const std::vector<const std::vector<int32_t>*>& lists) {
  double sum_of_means = 0;
  int64_t with_steps = 0, steps = 0, tokens = 0;
  for (const std::vector<int32_t>* l : lists) {
    if (l->empty()) continue;
    int64_t s = 0;
    for (int32_t v : *l) s += v;
    sum_of_means += static_cast<double>(s) / static_cast<double>(l->size());
    ++with_steps;
    steps += static_cast<int64_t>(l->size());
    tokens += s;
  }
  return {with_steps ? sum_of_means / static_cast<double>(with_steps) : 0.0,
          steps ? static_cast<double>(tokens) / static_cast<double>(steps) : 0.0};
}

}  // namespace

AcceptanceSummary Summarize(const std::vector<ResponseAcceptance>& responses, int32_t block_size) {
  AcceptanceSummary s;
  s.block_size = block_size;
  s.responses = static_cast<int64_t>(responses.size());
  const int32_t B = std::max(block_size, 1);
  s.histogram.assign(B, 0);
  s.num_accepted_tokens_per_pos.assign(B - 1, 0);
  s.per_position_acceptance.assign(B - 1, 0.0);

  std::vector<const std::vector<int32_t>*> dflash_lists;
  for (const ResponseAcceptance& r : responses) {
    dflash_lists.push_back(&r.step_lengths);
    for (int32_t len : r.step_lengths) {
      const int32_t L = std::clamp(len, 1, B);  // precondition: already in range
      ++s.steps;
      ++s.histogram[L - 1];
      const int32_t a = L - 1;  // accepted draft tokens
      s.num_accepted_tokens += a;
      for (int32_t k = 1; k <= a; ++k) ++s.num_accepted_tokens_per_pos[k - 1];
    }
  }
  std::tie(s.tau_mean_of_means, s.tau_pooled) = Tau(dflash_lists);

  // vLLM's counters: one draft per step of B − 1 tokens.
  s.num_drafts = s.steps;
  s.num_draft_tokens = s.steps * (B - 1);
  s.acceptance_rate =
      s.num_draft_tokens ? static_cast<double>(s.num_accepted_tokens) / s.num_draft_tokens : 0.0;
  // P(position k accepted | positions < k accepted) = #(a ≥ k) / #(a ≥ k − 1).
  for (int32_t k = 1; k <= B - 1; ++k) {
    const int64_t reached = k == 1 ? s.steps : s.num_accepted_tokens_per_pos[k - 2];
    s.per_position_acceptance[k - 1] =
        reached ? static_cast<double>(s.num_accepted_tokens_per_pos[k - 1]) / reached : 0.0;
  }

  std::map<int32_t, std::vector<const std::vector<int32_t>*>> ddtree_lists;
  for (const ResponseAcceptance& r : responses) {
    for (const auto& [budget, lengths] : r.ddtree_step_lengths) {
      ddtree_lists[budget].push_back(&lengths);
    }
  }
  for (const auto& [budget, lists] : ddtree_lists) s.ddtree_tau[budget] = Tau(lists);
  return s;
}

absl::Status ValidateAcceptance(const std::vector<ResponseAcceptance>& responses,
                                int32_t block_size) {
  if (block_size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be at least 2, got ", block_size));
  }
  auto check = [&](size_t r, const std::string& list, const std::vector<int32_t>& lengths) {
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 1 || lengths[i] > block_size) {
        return absl::InvalidArgumentError(absl::StrCat("responses[", r, "].", list, "[", i,
                                                       "] = ", lengths[i], " is outside [1, ",
                                                       block_size, "]"));
      }
    }
    return absl::OkStatus();
  };
  for (size_t r = 0; r < responses.size(); ++r) {
    absl::Status st = check(r, "step_lengths", responses[r].step_lengths);
    if (!st.ok()) return st;
    for (const auto& [budget, lengths] : responses[r].ddtree_step_lengths) {
      st = check(r, absl::StrCat("ddtree_step_lengths[", budget, "]"), lengths);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

std::string AcceptanceSummaryToJson(const AcceptanceSummary& s) {
  nlohmann::json j;
  j["block_size"] = s.block_size;
  j["responses"] = s.responses;
  j["steps"] = s.steps;
  j["tau_mean_of_means"] = s.tau_mean_of_means;
  j["tau_pooled"] = s.tau_pooled;
  j["histogram"] = s.histogram;
  j["per_position_acceptance"] = s.per_position_acceptance;
  j["num_drafts"] = s.num_drafts;
  j["num_draft_tokens"] = s.num_draft_tokens;
  j["num_accepted_tokens"] = s.num_accepted_tokens;
  j["num_accepted_tokens_per_pos"] = s.num_accepted_tokens_per_pos;
  j["acceptance_rate"] = s.acceptance_rate;
  nlohmann::json dd = nlohmann::json::object();
  for (const auto& [budget, tau] : s.ddtree_tau) {
    dd[std::to_string(budget)] = {{"tau_mean_of_means", tau.first}, {"tau_pooled", tau.second}};
  }
  j["ddtree_tau"] = dd;
  return j.dump();
}

}  // namespace specwire
