// The query/key/value rows around the attention op on the CPU (ops.hpp): rotary positions
// applied to the query and key heads, and grouped-query attention's key/value heads widened to
// every query head and their gradients summed back. Split from cpu_ops.cpp: these act on qkv's
// row layout, not on the attention itself.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_loops.hpp"
#include "hpct/kernels/ops.hpp"

namespace hpct::kernels {

using detail::for_chunks;
using detail::Policy;
using detail::require;
using detail::require_backend;

// ---------------------------------------------------------------------------------------------
// rotary position embedding

void rope(float* qkv, int B, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos, bool inverse) {
  require_backend("rope");
  require(B >= 0 && T > 0 && NH > 0 && KV > 0 && C % NH == 0 && rot > 0 && rot % 2 == 0 && rot <= C / NH && theta > 0,
          "rope",
          "need C divisible by NH and an even rot in (0, C/NH], theta > 0 (C=" + std::to_string(C) + ", NH=" +
              std::to_string(NH) + ", rot=" + std::to_string(rot) + ")");
  const int d = C / NH, half = rot / 2;
  const size_t W = (size_t)C + 2 * (size_t)KV * d;  // a row: q | k | v
  std::vector<float> inv(half);  // theta^(-2i/rot), in double then rounded once
  for (int i = 0; i < half; ++i) inv[i] = static_cast<float>(std::pow((double)theta, -2.0 * i / rot));
  const float* invp = inv.data();
  const float sign = inverse ? -1.0f : 1.0f;
  Kokkos::parallel_for("rope", Policy(0, (int64_t)B * T), KOKKOS_LAMBDA(int64_t r) {
    const float p = static_cast<float>(pos ? pos[r] : r % T);
    float* row = qkv + (size_t)r * W;
    for (int i = 0; i < half; ++i) {
      const float ang = p * invp[i], c = std::cos(ang), s = sign * std::sin(ang);
      for (int h = 0; h < NH + KV; ++h) {  // the query heads, then the key heads that follow them
        float* x = row + (size_t)h * d;
        const float a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// grouped-query attention: key/value heads shared by groups of query heads

void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV) {
  require_backend("expand_kv");
  require(NH > 0 && KV > 0 && NH % KV == 0 && C % NH == 0, "expand_kv", "need KV dividing NH dividing C");
  const int d = C / NH, G = NH / KV;
  const size_t W = (size_t)C + 2 * (size_t)KV * d;
  for_chunks("expand_kv", rows, [=](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      const float* x = inp + r * W;
      float* o = out + r * 3 * C;
      std::copy(x, x + C, o);  // q
      for (int sec = 1; sec <= 2; ++sec)  // k, v: query head h reads key/value head h / G
        for (int h = 0; h < NH; ++h) {
          const float* src = x + C + (size_t)(sec - 1) * KV * d + (size_t)(h / G) * d;
          std::copy(src, src + d, o + (size_t)sec * C + (size_t)h * d);
        }
    }
  });
}

void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV) {
  require_backend("reduce_kv");
  require(NH > 0 && KV > 0 && NH % KV == 0 && C % NH == 0, "reduce_kv", "need KV dividing NH dividing C");
  const int d = C / NH, G = NH / KV;
  const size_t W = (size_t)C + 2 * (size_t)KV * d;
  for_chunks("reduce_kv", rows, [=](size_t lo, size_t hi) {
    for (size_t r = lo; r < hi; ++r) {
      const float* g = dout + r * 3 * C;
      float* x = dinp + r * W;
      std::copy(g, g + C, x);  // d(q)
      for (int sec = 1; sec <= 2; ++sec)
        for (int k = 0; k < KV; ++k) {  // d(k head k): the sum over its group's query heads, in order
          float* dst = x + C + (size_t)(sec - 1) * KV * d + (size_t)k * d;
          std::fill(dst, dst + d, 0.0f);
          for (int j = 0; j < G; ++j) {
            const float* src = g + (size_t)sec * C + (size_t)(k * G + j) * d;
            for (int e = 0; e < d; ++e) dst[e] += src[e];
          }
        }
    }
  });
}

}  // namespace hpct::kernels
