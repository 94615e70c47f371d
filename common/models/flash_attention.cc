#include "common/models/flash_attention.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "common/models/cpu_threads.h"

namespace specwire {

#if defined(__x86_64__)
namespace {

constexpr int64_t kLanes = 16;                // fp32 lanes of a 512-bit register
constexpr int64_t kBlockKeys = 4 * kLanes;    // keys per block: a register tile's four columns
constexpr int64_t kBlockPairs = kBlockKeys / 2;
constexpr int64_t kBlockRows = 64;            // query rows per work item
constexpr int64_t kTileRows = 4;              // query rows per register tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool HasAvx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return yes;
}
bool HasAvx512Bf16() {
  static const bool yes = HasAvx512() && __builtin_cpu_supports("avx512bf16");
  return yes;
}

// The shapes of one call. Keys are packed per (batch, kv head) into whole 64-key blocks, values
// into whole blocks of key pairs; padding (keys past S, dims past D) is zero.
struct Geometry {
  int64_t B, Hq, Hkv, T, S, D, past, window;
  float scale;
  int64_t group;     // query heads per kv head
  int64_t kblocks;   // ceil(S / 64)
  int64_t dpairs;    // ceil(D / 2): bf16 pairs along a head
  int64_t dvec;      // D rounded up to 16: a row of the value accumulator
  int64_t qblocks;   // ceil(T / 64)
};

// Element pointers with their strides (in elements), last dimension contiguous.
template <typename T>
struct Strided4 {
  const T* data;
  int64_t s0, s1, s2;
  const T* Row(int64_t b, int64_t h, int64_t t) const { return data + b * s0 + h * s1 + t * s2; }
};

uint32_t Bits(at::BFloat16 x) { return x.x; }
uint32_t Pair(const at::BFloat16* row, int64_t d, int64_t D) {
  const uint32_t lo = d < D ? Bits(row[d]) : 0u;
  const uint32_t hi = d + 1 < D ? Bits(row[d + 1]) : 0u;
  return lo | (hi << 16);
}

#define SPECWIRE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#define SPECWIRE_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// GCC 12's AVX-512 headers seed some intrinsics with _mm512_undefined_*(), which its own
// -Wuninitialized flags once they are inlined here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// exp(x) on 16 lanes: 2^n · e^r with n = round(x / ln 2) and |r| <= ln 2 / 2 (ln 2 split in two
// parts, Cody and Waite), e^r by its Taylor series to r^7 (truncation below 1e-8 relative), 2^n
// applied exactly by vscalefps. Within 2 ulp of expf; exp(0) is exactly 1. Arguments below -104
// give 0; callers never pass more than 0 (scores minus their running maximum).
SPECWIRE_AVX512 inline __m512 Exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The online softmax of a tile's four rows over one key block, in place: row r of s (64 raw
// scores) becomes the probabilities exp(scale·s − m_new) of the keys in [first[r], last[r]) and
// zero elsewhere; m and l are updated, and alpha[r] is the factor by which the row's earlier value
// sum must be rescaled. A row that sees no key of the block keeps its m and l, gets zeros and
// alpha exactly 1. The four rows run side by side: one row alone is a chain of dependent
// reductions and exponentials, four interleave.
SPECWIRE_AVX512 void SoftmaxTile(float* s, const int64_t* first, const int64_t* last, float scale,
                                 float* m, float* l, float* alpha) {
  const __m512 vscale = _mm512_set1_ps(scale);
  __mmask16 mask[4][4];
  __m512 x[4][4];
  float m_new[4];
  for (int r = 0; r < 4; ++r) {
    const int64_t n = std::max<int64_t>(0, last[r] - first[r]);
    const uint64_t bits = n == 0 ? 0ull : (n >= 64 ? ~0ull : ((1ull << n) - 1)) << first[r];
    __m512 vmax = _mm512_set1_ps(kNegInf);
    for (int c = 0; c < 4; ++c) {
      mask[r][c] = static_cast<__mmask16>(bits >> (16 * c));
      x[r][c] = _mm512_mul_ps(_mm512_loadu_ps(s + r * kBlockKeys + 16 * c), vscale);
      vmax = _mm512_mask_max_ps(vmax, mask[r][c], vmax, x[r][c]);
    }
    m_new[r] = std::max(m[r], _mm512_reduce_max_ps(vmax));
  }
  // alpha = exp(m_old − m_new): 1 when the maximum stays, 0 for a row's first keys.
  __m512 diff = _mm512_setzero_ps();
  __mmask16 first_keys = 0;
  for (int r = 0; r < 4; ++r) {
    if (m[r] == kNegInf) {
      first_keys |= static_cast<__mmask16>(m_new[r] != kNegInf) << r;
    } else {
      diff = _mm512_mask_mov_ps(diff, static_cast<__mmask16>(1u << r),
                                _mm512_set1_ps(m[r] - m_new[r]));
    }
  }
  alignas(64) float a[16];
  _mm512_store_ps(a, _mm512_maskz_mov_ps(static_cast<__mmask16>(~first_keys), Exp16(diff)));
  for (int r = 0; r < 4; ++r) {
    const __m512 vm = _mm512_set1_ps(m_new[r]);
    __m512 sum = _mm512_setzero_ps();
    for (int c = 0; c < 4; ++c) {
      const __m512 p = _mm512_maskz_mov_ps(mask[r][c], Exp16(_mm512_sub_ps(x[r][c], vm)));
      sum = _mm512_add_ps(sum, p);
      _mm512_storeu_ps(s + r * kBlockKeys + 16 * c, p);
    }
    alpha[r] = a[r];
    l[r] = l[r] * a[r] + _mm512_reduce_add_ps(sum);
    m[r] = m_new[r];
  }
}

// ---------------------------------------------------------------------------------------------
// The fp32 kernel (AVX-512F fused multiply-adds).
// Packed keys: per block, [D][64] (dimension-major, 64 keys a row). Packed values: [keys][dvec].

// s[4][64] = q[4][D] · K_block^T.
SPECWIRE_AVX512 void ScoreTileF32(const float* q, int64_t D, const float* kb, float* s) {
  __m512 acc[4][4];
  for (auto& r : acc)
    for (auto& c : r) c = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const float* kd = kb + d * kBlockKeys;
    const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16),
                 k2 = _mm512_loadu_ps(kd + 32), k3 = _mm512_loadu_ps(kd + 48);
    for (int r = 0; r < 4; ++r) {
      const __m512 qr = _mm512_set1_ps(q[r * D + d]);
      acc[r][0] = _mm512_fmadd_ps(qr, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qr, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qr, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(qr, k3, acc[r][3]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + r * kBlockKeys + 16 * c, acc[r][c]);
}

// o[4][NC·16] = o · alpha + p[4][64] · V_block, for the NC value vectors at column `col`.
template <int NC>
SPECWIRE_AVX512 void ValueTileF32(const float* p, const float* vb, int64_t dvec, const float* alpha,
                                  float* o, int64_t col) {
  __m512 acc[4][NC];
  for (int r = 0; r < 4; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < NC; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dvec + col + 16 * c), a);
  }
  for (int64_t j = 0; j < kBlockKeys; ++j) {
    __m512 v[NC];
    for (int c = 0; c < NC; ++c) v[c] = _mm512_loadu_ps(vb + j * dvec + col + 16 * c);
    for (int r = 0; r < 4; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kBlockKeys + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(pr, v[c], acc[r][c]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * dvec + col + 16 * c, acc[r][c]);
}

// ---------------------------------------------------------------------------------------------
// The bf16 kernel (AVX512-BF16: vdpbf16ps adds the two products of a bf16 pair to an fp32 lane).
// Packed keys: per block, [dpairs][64] 32-bit words, word = the key's dims (2p, 2p + 1).
// Packed values: [key pairs][dvec] words, word = dim d of keys (2j, 2j + 1).
// Queries: [rows][dpairs] words; probabilities: [rows][64] bf16, read as [rows][32] pairs.

SPECWIRE_AVX512_BF16 inline __m512bh AsBf16(__m512i v) { return (__m512bh)v; }

SPECWIRE_AVX512_BF16 void ScoreTileBf16(const uint32_t* q, int64_t dpairs, const uint32_t* kb,
                                        float* s) {
  __m512 acc[4][4];
  for (auto& r : acc)
    for (auto& c : r) c = _mm512_setzero_ps();
  for (int64_t p = 0; p < dpairs; ++p) {
    const uint32_t* kp = kb + p * kBlockKeys;
    const __m512bh k0 = AsBf16(_mm512_loadu_si512(kp)), k1 = AsBf16(_mm512_loadu_si512(kp + 16)),
                   k2 = AsBf16(_mm512_loadu_si512(kp + 32)),
                   k3 = AsBf16(_mm512_loadu_si512(kp + 48));
    for (int r = 0; r < 4; ++r) {
      const __m512bh qr = AsBf16(_mm512_set1_epi32(static_cast<int>(q[r * dpairs + p])));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qr, k0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qr, k1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], qr, k2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], qr, k3);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(s + r * kBlockKeys + 16 * c, acc[r][c]);
}

template <int NC>
SPECWIRE_AVX512_BF16 void ValueTileBf16(const uint32_t* p, const uint32_t* vb, int64_t dvec,
                                        const float* alpha, float* o, int64_t col) {
  __m512 acc[4][NC];
  for (int r = 0; r < 4; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < NC; ++c)
      acc[r][c] = _mm512_mul_ps(_mm512_loadu_ps(o + r * dvec + col + 16 * c), a);
  }
  for (int64_t j = 0; j < kBlockPairs; ++j) {
    __m512bh v[NC];
    for (int c = 0; c < NC; ++c) v[c] = AsBf16(_mm512_loadu_si512(vb + j * dvec + col + 16 * c));
    for (int r = 0; r < 4; ++r) {
      const __m512bh pr = AsBf16(_mm512_set1_epi32(static_cast<int>(p[r * kBlockPairs + j])));
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pr, v[c]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * dvec + col + 16 * c, acc[r][c]);
}

// A tile's 4 × 64 fp32 probabilities to bf16 (round to nearest even), in key order.
SPECWIRE_AVX512_BF16 void RoundProbabilities(const float* s, uint32_t* out) {
  for (int c = 0; c < 16; ++c) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(s + 16 * c));
    std::memcpy(out + 8 * c, &h, sizeof(h));
  }
}

