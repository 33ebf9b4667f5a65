// The MoE gate's per-token and per-route code, compiled for the host (moe_gate.cpp) and the device
// (cuda/moe_gate.cu) from this one source, so the two reach the same routes (internal, not
// installed). Both files are built without floating-point contraction (-ffp-contract=off,
// --fmad=false): every sum and product here rounds as written on either side. What can still differ
// is the last bit of a double exp or log (the device's libraries are not glibc's), which moves a
// probability's fp32 value only where its double lies within 2^-52 of an fp32 rounding boundary.
#pragma once
#include <cfloat>
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define HPCT_GATE_FN __host__ __device__ inline
#else
#define HPCT_GATE_FN inline
#endif

namespace hpct::kernels::gate {

// splitmix64 and mix_seed, as core/rng.hpp's (there host-only).
HPCT_GATE_FN uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
HPCT_GATE_FN uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(mix(a) ^ b) ^ c); }

// Stream tags: the RTS and Gumbel draws of one seed are independent of each other.
constexpr uint64_t kRtsStream = 0x5254530000000000ull;     // "RTS"
constexpr uint64_t kGumbelStream = 0x47554d0000000000ull;  // "GUM", low bits = expert

// 53 random bits centred in their cell: strictly inside (0, 1), so log(u) and log(-log(u)) are finite.
HPCT_GATE_FN double open_unit(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }
HPCT_GATE_FN double rts_priority(uint64_t seed, int n) {
  return open_unit(mix3(seed, static_cast<uint64_t>(n), kRtsStream));
}
HPCT_GATE_FN double gumbel(uint64_t seed, int n, int e) {
  const double u = open_unit(mix3(seed, static_cast<uint64_t>(n), kGumbelStream | static_cast<uint32_t>(e)));
  return -::log(-::log(u));
}

/// The routing hash's term of route i (expert e, slot s; s = -1 dropped): summed, so any order.
HPCT_GATE_FN uint64_t route_hash(long long i, int e, int s) {
  return mix(static_cast<uint64_t>(i) << 32 ^ static_cast<uint64_t>(static_cast<uint32_t>(e)) << 16 ^
             static_cast<uint64_t>(static_cast<uint32_t>(s + 1)));
}

HPCT_GATE_FN float row_max(const float* x, int E) {
  float mx = x[0];  // std::max_element's choice: the first of the largest
  for (int e = 1; e < E; ++e)
    if (mx < x[e]) mx = x[e];
  return mx;
}

struct Choice {
  int e1 = 0, e2 = -1;  // first and (top-2) second expert
  double lse = 0;       // logsumexp of the row (the z loss's term)
};

/// Token n: p (E) = softmax(x), in double from the fp32 differences to the row's maximum; its
/// expert(s). First: argmax p (rsample: argmax x + Gumbel); second (top-2): argmax over the others
/// of x (+ Gumbel when sample2). Ties go to the lowest index; a NaN never wins.
HPCT_GATE_FN Choice select_token(const float* x, float* p, int E, int k, bool rsample, bool sample2, uint64_t seed,
                                 int n) {
  const float mx = row_max(x, E);
  double sum = 0;
  for (int e = 0; e < E; ++e) sum += ::exp(static_cast<double>(x[e] - mx));
  for (int e = 0; e < E; ++e) p[e] = static_cast<float>(::exp(static_cast<double>(x[e] - mx)) / sum);
  Choice c;
  c.lse = mx + ::log(sum);
  int best = -1;
  double best_v = 0;
  for (int e = 0; e < E; ++e) {
    const double v = rsample ? double(x[e]) + gumbel(seed, n, e) : double(p[e]);
    if (best < 0 || v > best_v) best = e, best_v = v;
  }
  c.e1 = best;
  if (k == 2) {  // DeepSpeed takes the 2nd choice on the logits (plus noise), not on the probs
    best = -1;
    for (int e = 0; e < E; ++e) {
      if (e == c.e1) continue;
      const double v = double(x[e]) + (sample2 ? gumbel(seed, n, e) : 0.0);
      if (best < 0 || v > best_v) best = e, best_v = v;
    }
    c.e2 = best;
  }
  return c;
}

