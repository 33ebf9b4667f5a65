// CPU forward/backward of the GPT-2 ops (see ops.hpp for the contract: backward accumulates).
//
// What it is: element-wise and per-row loops as Kokkos parallel patterns on the host execution
// space, matrix work through gemm(). What it is not: a second GEMM; attention is GEMMs plus a
// row softmax, never a triple loop.
// Trade-offs:
// - Loops run over chunks (element ranges or row blocks) whose bodies are `omp simd` loops: on one
//   core per rank (Kokkos Serial) the SIMD width is the parallelism that pays, and glibc's expf and
//   tanhf do not vectorize without -ffast-math, so exp_simd() below is a branch-free polynomial.
// - Reductions across rows (dweight, dbias of layernorm and matmul, dwte) never use atomics: each
//   chunk of rows writes its own partial sum, summed afterwards in a fixed order, so results are
//   race-free on any Kokkos backend and bitwise reproducible for a given shape.
// - Causal attention computes Q K^T in blocks of kAttnBlock query rows against only the keys they
//   can see: (1 + 1/blocks)/2 of the full T x T product instead of all of it (T=1024: 56%).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hpct/core/error.hpp"
#include "hpct/kernels/ops.hpp"
#include "bits.hpp"
#include "cpu_loops.hpp"