#pragma GCC diagnostic pop

// ---------------------------------------------------------------------------------------------
// One dtype's kernel: packing, the per-item loop, and the output.

template <typename T>
struct Flash {
  static constexpr bool kBf16 = std::is_same_v<T, at::BFloat16>;
  // Packed storage: fp32 keeps floats, bf16 pairs of bf16 in 32-bit words.
  using Word = std::conditional_t<kBf16, uint32_t, float>;

  const Geometry& g;
  Strided4<T> q, k, v;
  T* out;  // [B, T, Hq * D]
  int64_t key_words;    // per (b, kv head)
  int64_t value_words;  // per (b, kv head)
  std::vector<Word> keys, values;

  Flash(const Geometry& geo, Strided4<T> q_, Strided4<T> k_, Strided4<T> v_, T* out_)
      : g(geo), q(q_), k(k_), v(v_), out(out_) {
    const int64_t depth = kBf16 ? g.dpairs : g.D;
    key_words = g.kblocks * depth * kBlockKeys;
    value_words = g.kblocks * (kBf16 ? kBlockPairs : kBlockKeys) * g.dvec;
    keys.assign(static_cast<size_t>(g.B * g.Hkv * key_words), Word{});
    values.assign(static_cast<size_t>(g.B * g.Hkv * value_words), Word{});
  }