/// Top-2 combine weights of token n from its two kept masks: w_j = p_j m_j / max(p_1 m_1 + p_2 m_2,
/// FLT_EPSILON) (DeepSpeed's clamp at fp32's eps).
HPCT_GATE_FN void top2_weights(float p1, float p2, bool m1, bool m2, float* w) {
  const float a = m1 ? p1 : 0.f, b = m2 ? p2 : 0.f, s = a + b;
  const float den = s < FLT_EPSILON ? FLT_EPSILON : s;
  w[0] = a / den;
  w[1] = b / den;
}

/// Tokens m in [m0, m1) of expert e ahead of token n in RTS order (priority higher, or equal and m < n).
HPCT_GATE_FN int rts_ahead(const int32_t* expert, const double* prio, int m0, int m1, int e, double pn, int n) {
  int c = 0;
  for (int m = m0; m < m1; ++m) c += expert[m] == e && (prio[m] > pn || (prio[m] == pn && m < n));
  return c;
}
/// Routes m < n (in [m0, n)) whose key[m * stride] is e and, with keep, that keep[m] marks.
HPCT_GATE_FN int count_before(const int32_t* key, int stride, const int32_t* keep, int m0, int n, int e) {
  int c = 0;
  for (int m = m0; m < n; ++m) c += key[static_cast<long long>(m) * stride] == e && (!keep || keep[m]);
  return c;
}

/// Token n's d(loss)/d(logits) (E), as route_backward documents: dw (k) the combine weights'
/// gradients, ex / sl / w (k) its routes, first (E) the first choices per expert over the N tokens.
HPCT_GATE_FN void token_backward(float* dl, const float* p, const float* x, const float* dw, const int32_t* ex,
                                 const int32_t* sl, const float* w, const int64_t* first, int N, int E, int k,
                                 float aux_coeff, float z_coeff) {
  // The routes' own terms: top-1 weight = p[e1]; top-2 w_j = p_j m_j / S, S = p_1 m_1 + p_2 m_2
  // (clamped at eps, where the clamp passes no gradient): dL/dp_j = m_j (dw_j - sum_i dw_i w_i) / S.
  double add[2] = {0.0, 0.0};
  if (k == 1) {
    add[0] = dw[0];
  } else {
    const float p1 = sl[0] >= 0 ? p[ex[0]] : 0.f, p2 = sl[1] >= 0 ? p[ex[1]] : 0.f;
    const float s = p1 + p2;
    const double g = s >= FLT_EPSILON ? double(dw[0]) * w[0] + double(dw[1]) * w[1] : 0.0;
    const double den = s < FLT_EPSILON ? FLT_EPSILON : s;
    for (int j = 0; j < 2; ++j) add[j] = (dw[j] - g) / den;
  }
  // aux = E * sum_e ce[e] * mean_n p[n, e], ce[e] = first[e] / N a constant (as DeepSpeed).
  auto dp = [&](int e) {
    double v = static_cast<double>(aux_coeff) * E * (static_cast<double>(first[e]) / N) / N;
    for (int j = 0; j < k; ++j)
      if (sl[j] >= 0 && ex[j] == e) v += add[j];
    return v;
  };
  // Softmax backward, plus z = mean_n lse_n^2 whose gradient is (2/N) lse_n p[n, e].
  double dot = 0;
  for (int e = 0; e < E; ++e) dot += p[e] * dp(e);
  const float mx = row_max(x, E);
  double sum = 0;  // select_token's sum, so the gradient's logsumexp is the z loss's own
  for (int e = 0; e < E; ++e) sum += ::exp(static_cast<double>(x[e] - mx));
  const double zg = static_cast<double>(z_coeff) * 2.0 / N * (mx + ::log(sum));
  for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dp(e) - dot + zg));
}

}  // namespace hpct::kernels::gate