namespace hpct::kernels {
namespace {

constexpr int kRowsPerPartial = 64; // rows summed into one partial of a column reduction
constexpr int kAttnBlock = 128;     // query rows per causal attention block
constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

using detail::bits_as;
using detail::for_chunks;
using detail::kChunk;
using detail::Policy;
using detail::require;
using detail::require_backend;

// e^x to 1.5 ulp for x in [-87, 88], 0 below, saturating at e^88 above; NaN stays NaN. Cephes'
// expf: x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for e^r, 2^n built in the exponent
// bits. Branch-free, and n is rounded with the 1.5 * 2^23 shifter rather than std::floor, which
// GCC does not vectorize without -fno-trapping-math: loops calling it become SIMD loops.
inline float exp_simd(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float shifted = xc * 1.44269504088896341f + kShifter;
  const float n = shifted - kShifter;
  const int32_t ni = bits_as<int32_t>(shifted) - bits_as<int32_t>(kShifter);
  float r = xc - n * 0.693359375f;  // ln2 split in two so n * ln2 is exact in the first part
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float two_n = bits_as<float>((ni + 127) << 23);
  const float y = x < -87.0f ? 0.0f : two_n * er;
  return x != x ? x : y;
}

// max(x[0..n)), NaN entries ignored. Written as `mx > x ? mx : x`, the one spelling that GCC 12
// turns into a vmaxps reduction without -ffast-math (std::max and the other order stay scalar).
inline float row_max(const float* x, int n) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (int j = 0; j < n; ++j) mx = mx > x[j] ? mx : x[j];
  return mx;
}

// dst (C) += sum over chunks of partials (chunks, C), one SIMD pass per chunk row, fixed order.
void add_partials(float* dst, const float* partials, int chunks, int C, size_t partial_stride) {
  for_chunks("add_partials", (size_t)C, [=](size_t lo, size_t hi) {
    for (int ch = 0; ch < chunks; ++ch) {
      const float* p = partials + ch * partial_stride;
#pragma omp simd
      for (size_t c = lo; c < hi; ++c) dst[c] += p[c];
    }
  });
}

// Scratch that grows to the largest request and is reused (no allocation per call in training).
float* scratch(std::vector<float>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// Row-wise causal softmax of rows r0 .. r0+rows-1 of the (T, T) matrix P, in place: row t keeps
// columns lo..t and zeroes the rest (the att buffer promises zeros outside them), lo = start[t]
// (its document's first position) or 0 without start.
void causal_softmax_rows(float* P /*(T,T)*/, int T, int r0, int rows, const int32_t* start /*(T) or null*/) {
  Kokkos::parallel_for("attention_softmax", Policy(0, rows), KOKKOS_LAMBDA(int i) {
    const int t = r0 + i;
    const int lo = start ? start[t] : 0;
    float* row = P + (size_t)t * T;
    const float mx = row_max(row + lo, t + 1 - lo);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j <= t; ++j) {
      const float e = exp_simd(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int j = lo; j <= t; ++j) row[j] *= inv;
    std::fill(row, row + lo, 0.0f);
    std::fill(row + t + 1, row + T, 0.0f);
  });
}

// D = the block's probabilities (rows r0.., keys columns of the (T, T) P) with attention dropout:
// kept ones times 1/(1-p), dropped ones 0, the upper triangle 0; (rows, keys) row-major.
void dropped_probs(float* D, const float* Pblock, int T, int b, int h, int r0, int rows, int keys, const Dropout& d) {
  const uint32_t thr = d.threshold();
  const float s = d.scale();
  Kokkos::parallel_for("attention_dropout", Policy(0, rows), KOKKOS_LAMBDA(int i) {
    const int t = r0 + i;
    const uint64_t key = dropout_row_key(d.key, d.first_sample + b, dropout_attention_code(d.head0 + h, t));
    const float* pr = Pblock + (size_t)i * T;
    float* dr = D + (size_t)i * keys;
#pragma omp simd
    for (int j = 0; j <= t; ++j) dr[j] = dropout_keep(key, (uint64_t)j, thr) ? pr[j] * s : 0.0f;
    std::fill(dr + t + 1, dr + keys, 0.0f);
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// encoder

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     const int32_t* pos) {
  require_backend("encoder_forward");
  require(B >= 0 && T >= 0 && C >= 0, "encoder_forward", "negative size");
  const size_t BT = (size_t)B * T;
  for (size_t i = 0; i < BT; ++i) {
    require(tokens[i] >= 0, "encoder_forward", "token id " + std::to_string(tokens[i]) + " at " + std::to_string(i));
    if (pos) require(pos[i] >= 0, "encoder_forward", "position " + std::to_string(pos[i]) + " at " + std::to_string(i));
  }
  Kokkos::parallel_for("encoder_forward", Policy(0, BT), KOKKOS_LAMBDA(size_t bt) {
    const float* e = wte + (size_t)tokens[bt] * C;             // (C)
    float* o = out + bt * C;                       // (C)
    if (!wpe) {  // no learned positions (rotary ones are applied in attention)
      std::copy(e, e + C, o);
      return;
    }
    const float* p = wpe + (pos ? pos[bt] : bt % T) * C;       // (C)
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = e[c] + p[c];
  });
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                      const int32_t* pos) {
  require_backend("encoder_backward");
  require(B >= 0 && T >= 0 && C >= 0, "encoder_backward", "negative size");
  const size_t BT = (size_t)B * T;
  for (size_t i = 0; i < BT; ++i) {
    require(tokens[i] >= 0, "encoder_backward", "token id " + std::to_string(tokens[i]) + " at " + std::to_string(i));
    if (pos) require(pos[i] >= 0, "encoder_backward", "position " + std::to_string(pos[i]) + " at " + std::to_string(i));
  }
  constexpr int kCols = 256;
  const int blocks = (C + kCols - 1) / kCols;
  if (!dwpe) pos = nullptr;  // no position table: the word embedding's gradient only
  if (!pos && dwpe) {
    // dwpe: position t collects its B rows, positions are independent.
    Kokkos::parallel_for("encoder_backward_wpe", Policy(0, T), KOKKOS_LAMBDA(int t) {
      float* dp = dwpe + (size_t)t * C;  // (C)
      for (int b = 0; b < B; ++b) {
        const float* d = dout + ((size_t)b * T + t) * C;
#pragma omp simd
        for (int c = 0; c < C; ++c) dp[c] += d[c];
      }
    });
  }
  // dwte (and dwpe with given positions): indices repeat, so rows collide; split the columns instead
  // (each block owns its columns of every row) and keep the token order inside a block: no atomics,
  // deterministic.
  if (!dwte && !pos) return;
  Kokkos::parallel_for("encoder_backward_wte", Policy(0, blocks), KOKKOS_LAMBDA(int blk) {
    const int lo = blk * kCols, hi = std::min(C, lo + kCols);
    for (size_t bt = 0; bt < BT; ++bt) {
      const float* d = dout + bt * C;
      if (dwte) {
        float* e = dwte + (size_t)tokens[bt] * C;
#pragma omp simd
        for (int c = lo; c < hi; ++c) e[c] += d[c];
      }
      if (!pos) continue;
      float* dp = dwpe + (size_t)pos[bt] * C;
#pragma omp simd
      for (int c = lo; c < hi; ++c) dp[c] += d[c];
    }
  });
}

// ---------------------------------------------------------------------------------------------
// layernorm

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C) {
  require_backend("layernorm_forward");
  require(N >= 0 && C > 0, "layernorm_forward", "need N >= 0 and C > 0");
  Kokkos::parallel_for("layernorm_forward", Policy(0, N), KOKKOS_LAMBDA(int i) {
    const float* x = inp + (size_t)i * C;  // (C)
    float* o = out + (size_t)i * C;        // (C)
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = s / C;
    float v = 0.0f;  // two passes: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      v += d * d;
    }
    const float rs = 1.0f / std::sqrt(v / C + kLayerNormEps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    mean[i] = m;
    rstd[i] = rs;
  });
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  require_backend("layernorm_backward");
  require(N >= 0 && C > 0, "layernorm_backward", "need N >= 0 and C > 0");
  if (N == 0) return;
  // One pass over the rows: dinp row by row, dweight/dbias into per-chunk partials
  // (chunks, 2, C), summed afterwards.
  const int chunks = (N + kRowsPerPartial - 1) / kRowsPerPartial;
  thread_local std::vector<float> partial_buf;
  float* partials = scratch(partial_buf, (size_t)chunks * 2 * C);  // (chunks, 2, C)
  Kokkos::parallel_for("layernorm_backward", Policy(0, chunks), KOKKOS_LAMBDA(int ch) {
    float* pw = partials + (size_t)ch * 2 * C;  // (C) partial dweight
    float* pb = pw + C;                         // (C) partial dbias
    std::fill(pw, pw + 2 * C, 0.0f);
    const int i1 = std::min(N, (ch + 1) * kRowsPerPartial);
    for (int i = ch * kRowsPerPartial; i < i1; ++i) {
      const float* d = dout + (size_t)i * C;  // (C)
      const float* x = inp + (size_t)i * C;   // (C)
      float* dx = dinp + (size_t)i * C;       // (C)
      const float m = mean[i], rs = rstd[i];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; ++c) {
        const float n = (x[c] - m) * rs;
        const float dn = weight[c] * d[c];
        dnorm_mean += dn;
        dnorm_norm_mean += dn * n;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float n = (x[c] - m) * rs;
        const float dn = weight[c] * d[c];
        pb[c] += d[c];
        pw[c] += n * d[c];
        dx[c] += (dn - dnorm_mean - n * dnorm_norm_mean) * rs;
      }
    }
  });
  add_partials(dweight, partials, chunks, C, 2 * (size_t)C);
  add_partials(dbias, partials + C, chunks, C, 2 * (size_t)C);
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C) {
  require_backend("rmsnorm_forward");
  require(N >= 0 && C > 0, "rmsnorm_forward", "need N >= 0 and C > 0");
  Kokkos::parallel_for("rmsnorm_forward", Policy(0, N), KOKKOS_LAMBDA(int i) {
    const float* x = inp + (size_t)i * C;  // (C)
    float* o = out + (size_t)i * C;        // (C)
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) v += x[c] * x[c];
    const float rs = 1.0f / std::sqrt(v / C + kLayerNormEps);
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = x[c] * rs * weight[c];
    rstd[i] = rs;
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C) {
  require_backend("rmsnorm_backward");
  require(N >= 0 && C > 0, "rmsnorm_backward", "need N >= 0 and C > 0");
  if (N == 0) return;
  // As layernorm_backward: dinp row by row, dweight into per-chunk partials summed afterwards.
  const int chunks = (N + kRowsPerPartial - 1) / kRowsPerPartial;
  thread_local std::vector<float> partial_buf;
  float* partials = scratch(partial_buf, (size_t)chunks * C);  // (chunks, C)
  Kokkos::parallel_for("rmsnorm_backward", Policy(0, chunks), KOKKOS_LAMBDA(int ch) {
    float* pw = partials + (size_t)ch * C;  // (C) partial dweight
    std::fill(pw, pw + C, 0.0f);
    const int i1 = std::min(N, (ch + 1) * kRowsPerPartial);
    for (int i = ch * kRowsPerPartial; i < i1; ++i) {
      const float* d = dout + (size_t)i * C;  // (C)
      const float* x = inp + (size_t)i * C;   // (C)
      float* dx = dinp + (size_t)i * C;       // (C)
      const float rs = rstd[i];
      float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_mean)
      for (int c = 0; c < C; ++c) dnorm_norm_mean += weight[c] * d[c] * x[c] * rs;
      dnorm_norm_mean /= C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float n = x[c] * rs;
        pw[c] += n * d[c];
        dx[c] += (weight[c] * d[c] - n * dnorm_norm_mean) * rs;
      }
    }
  });
  add_partials(dweight, partials, chunks, C, (size_t)C);
}

// ---------------------------------------------------------------------------------------------
// matmul (nn.Linear)

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    Precision p) {
  require_backend("matmul_forward");
  require(N >= 0 && C >= 0 && OC >= 0, "matmul_forward", "negative size");
  if (N == 0 || OC == 0) return;
  if (bias) {
    // Start from the bias and let the GEMM accumulate (beta = 1): one pass over out instead of
    // the GEMM's zeroing pass plus a bias pass.
    Kokkos::parallel_for("matmul_bias", Policy(0, N), KOKKOS_LAMBDA(int i) {
      std::copy(bias, bias + OC, out + (size_t)i * OC);
    });
  }
  gemm(false, true, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC, p);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Precision p) {
  require_backend("matmul_backward");
  require(N >= 0 && C >= 0 && OC >= 0, "matmul_backward", "negative size");
  if (N == 0) return;
  if (dinp) gemm(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C, p);  // dinp += dout W
  if (dweight) gemm(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, p);  // dW += dout^T inp
  if (dbias && OC > 0) {
    // Column sums of dout in fp32 whatever the GEMM precision (the bias gradient is cheap and
    // small biases are sensitive to rounding).
    const int chunks = (N + kRowsPerPartial - 1) / kRowsPerPartial;
    thread_local std::vector<float> partial_buf;
    float* partials = scratch(partial_buf, (size_t)chunks * OC);  // (chunks, OC)
    Kokkos::parallel_for("matmul_backward_bias", Policy(0, chunks), KOKKOS_LAMBDA(int ch) {
      float* pb = partials + (size_t)ch * OC;
      std::fill(pb, pb + OC, 0.0f);
      const int i1 = std::min(N, (ch + 1) * kRowsPerPartial);
      for (int i = ch * kRowsPerPartial; i < i1; ++i) {
        const float* d = dout + (size_t)i * OC;
#pragma omp simd
        for (int j = 0; j < OC; ++j) pb[j] += d[j];
      }
    });
    add_partials(dbias, partials, chunks, OC, OC);
  }
}