  // Packs the keys and values of block kb of (b, kv head h).
  void PackBlock(int64_t b, int64_t h, int64_t kb) {
    const int64_t bh = b * g.Hkv + h;
    const int64_t first = kb * kBlockKeys, n = std::min(kBlockKeys, g.S - first);
    if constexpr (kBf16) {
      uint32_t* kp = keys.data() + bh * key_words + kb * g.dpairs * kBlockKeys;
      for (int64_t j = 0; j < n; ++j) {
        const T* row = k.Row(b, h, first + j);
        for (int64_t p = 0; p < g.dpairs; ++p) kp[p * kBlockKeys + j] = Pair(row, 2 * p, g.D);
      }
      uint32_t* vp = values.data() + bh * value_words + kb * kBlockPairs * g.dvec;
      for (int64_t j = 0; j < n; j += 2) {
        const T* r0 = v.Row(b, h, first + j);
        const T* r1 = j + 1 < n ? v.Row(b, h, first + j + 1) : nullptr;
        uint32_t* w = vp + (j / 2) * g.dvec;
        for (int64_t d = 0; d < g.D; ++d) w[d] = Bits(r0[d]) | ((r1 ? Bits(r1[d]) : 0u) << 16);
      }
    } else {
      float* kp = keys.data() + bh * key_words + kb * g.D * kBlockKeys;
      for (int64_t j = 0; j < n; ++j) {
        const float* row = k.Row(b, h, first + j);
        for (int64_t d = 0; d < g.D; ++d) kp[d * kBlockKeys + j] = row[d];
      }
      float* vp = values.data() + bh * value_words + first * g.dvec;
      for (int64_t j = 0; j < n; ++j) std::memcpy(vp + j * g.dvec, v.Row(b, h, first + j), g.D * 4);
    }
  }

