#include "common/models/gated_delta_rule.h"

#include <algorithm>
#include <cmath>

namespace specwire {
namespace {

// transformers' l2norm (the FLA convention): x * rsqrt(Σx² + eps), not x / max(‖x‖, eps).
at::Tensor L2Norm(const at::Tensor& x) {
  return x * at::rsqrt((x * x).sum(-1, /*keepdim=*/true) + 1e-6);
}
at::Tensor& L2Normalize_(at::Tensor& x) {  // in place, same values
  return x.mul_(at::rsqrt((x * x).sum(-1, /*keepdim=*/true) + 1e-6));
}

// The chunked kernel's working layout: x [B, T, h, d] (any strides and dtype) → fp32
// [B, N, h, C, d], chunk-major, zero past T (the reference's zero padding). A block of chunks is
// then one contiguous slab (no copies when matmul flattens its batch dimensions) and each chunk's
// [B, h, C, d] slice is contiguous for the sequential phase.
at::Tensor ChunkMajor(const at::Tensor& x, int64_t C, int64_t N) {
  const int64_t B = x.size(0), T = x.size(1), h = x.size(2), d = x.size(3);
  at::Tensor out = at::empty({B, N, h, C, d}, x.options().dtype(at::kFloat));
  const int64_t full = T / C, rest = T - full * C;
  if (full > 0) {
    out.narrow(1, 0, full)
        .permute({0, 1, 3, 2, 4})
        .copy_(x.narrow(1, 0, full * C).reshape({B, full, C, h, d}));
  }
  if (rest > 0) {
    at::Tensor tail = out.select(1, full);  // [B, h, C, d]
    tail.narrow(2, rest, C - rest).zero_();
    tail.narrow(2, 0, rest).copy_(x.narrow(1, full * C, rest).transpose(1, 2));
  }
  return out;
}

// The reference kernels' shared prologue, as the recurrent kernel uses it (the chunked one does the
// same per row in its own layout): grouped value attention (key heads repeated to the value
// heads), heads-major fp32 layout, L2-normalised q and k. q is not yet scaled (the two reference
// kernels scale it differently: chunked multiplies by dk^-1/2, recurrent divides by dk^1/2, and
// the roundings differ).
struct DeltaRuleInputs {
  at::Tensor q, k, v;  // [B, nv, T, dk|dv] fp32
  at::Tensor g, beta;  // [B, nv, T] fp32
};
DeltaRuleInputs DeltaRulePrologue(at::Tensor q, at::Tensor k, const at::Tensor& v,
                                  const at::Tensor& g, const at::Tensor& beta) {
  const int64_t nk = k.size(2), nv = v.size(2);
  TORCH_CHECK(nv % nk == 0, "value heads ", nv, " are not a multiple of key heads ", nk);
  if (nk != nv) {
    q = q.repeat_interleave(nv / nk, 2);  // value head j reads key head j / (nv / nk)
    k = k.repeat_interleave(nv / nk, 2);
  }
  auto heads_major = [](const at::Tensor& x) {
    return x.transpose(1, 2).to(at::kFloat).contiguous();
  };
  return {L2Norm(heads_major(q)), L2Norm(heads_major(k)), heads_major(v), heads_major(g),
          heads_major(beta)};
}


// Chunks processed together in the intra-chunk phase of the chunked kernel: bounds its
// [.., chunks, C, C] temporaries (16 × 64 × 64 fp32 = 256 KiB per head and row).
constexpr int64_t kChunksPerBlock = 16;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Delta-rule kernels

DeltaRuleResult GatedDeltaRuleChunked(const at::Tensor& q_in, const at::Tensor& k_in,
                                      const at::Tensor& v_in, const at::Tensor& g_in,
                                      const at::Tensor& beta_in, const at::Tensor& initial_state,
                                      int64_t C) {
  const at::ScalarType out_dtype = q_in.scalar_type();
  const int64_t B = v_in.size(0), T = v_in.size(1), H = v_in.size(2), nk = k_in.size(2),
                dk = k_in.size(3), dv = v_in.size(3);
  TORCH_CHECK(H % nk == 0, "value heads ", H, " are not a multiple of key heads ", nk);
  // The reference's prologue (repeat key heads, fp32 heads-major, L2-normalise, scale q, zero-pad T
  // to a multiple of C) in the chunk-major layout [B, N, heads, C, d]. q and k are normalised and
  // scaled per key head, then repeated: the same per-row arithmetic on half the rows. Zero padding
  // stays zero through both (0 · rsqrt(0 + eps)). A padded tail only follows real tokens, so it
  // cannot reach them (and with k = 0 it leaves the state untouched).
  const int64_t N = (T + C - 1) / C;  // chunks
  auto repeat_heads = [&](const at::Tensor& x) {  // [B, N, nk, C, d] → [B, N, H, C, d]
    if (nk == H) return x;
    const int64_t d = x.size(-1);
    // value head j reads key head j / (H / nk), as repeat_interleave. With one key head the
    // reshape would be a stride-0 view of that head, which the in-place products below must not
    // write through: always a copy.
    return x.unsqueeze(3).expand({B, N, nk, H / nk, C, d}).reshape({B, N, H, C, d}).contiguous();
  };
  // (Products are taken in place where an operand is a dead temporary: same values, fewer fresh
  // buffers for the allocator to fault in.)
  at::Tensor q = ChunkMajor(q_in, C, N);
  q = repeat_heads(L2Normalize_(q).mul_(std::pow(static_cast<double>(dk), -0.5)));  // [B,N,H,C,dk]
  at::Tensor k = ChunkMajor(k_in, C, N);
  k = repeat_heads(L2Normalize_(k));
  at::Tensor g = ChunkMajor(g_in.unsqueeze(-1), C, N).squeeze(-1);  // [B, N, H, C]
  at::Tensor beta = ChunkMajor(beta_in.unsqueeze(-1), C, N);        // [B, N, H, C, 1]
  // β is the per-token write strength of the delta rule.
  at::Tensor v_beta = ChunkMajor(v_in, C, N).mul_(beta);  // [B, N, H, C, dv]
  at::Tensor k_beta = k * beta;

  const auto opts = v_beta.options();
  at::Tensor strictly_upper =
      at::ones({C, C}, opts.dtype(at::kBool)).triu(1);  // what a position may not see
  at::Tensor S = initial_state.defined()
                     ? initial_state.to(opts, /*non_blocking=*/false, /*copy=*/true)
                     : at::zeros({B, H, dk, dv}, opts);  // [B, H, dk, dv], updated in place
  at::Tensor out = at::empty({B, N, H, C, dv}, opts);

  for (int64_t n0 = 0; n0 < N; n0 += kChunksPerBlock) {
    const int64_t nb = std::min(kChunksPerBlock, N - n0);
    at::Tensor qc = q.narrow(1, n0, nb), kc = k.narrow(1, n0, nb);  // [B, nb, H, C, dk]
    at::Tensor kbc = k_beta.narrow(1, n0, nb), vbc = v_beta.narrow(1, n0, nb);

    // --- intra-chunk phase (all chunks of the block at once) ---
    at::Tensor G = g.narrow(1, n0, nb).cumsum(-1);  // [B, nb, H, C] log decay since chunk start
    // D[i, j] = exp(G_i − G_j) for j <= i, 0 above the diagonal (masked to −inf before exp).
    at::Tensor D = G.unsqueeze(-1) - G.unsqueeze(-2);  // [B, nb, H, C, C]
    D.masked_fill_(strictly_upper, -std::numeric_limits<float>::infinity()).exp_();
    at::Tensor A = at::matmul(kbc, kc.transpose(-1, -2)).mul_(D);   // the UT system, unit-lower
    at::Tensor Aqk = at::matmul(qc, kc.transpose(-1, -2)).mul_(D);  // intra-chunk attention
    at::Tensor G_exp = G.exp().unsqueeze(-1);                       // [B, nb, H, C, 1]
    at::Tensor kb_decayed = kbc * G_exp;                            // [B, nb, H, C, dk]
    // (I + strictly_lower(A)) U = β v and W likewise for the decayed keys: the chunk's delta-rule
    // updates in closed form. Same solver as the reference (not forward substitution).
    at::Tensor U = at::linalg_solve_triangular(A, vbc, /*upper=*/false, /*left=*/true,
                                               /*unitriangular=*/true);  // [B, nb, H, C, dv]
    at::Tensor W = at::linalg_solve_triangular(A, kb_decayed, false, true, true);  // [.., C, dk]
    // q and k are dead past this block once decayed: in place.
    at::Tensor q_decayed = qc.mul_(G_exp);                                          // reads S
    at::Tensor k_decayed = kc.mul_((G.narrow(-1, C - 1, 1) - G).exp().unsqueeze(-1));  // writes S
    at::Tensor chunk_decay =
        G.select(-1, C - 1).exp().unsqueeze(-1).unsqueeze(-1);  // [B, nb, H, 1, 1]

    // --- inter-chunk phase: the state is carried chunk to chunk ---
    for (int64_t i = 0; i < nb; ++i) {
      at::Tensor v_new = at::matmul(W.select(1, i), S);  // [B, H, C, dv]
      at::sub_out(v_new, U.select(1, i), v_new);         // U − W S
      at::Tensor inter = at::matmul(q_decayed.select(1, i), S);
      at::Tensor out_i = out.select(1, n0 + i);  // [B, H, C, dv], contiguous
      at::add_out(out_i, inter, at::matmul(Aqk.select(1, i), v_new));
      S.mul_(chunk_decay.select(1, i))
          .add_(at::matmul(k_decayed.select(1, i).transpose(-1, -2), v_new));
    }
  }
  // [B, N, H, C, dv] -> [B, T, H, dv] in the input dtype (full chunks, then the partial one).
  at::Tensor o = at::empty({B, T, H, dv}, opts.dtype(out_dtype));
  const int64_t full = T / C, rest = T - full * C;
  if (full > 0) {
    o.narrow(1, 0, full * C)
        .view({B, full, C, H, dv})
        .copy_(out.narrow(1, 0, full).permute({0, 1, 3, 2, 4}));
  }
  if (rest > 0) {
    o.narrow(1, full * C, rest).copy_(out.select(1, full).narrow(2, 0, rest).transpose(1, 2));
  }
  return {o, S};
}

DeltaRuleResult GatedDeltaRuleRecurrent(const at::Tensor& q_in, const at::Tensor& k_in,
                                        const at::Tensor& v_in, const at::Tensor& g_in,
                                        const at::Tensor& beta_in,
                                        const at::Tensor& initial_state) {
  const at::ScalarType out_dtype = q_in.scalar_type();
  const int64_t B = v_in.size(0), T = v_in.size(1), H = v_in.size(2), dk = k_in.size(3),
                dv = v_in.size(3);
  auto [q, k, v, g, beta] = DeltaRulePrologue(q_in, k_in, v_in, g_in, beta_in);
  q = q / std::pow(static_cast<double>(dk), 0.5);  // the reference divides here

  at::Tensor S = initial_state.defined() ? initial_state.to(v.options())
                                         : at::zeros({B, H, dk, dv}, v.options());
  at::Tensor out = at::empty({B, H, T, dv}, v.options());
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor q_t = q.select(2, t), k_t = k.select(2, t), v_t = v.select(2, t);  // [B, H, d]
    S = S * g.select(2, t).exp().unsqueeze(-1).unsqueeze(-1);
    // Element-wise products and sums (not matmul) as in the reference, for the same rounding.
    at::Tensor kv_mem = (S * k_t.unsqueeze(-1)).sum(-2);  // Sᵀk [B, H, dv]
    at::Tensor delta = (v_t - kv_mem) * beta.select(2, t).unsqueeze(-1);
    S = S + k_t.unsqueeze(-1) * delta.unsqueeze(-2);          // S += k ⊗ δ
    out.select(2, t).copy_((S * q_t.unsqueeze(-1)).sum(-2));  // Sᵀq
  }
  return {out.transpose(1, 2).contiguous().to(out_dtype), S};
}

}  // namespace specwire