// ---------------------------------------------------------------------------------------------
// attention

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, Precision p,
                       const Dropout* drop, const int32_t* key_start) {
  require_backend("attention_forward");
  require(B >= 0 && T >= 0 && C > 0 && NH > 0 && C % NH == 0, "attention_forward",
          "need C > 0 divisible by NH > 0 (C=" + std::to_string(C) + ", NH=" + std::to_string(NH) + ")");
  if (key_start)
    for (size_t i = 0; i < (size_t)B * T; ++i)
      require(key_start[i] >= 0 && key_start[i] <= (int)(i % T), "attention_forward",
              "key_start " + std::to_string(key_start[i]) + " at row " + std::to_string(i) + " is not in [0, t]");
  const int HS = C / NH;
  const int C3 = 3 * C;
  const float sc = 1.0f / std::sqrt((float)HS);
  const bool dropping = drop && drop->on();
  thread_local std::vector<float> pd_buf;
  float* Pd = dropping ? scratch(pd_buf, (size_t)std::min(T, kAttnBlock) * T) : nullptr;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + (size_t)b * T * C3 + h * HS;  // (T, HS), row stride 3C
      const float* k = q + C;                              // (T, HS), row stride 3C
      const float* v = q + 2 * C;                          // (T, HS), row stride 3C
      float* P = att + ((size_t)b * NH + h) * T * T;       // (T, T)
      float* o = out + (size_t)b * T * C + h * HS;         // (T, HS), row stride C
      for (int r0 = 0; r0 < T; r0 += kAttnBlock) {
        const int rows = std::min(kAttnBlock, T - r0), keys = r0 + rows;  // rows r0.. see keys 0..keys-1
        gemm(false, true, rows, keys, HS, sc, q + (size_t)r0 * C3, C3, k, C3, 0.0f, P + (size_t)r0 * T, T, p);
        causal_softmax_rows(P, T, r0, rows, key_start ? key_start + (size_t)b * T : nullptr);
        if (dropping) {  // the values mix the dropped probabilities; att keeps the softmax for backward
          dropped_probs(Pd, P + (size_t)r0 * T, T, b, h, r0, rows, keys, *drop);
          gemm(false, false, rows, HS, keys, 1.0f, Pd, keys, v, C3, 0.0f, o + (size_t)r0 * C, C, p);
        } else {
          gemm(false, false, rows, HS, keys, 1.0f, P + (size_t)r0 * T, T, v, C3, 0.0f, o + (size_t)r0 * C, C, p);
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        Precision p, const Dropout* drop) {
  require_backend("attention_backward");
  require(B >= 0 && T >= 0 && C > 0 && NH > 0 && C % NH == 0, "attention_backward",
          "need C > 0 divisible by NH > 0 (C=" + std::to_string(C) + ", NH=" + std::to_string(NH) + ")");
  const int HS = C / NH;
  const int C3 = 3 * C;
  const float sc = 1.0f / std::sqrt((float)HS);
  thread_local std::vector<float> ds_buf;
  float* dS = scratch(ds_buf, (size_t)std::min(T, kAttnBlock) * T);  // (rows, keys) of one block
  const bool dropping = drop && drop->on();
  thread_local std::vector<float> pd_buf;
  float* Pd = dropping ? scratch(pd_buf, (size_t)std::min(T, kAttnBlock) * T) : nullptr;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const size_t base = (size_t)b * T * C3 + h * HS;
      const float* q = qkv + base;  // (T, HS), row stride 3C; likewise k, v, dq, dk, dv
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + base;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* P = att + ((size_t)b * NH + h) * T * T;  // (T, T)
      const float* dO = dout + (size_t)b * T * C + h * HS;  // (T, HS), row stride C
      for (int r0 = 0; r0 < T; r0 += kAttnBlock) {
        const int rows = std::min(kAttnBlock, T - r0), keys = r0 + rows;
        const float* Pb = P + (size_t)r0 * T;  // (rows, keys), row stride T
        const float* dOb = dO + (size_t)r0 * C;
        gemm(false, true, rows, keys, HS, 1.0f, dOb, C, v, C3, 0.0f, dS, keys, p);  // dP = dO V^T
        if (dropping) {
          // With dropout the values saw D = P * m (m: mask / (1 - p)): dV += D^T dO, and the
          // softmax backward of dD becomes dS = D * dD - P * rowsum(D * dD).
          dropped_probs(Pd, Pb, T, b, h, r0, rows, keys, *drop);
          gemm(true, false, keys, HS, rows, 1.0f, Pd, keys, dOb, C, 1.0f, dv, C3, p);
          Kokkos::parallel_for("attention_dropout_softmax_backward", Policy(0, rows), KOKKOS_LAMBDA(int i) {
            const int t = r0 + i;
            const float* pr = Pb + (size_t)i * T;
            const float* dr = Pd + (size_t)i * keys;
            float* d = dS + (size_t)i * keys;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= t; ++j) dot += dr[j] * d[j];
#pragma omp simd
            for (int j = 0; j <= t; ++j) d[j] = dr[j] * d[j] - pr[j] * dot;
            std::fill(d + t + 1, d + keys, 0.0f);
          });
        } else {
          gemm(true, false, keys, HS, rows, 1.0f, Pb, T, dOb, C, 1.0f, dv, C3, p);  // dV += P^T dO
          // Softmax backward in place: dS = P * (dP - rowsum(P * dP)); the masked part stays 0.
          Kokkos::parallel_for("attention_softmax_backward", Policy(0, rows), KOKKOS_LAMBDA(int i) {
            const int t = r0 + i;
            const float* pr = Pb + (size_t)i * T;
            float* d = dS + (size_t)i * keys;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= t; ++j) dot += pr[j] * d[j];
#pragma omp simd
            for (int j = 0; j <= t; ++j) d[j] = pr[j] * (d[j] - dot);
            std::fill(d + t + 1, d + keys, 0.0f);
          });
        }
        gemm(false, false, rows, HS, keys, sc, dS, keys, k, C3, 1.0f, dq + (size_t)r0 * C3, C3, p);  // dQ += s dS K
        gemm(true, false, keys, HS, rows, sc, dS, keys, q + (size_t)r0 * C3, C3, 1.0f, dk, C3, p);   // dK += s dS^T Q
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// element-wise

// GELU(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3). Computed through the identity
// 0.5 (1 + tanh(u)) = sigmoid(2u) = 1 / (1 + e^{-2u}): one exp_simd, no cancellation near 0.
void gelu_forward(float* out, const float* inp, size_t n) {
  require_backend("gelu_forward");
  for_chunks("gelu_forward", n, [=](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) {
      const float x = inp[i];
      const float u = kGeluScale * (x + kGeluCubic * x * x * x);
      out[i] = x / (1.0f + exp_simd(-2.0f * u));
    }
  });
}

// d/dx = s + x * 2 s (1 - s) * du/dx with s = sigmoid(2u) (since sech^2(u) / 2 = 2 s (1 - s)).
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  require_backend("gelu_backward");
  for_chunks("gelu_backward", n, [=](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) {
      const float x = inp[i];
      const float u = kGeluScale * (x + kGeluCubic * x * x * x);
      const float s = 1.0f / (1.0f + exp_simd(-2.0f * u));
      const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
      dinp[i] += (s + 2.0f * x * s * (1.0f - s) * du) * dout[i];
    }
  });
}