  struct Scratch {
    std::vector<Word> qp;     // [kBlockRows][depth]
    std::vector<float> s;     // [kBlockRows][64] scores, then probabilities
    std::vector<uint32_t> p;  // bf16: [kBlockRows][32] probability pairs
    std::vector<float> o;     // [kBlockRows][dvec] value sums
    std::vector<float> m, l, alpha;
  };

  // Query rows [t0, t0 + rows) of head hq of sequence b.
  void Item(int64_t b, int64_t hq, int64_t t0, int64_t rows, Scratch& w) const {
    const int64_t depth = kBf16 ? g.dpairs : g.D;
    const int64_t tiles = (rows + kTileRows - 1) / kTileRows, padded = tiles * kTileRows;
    std::fill(w.qp.begin(), w.qp.begin() + padded * depth, Word{});
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = q.Row(b, hq, t0 + r);
      Word* dst = w.qp.data() + r * depth;
      if constexpr (kBf16) {
        for (int64_t p = 0; p < g.dpairs; ++p) dst[p] = Pair(row, 2 * p, g.D);
      } else {
        std::memcpy(dst, row, g.D * sizeof(float));
      }
    }
    std::fill(w.o.begin(), w.o.begin() + padded * g.dvec, 0.0f);
    std::fill(w.m.begin(), w.m.begin() + padded, kNegInf);
    std::fill(w.l.begin(), w.l.begin() + padded, 0.0f);
    std::fill(w.alpha.begin(), w.alpha.begin() + padded, 1.0f);

