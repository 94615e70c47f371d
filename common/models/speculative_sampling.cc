#include "common/models/speculative_sampling.h"

#include <algorithm>

#include "common/splitmix.h"

namespace specwire {
namespace {

// Row `i` of a [rows, V] double tensor, contiguous.
const double* Row(const at::Tensor& t, int64_t i) { return t.data_ptr<double>() + i * t.size(1); }

at::Tensor AsRows(const at::Tensor& t) { return t.to(at::kCPU, at::kDouble).contiguous(); }

// Draws from the weights w[0..V) (not necessarily normalised) with uniform u.
int64_t Draw(const double* w, int64_t V, double u) {
  double total = 0;
  int64_t last = -1;
  for (int64_t v = 0; v < V; ++v) {
    if (w[v] > 0) {
      total += w[v];
      last = v;
    }
  }
  if (last < 0) return -1;
  const double target = u * total;
  double cum = 0;
  for (int64_t v = 0; v <= last; ++v) {
    if (w[v] <= 0) continue;
    cum += w[v];
    if (cum > target) return v;
  }
  return last;
}

}  // namespace

double UniformAt(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t z = SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) ^ index);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int64_t SampleToken(const at::Tensor& p, double u) {
  const at::Tensor row = AsRows(p.reshape({1, -1}));
  return Draw(Row(row, 0), row.size(1), u);
}

ChainVerification VerifyChain(const at::Tensor& target_p, const std::vector<int64_t>& draft,
                              const at::Tensor& draft_q, VerifyRule rule, uint64_t seed,
                              uint64_t stream) {
  const at::Tensor p = AsRows(target_p);
  const at::Tensor q = rule == VerifyRule::kDraftDistribution ? AsRows(draft_q) : at::Tensor();
  const int64_t V = p.size(1);
  std::vector<double> residual(V);
  ChainVerification out;
  for (size_t i = 0; i < draft.size(); ++i) {
    const double* pi = Row(p, static_cast<int64_t>(i));
    const int64_t x = draft[i];
    const double px = pi[x];
    const double qx = rule == VerifyRule::kDraftDistribution ? Row(q, i)[x] : 1.0;
    const double u = UniformAt(seed, stream, 2 * i);
    // Accept with probability min(1, p(x) / q(x)), tested as u · q(x) < p(x) (no division).
    if (u * qx < px) {
      ++out.accepted;
      continue;
    }
    if (rule == VerifyRule::kDraftDistribution) {
      const double* qi = Row(q, static_cast<int64_t>(i));
      for (int64_t v = 0; v < V; ++v) residual[v] = std::max(0.0, pi[v] - qi[v]);
    } else {
      std::copy(pi, pi + V, residual.begin());
      residual[x] = 0;
    }
    out.next_token = Draw(residual.data(), V, UniformAt(seed, stream, 2 * i + 1));
    // p ≤ q everywhere means p == q (up to rounding): the rejection had probability 0, and p is
    // what the residual would have been.
    if (out.next_token < 0) out.next_token = Draw(pi, V, UniformAt(seed, stream, 2 * i + 1));
    return out;
  }
  const uint64_t k = draft.size();
  out.next_token = Draw(Row(p, static_cast<int64_t>(k)), V, UniformAt(seed, stream, 2 * k + 1));
  return out;
}

at::Tensor SamplingDistribution(const at::Tensor& logits, const SamplingParams& setting) {
  at::Tensor l = logits.to(at::kCPU, at::kDouble).contiguous();
  const int64_t V = l.size(0);
  if (setting.temperature <= 0) {
    at::Tensor p = at::zeros({V}, l.options());
    p[l.argmax().item<int64_t>()] = 1.0;
    return p;
  }
  at::Tensor p = at::softmax(l / setting.temperature, 0);
  const bool top_k = setting.top_k > 0 && setting.top_k < V;
  if (!top_k && setting.top_p >= 1) return p;
  // Most likely first, the lower token id first among equals (a stable sort of −p).
  auto [sorted, order] = at::sort(p.neg(), /*stable=*/true, 0, /*descending=*/false);
  const double* sp = sorted.data_ptr<double>();
  const int64_t* so = order.data_ptr<int64_t>();
  const int64_t k_keep = top_k ? setting.top_k : V;
  double kept_mass = 0;
  for (int64_t i = 0; i < k_keep; ++i) kept_mass += -sp[i];
  at::Tensor out = at::zeros({V}, l.options());
  double* o = out.data_ptr<double>();
  double before = 0;  // renormalised mass of the tokens kept so far
  for (int64_t i = 0; i < k_keep; ++i) {
    if (i > 0 && before >= setting.top_p) break;
    o[so[i]] = -sp[i];
    before += -sp[i] / kept_mass;
  }
  return out / out.sum();
}

TreeVerification VerifyTree(const at::Tensor& target_p, const std::vector<int32_t>& parents,
                            const std::vector<int64_t>& tokens, uint64_t seed, uint64_t stream) {
  const at::Tensor p = AsRows(target_p);
  const int64_t V = p.size(1);
  TreeVerification out;
  int32_t node = -1;  // the root
  for (uint64_t d = 0;; ++d) {
    const int64_t t = Draw(Row(p, node + 1), V, UniformAt(seed, stream, d));
    int32_t next = -1;
    for (size_t j = 0; j < tokens.size(); ++j) {
      if (parents[j] == node && tokens[j] == t) {
        next = static_cast<int32_t>(j);
        break;
      }
    }
    if (next < 0) {
      out.next_token = t;
      return out;
    }
    out.path.push_back(next);
    node = next;
  }
}

}  // namespace specwire