void swiglu_forward(float* out, const float* inp, size_t rows, int F) {
  require_backend("swiglu_forward");
  require(F > 0, "swiglu_forward", "need F > 0");
  for_chunks("swiglu_forward", rows, [=](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      const float* g = inp + r * 2 * F;
      const float* u = g + F;
      float* o = out + r * F;
#pragma omp simd
      for (int j = 0; j < F; ++j) o[j] = g[j] / (1.0f + exp_simd(-g[j])) * u[j];
    }
  });
}

// silu'(x) = s (1 + x (1 - s)) with s = sigmoid(x).
void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t rows, int F) {
  require_backend("swiglu_backward");
  require(F > 0, "swiglu_backward", "need F > 0");
  for_chunks("swiglu_backward", rows, [=](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      const float* g = inp + r * 2 * F;
      const float* u = g + F;
      const float* d = dout + r * F;
      float* dg = dinp + r * 2 * F;
      float* du = dg + F;
#pragma omp simd
      for (int j = 0; j < F; ++j) {
        const float s = 1.0f / (1.0f + exp_simd(-g[j]));
        dg[j] += d[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
        du[j] += d[j] * g[j] * s;
      }
    }
  });
}

void dropout(float* x, size_t rows, int C, const Dropout& d) {
  require_backend("dropout");
  require(C > 0 && d.T > 0 && d.p >= 0.0f && d.p < 1.0f, "dropout",
          "need C > 0, T > 0 and 0 <= p < 1 (C=" + std::to_string(C) + ", T=" + std::to_string(d.T) +
              ", p=" + std::to_string(d.p) + ")");
  if (!d.on()) return;
  const uint32_t thr = d.threshold();
  const float s = d.scale();
  Kokkos::parallel_for("dropout", Policy(0, static_cast<int64_t>(rows)), KOKKOS_LAMBDA(int64_t r) {
    const long long row = d.first_row + r;
    const uint64_t key = dropout_row_key(d.key, d.first_sample + row / d.T, (uint64_t)(row % d.T));
    float* xr = x + r * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) xr[c] = dropout_keep(key, (uint64_t)c, thr) ? xr[c] * s : 0.0f;
  });
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  require_backend("residual_forward");
  for_chunks("residual_forward", n, [=](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) out[i] = a[i] + b[i];
  });
}