    const int64_t hk = hq / g.group, bh = b * g.Hkv + hk;
    const Word* kbase = keys.data() + bh * key_words;
    const Word* vbase = values.data() + bh * value_words;
    const int64_t first_pos = g.past + t0, last_pos = g.past + t0 + rows - 1;
    const int64_t lo = g.window > 0 ? std::max<int64_t>(0, first_pos - g.window + 1) : 0;
    for (int64_t kb = lo / kBlockKeys; kb <= last_pos / kBlockKeys; ++kb) {
      const int64_t key0 = kb * kBlockKeys;
      for (int64_t t = 0; t < tiles; ++t) {
        if constexpr (kBf16) {
          ScoreTileBf16(w.qp.data() + t * kTileRows * depth, depth,
                        kbase + kb * depth * kBlockKeys, w.s.data() + t * kTileRows * kBlockKeys);
        } else {
          ScoreTileF32(w.qp.data() + t * kTileRows * depth, depth,
                       kbase + kb * depth * kBlockKeys, w.s.data() + t * kTileRows * kBlockKeys);
        }
      }
      for (int64_t t = 0; t < tiles; ++t) {
        int64_t first[kTileRows], last[kTileRows];
        for (int64_t i = 0; i < kTileRows; ++i) {
          const int64_t r = t * kTileRows + i;
          const int64_t pos = g.past + t0 + r;
          const int64_t row_lo = g.window > 0 ? std::max<int64_t>(0, pos - g.window + 1) : 0;
          first[i] = std::clamp<int64_t>(row_lo - key0, 0, kBlockKeys);
          // Padding rows past the last query see no key: zeros, and their sums stay 0.
          last[i] = r < rows ? std::clamp<int64_t>(pos + 1 - key0, 0, kBlockKeys) : 0;
        }
        float* s = w.s.data() + t * kTileRows * kBlockKeys;
        SoftmaxTile(s, first, last, g.scale, &w.m[t * kTileRows], &w.l[t * kTileRows],
                    &w.alpha[t * kTileRows]);
        if constexpr (kBf16) RoundProbabilities(s, w.p.data() + t * kTileRows * kBlockPairs);
      }
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t r0 = t * kTileRows;
        for (int64_t col = 0; col < g.dvec; col += 4 * kLanes) {
          const int nc = static_cast<int>(std::min<int64_t>(4, (g.dvec - col) / kLanes));
          ValueTile(nc, w, r0, vbase + kb * (kBf16 ? kBlockPairs : kBlockKeys) * g.dvec, col);
        }
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      T* dst = out + ((b * g.T) + t0 + r) * g.Hq * g.D + hq * g.D;
      const float* o = w.o.data() + r * g.dvec;
      const float l = w.l[r];
      for (int64_t d = 0; d < g.D; ++d) dst[d] = static_cast<T>(o[d] / l);
    }
  }

  void ValueTile(int nc, Scratch& w, int64_t r0, const Word* vb, int64_t col) const {
    float* o = w.o.data() + r0 * g.dvec;
    const float* alpha = w.alpha.data() + r0;
    if constexpr (kBf16) {
      const uint32_t* p = w.p.data() + r0 * kBlockPairs;
      switch (nc) {
        case 1: return ValueTileBf16<1>(p, vb, g.dvec, alpha, o, col);
        case 2: return ValueTileBf16<2>(p, vb, g.dvec, alpha, o, col);
        case 3: return ValueTileBf16<3>(p, vb, g.dvec, alpha, o, col);
        default: return ValueTileBf16<4>(p, vb, g.dvec, alpha, o, col);
      }
    } else {
      const float* p = w.s.data() + r0 * kBlockKeys;
      switch (nc) {
        case 1: return ValueTileF32<1>(p, vb, g.dvec, alpha, o, col);
        case 2: return ValueTileF32<2>(p, vb, g.dvec, alpha, o, col);
        case 3: return ValueTileF32<3>(p, vb, g.dvec, alpha, o, col);
        default: return ValueTileF32<4>(p, vb, g.dvec, alpha, o, col);
      }
    }
  }

  void Run() {
    IntraOpForEach(g.B * g.Hkv * g.kblocks, [&](int64_t i) {
      PackBlock(i / (g.Hkv * g.kblocks), (i / g.kblocks) % g.Hkv, i % g.kblocks);
    });
    // The latest (costliest) query blocks first, every head of a block together: items are
    // handed out as threads become free, and no result depends on which thread ran it.
    const int64_t heads = g.B * g.Hq;
    IntraOpForEach(heads * g.qblocks, [&](int64_t i) {
      thread_local Scratch w;
      const int64_t depth = kBf16 ? g.dpairs : g.D;
      if (w.qp.size() < static_cast<size_t>(kBlockRows * depth)) w.qp.resize(kBlockRows * depth);
      if (w.o.size() < static_cast<size_t>(kBlockRows * g.dvec)) w.o.resize(kBlockRows * g.dvec);
      w.s.resize(kBlockRows * kBlockKeys);
      w.p.resize(kBlockRows * kBlockPairs);
      w.m.resize(kBlockRows);
      w.l.resize(kBlockRows);
      w.alpha.resize(kBlockRows);
      const int64_t qb = g.qblocks - 1 - i / heads, bh = i % heads;
      const int64_t t0 = qb * kBlockRows;
      Item(bh / g.Hq, bh % g.Hq, t0, std::min(kBlockRows, g.T - t0), w);
    });
  }
};

