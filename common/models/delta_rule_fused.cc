#include "common/models/delta_rule_fused.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstring>
#include <vector>

#include "common/models/cpu_threads.h"

namespace specwire {
namespace {

// Element pointers with strides (in elements) of a 4-d [B, T, heads, d] tensor, d contiguous.
template <typename T>
struct Rows {
  const T* data;
  int64_t sb, st, sh;
  const T* At(int64_t b, int64_t t, int64_t h) const { return data + b * sb + t * st + h * sh; }
};
template <typename T>
Rows<T> RowsOf(const at::Tensor& x) {
  return {x.data_ptr<T>(), x.stride(0), x.stride(1), x.stride(2)};
}

// One token's L2-normalised row in fp32: x · rsqrt(Σx² + 1e-6) (transformers' l2norm), then
// × scale.
template <typename T>
void NormalisedRow(const T* x, int64_t d, float scale, float* out) {
  float sum = 0;
  for (int64_t i = 0; i < d; ++i) {
    out[i] = static_cast<float>(x[i]);
    sum += out[i] * out[i];
  }
  const float r = 1.0f / std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < d; ++i) out[i] = out[i] * r * scale;
}

// One token of one head: S ← S·decay; δ = (v − Sᵀk)·β; S ← S + k ⊗ δ; o = Sᵀq. S is
// [dk][dvp] (rows padded to 16 floats, the padding zero and unused), v and o [dvp].
void TokenScalar(float* S, int64_t dk, int64_t dv, int64_t dvp, const float* q, const float* k,
                 const float* v, float decay, float beta, float* kv, float* o) {
  std::fill(kv, kv + dv, 0.0f);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dvp;
    for (int64_t j = 0; j < dv; ++j) {
      row[j] *= decay;
      kv[j] += row[j] * k[i];
    }
  }
  for (int64_t j = 0; j < dv; ++j) kv[j] = (v[j] - kv[j]) * beta;  // δ
  std::fill(o, o + dv, 0.0f);
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dvp;
    for (int64_t j = 0; j < dv; ++j) {
      row[j] += k[i] * kv[j];
      o[j] += row[j] * q[i];
    }
  }
}

#if defined(__x86_64__)
#define SPECWIRE_AVX512 __attribute__((target("avx512f")))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The same token with the dv accumulators in NV registers of 16 lanes (dvp = 16 · NV).
template <int NV>
SPECWIRE_AVX512 void TokenAvx512(float* S, int64_t dk, const float* q, const float* k,
                                 const float* v, float decay, float beta, float* o) {
  constexpr int64_t dvp = 16 * NV;
  const __m512 vdecay = _mm512_set1_ps(decay);
  __m512 acc[NV];
  for (int c = 0; c < NV; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dvp;
    const __m512 ki = _mm512_set1_ps(k[i]);
    for (int c = 0; c < NV; ++c) {
      const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row + 16 * c), vdecay);
      _mm512_storeu_ps(row + 16 * c, s);
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(s, ki));
    }
  }
  __m512 delta[NV];
  for (int c = 0; c < NV; ++c) {
    delta[c] = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v + 16 * c), acc[c]),
                             _mm512_set1_ps(beta));
    acc[c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < dk; ++i) {
    float* row = S + i * dvp;
    const __m512 ki = _mm512_set1_ps(k[i]), qi = _mm512_set1_ps(q[i]);
    for (int c = 0; c < NV; ++c) {
      const __m512 s = _mm512_add_ps(_mm512_loadu_ps(row + 16 * c), _mm512_mul_ps(ki, delta[c]));
      _mm512_storeu_ps(row + 16 * c, s);
      acc[c] = _mm512_add_ps(acc[c], _mm512_mul_ps(s, qi));
    }
  }
  for (int c = 0; c < NV; ++c) _mm512_storeu_ps(o + 16 * c, acc[c]);
}
#pragma GCC diagnostic pop
#undef SPECWIRE_AVX512

bool HasAvx512F() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}
#endif