void add_scaled(float* y, const float* x, float a, size_t n) {
  require_backend("add_scaled");
  for_chunks("add_scaled", n, [=](size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; ++i) y[i] += a * x[i];
  });
}

// ---------------------------------------------------------------------------------------------
// loss

void softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, float dloss, int N, int V, int Vp) {
  require_backend("softmax_cross_entropy");
  require(N >= 0 && V > 0 && Vp >= V, "softmax_cross_entropy",
          "need 0 < V <= Vp (V=" + std::to_string(V) + ", Vp=" + std::to_string(Vp) + ")");
  for (int i = 0; i < N; ++i)
    require(targets[i] < V, "softmax_cross_entropy",
            "target " + std::to_string(targets[i]) + " of row " + std::to_string(i) + " is not below V=" +
                std::to_string(V));
  Kokkos::parallel_for("softmax_cross_entropy", Policy(0, N), KOKKOS_LAMBDA(int i) {
    float* row = logits + (size_t)i * Vp;  // (Vp)
    const int32_t tgt = targets[i];
    if (tgt < 0) {
      losses[i] = 0.0f;
      std::fill(row, row + Vp, 0.0f);
      return;
    }
    const float mx = row_max(row, V);
    const float shifted_target = row[tgt] - mx;  // read before the row is overwritten
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < V; ++j) {
      const float e = exp_simd(row[j] - mx);
      row[j] = e;
      sum += e;
    }
    // -log p[tgt] = log(sum) - (logit[tgt] - max): no log of an underflowed probability.
    losses[i] = (float)(std::log(sum) - (double)shifted_target);
    const float g = (float)(dloss / sum);
#pragma omp simd
    for (int j = 0; j < V; ++j) row[j] *= g;
    row[tgt] -= dloss;
    std::fill(row + V, row + Vp, 0.0f);
  });
}

}  // namespace hpct::kernels