template <typename T>
Strided4<T> View(const at::Tensor& t) {
  return {t.data_ptr<T>(), t.stride(0), t.stride(1), t.stride(2)};
}

}  // namespace
#endif  // __x86_64__

std::string CpuFlashAttentionKernel(at::ScalarType dtype) {
#if defined(__x86_64__)
  if (dtype == at::kFloat && HasAvx512()) return "flash avx512-fp32";
  if (dtype == at::kBFloat16 && HasAvx512Bf16()) return "flash avx512-bf16";
#endif
  (void)dtype;
  return "";
}

bool UseCpuFlashAttention(const at::Tensor& q) {
  return q.device().is_cpu() && q.size(2) >= kMinFlashAttentionRows &&
         !CpuFlashAttentionKernel(q.scalar_type()).empty();
}

at::Tensor CpuFlashAttention(const at::Tensor& q_in, const at::Tensor& k_in,
                             const at::Tensor& v_in, int64_t past, int64_t window, double scale) {
  TORCH_CHECK(!CpuFlashAttentionKernel(q_in.scalar_type()).empty(),
              "no CPU flash attention kernel for ", q_in.scalar_type(), " on this machine");
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, "q, k, v must be 4-d");
  TORCH_CHECK(k_in.scalar_type() == q_in.scalar_type() && v_in.scalar_type() == q_in.scalar_type(),
              "q, k, v must share a dtype");
  // The kernels read rows through their strides; only the last dimension must be contiguous.
  auto rows = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
  const at::Tensor q = rows(q_in), k = rows(k_in), v = rows(v_in);
  Geometry g{};
  g.B = q.size(0);
  g.Hq = q.size(1);
  g.T = q.size(2);
  g.D = q.size(3);
  g.Hkv = k.size(1);
  g.S = k.size(2);
  g.past = past;
  g.window = window;
  g.scale = static_cast<float>(scale);
  TORCH_CHECK(k.size(0) == g.B && v.size(0) == g.B && v.size(1) == g.Hkv && v.size(2) == g.S &&
                  k.size(3) == g.D && v.size(3) == g.D,
              "k and v must be [B, Hkv, S, D] with q's B and D");
  TORCH_CHECK(g.Hkv > 0 && g.Hq % g.Hkv == 0, "query heads (", g.Hq,
              ") must be a multiple of kv heads (", g.Hkv, ")");
  TORCH_CHECK(g.S == past + g.T, "keys (", g.S, ") must be past (", past, ") + queries (", g.T,
              ")");
  at::Tensor out = at::empty({g.B, g.T, g.Hq * g.D}, q.options());
  if (g.T == 0) return out;
#if defined(__x86_64__)
  g.group = g.Hq / g.Hkv;
  g.kblocks = (g.S + kBlockKeys - 1) / kBlockKeys;
  g.dpairs = (g.D + 1) / 2;
  g.dvec = (g.D + kLanes - 1) / kLanes * kLanes;
  g.qblocks = (g.T + kBlockRows - 1) / kBlockRows;
  if (q.scalar_type() == at::kFloat) {
    Flash<float>(g, View<float>(q), View<float>(k), View<float>(v), out.data_ptr<float>()).Run();
  } else {
    Flash<at::BFloat16>(g, View<at::BFloat16>(q), View<at::BFloat16>(k), View<at::BFloat16>(v),
                        out.data_ptr<at::BFloat16>())
        .Run();
  }
#endif
  return out;
}

}  // namespace specwire