template <typename T, typename B>
void Run(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
         const at::Tensor& g_in, const at::Tensor& beta_in, at::Tensor& out, at::Tensor& state) {
  const int64_t Bn = v_in.size(0), T_ = v_in.size(1), nv = v_in.size(2), nk = k_in.size(2);
  const int64_t dk = k_in.size(3), dv = v_in.size(3), dvp = (dv + 15) / 16 * 16;
  const Rows<T> q = RowsOf<T>(q_in), k = RowsOf<T>(k_in), v = RowsOf<T>(v_in);
  const Rows<T> o = {out.data_ptr<T>(), out.stride(0), out.stride(1), out.stride(2)};
  const float* g = g_in.data_ptr<float>();
  const B* beta = beta_in.data_ptr<B>();
  const int64_t gs0 = g_in.stride(0), gs1 = g_in.stride(1), gs2 = g_in.stride(2);
  const int64_t bs0 = beta_in.stride(0), bs1 = beta_in.stride(1), bs2 = beta_in.stride(2);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  IntraOpForEach(Bn * nv, [&](int64_t item) {
    const int64_t b = item / nv, h = item % nv, hk = h / (nv / nk);
    std::vector<float> S(dk * dvp, 0.0f), qf(dk), kf(dk), vf(dvp, 0.0f), kv(dvp), of(dvp);
    float* st = state.data_ptr<float>() + (b * nv + h) * dk * dv;
    for (int64_t i = 0; i < dk; ++i) std::memcpy(&S[i * dvp], st + i * dv, dv * sizeof(float));
    using TokenFn = void (*)(float*, int64_t, const float*, const float*, const float*, float,
                             float, float*);
    TokenFn vec = nullptr;
#if defined(__x86_64__)
    if (HasAvx512F()) {
      constexpr TokenFn kByVectors[] = {nullptr,          &TokenAvx512<1>, &TokenAvx512<2>,
                                         &TokenAvx512<3>, &TokenAvx512<4>, &TokenAvx512<5>,
                                         &TokenAvx512<6>, &TokenAvx512<7>, &TokenAvx512<8>};
      if (dvp / 16 <= 8) vec = kByVectors[dvp / 16];  // dv up to 128; wider heads: scalar
    }
#endif
    for (int64_t t = 0; t < T_; ++t) {
      NormalisedRow(q.At(b, t, hk), dk, scale, qf.data());
      NormalisedRow(k.At(b, t, hk), dk, 1.0f, kf.data());
      const T* vr = v.At(b, t, h);
      for (int64_t j = 0; j < dv; ++j) vf[j] = static_cast<float>(vr[j]);
      const float decay = std::exp(g[b * gs0 + t * gs1 + h * gs2]);
      const float bt = static_cast<float>(beta[b * bs0 + t * bs1 + h * bs2]);
      if (vec != nullptr) {
        vec(S.data(), dk, qf.data(), kf.data(), vf.data(), decay, bt, of.data());
      } else {
        TokenScalar(S.data(), dk, dv, dvp, qf.data(), kf.data(), vf.data(), decay, bt, kv.data(),
                    of.data());
      }
      T* orow = const_cast<T*>(o.At(b, t, h));
      for (int64_t j = 0; j < dv; ++j) orow[j] = static_cast<T>(of[j]);
    }
    for (int64_t i = 0; i < dk; ++i) std::memcpy(st + i * dv, &S[i * dvp], dv * sizeof(float));
  });
}

}  // namespace

DeltaRuleResult GatedDeltaRuleFused(const at::Tensor& q_in, const at::Tensor& k_in,
                                    const at::Tensor& v_in, const at::Tensor& g_in,
                                    const at::Tensor& beta_in, const at::Tensor& initial_state) {
  TORCH_CHECK(q_in.device().is_cpu(), "the fused delta rule runs on the CPU");
  const int64_t B = v_in.size(0), T = v_in.size(1), nv = v_in.size(2), nk = k_in.size(2);
  const int64_t dk = k_in.size(3), dv = v_in.size(3);
  TORCH_CHECK(nv % nk == 0, "value heads ", nv, " are not a multiple of key heads ", nk);
  auto rows = [](const at::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); };
  const at::Tensor q = rows(q_in), k = rows(k_in), v = rows(v_in);
  const at::Tensor g = g_in.to(at::kFloat);
  const at::Tensor beta = beta_in.scalar_type() == q.scalar_type() || beta_in.scalar_type() == at::kFloat
                              ? beta_in
                              : beta_in.to(at::kFloat);
  at::Tensor state = initial_state.defined()
                         ? initial_state.to(at::kFloat).contiguous().clone()
                         : at::zeros({B, nv, dk, dv}, v.options().dtype(at::kFloat));
  at::Tensor out = at::empty({B, T, nv, dv}, q.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "delta_rule", [&] {
    using T_in = scalar_t;
    if (beta.scalar_type() == at::kFloat) {
      Run<T_in, float>(q, k, v, g, beta, out, state);
    } else {
      Run<T_in, T_in>(q, k, v, g, beta, out, state);
    }
  });
  return {out, state};
}

}  // namespace specwire
