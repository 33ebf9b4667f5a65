// CPU implementations of moe_ops.hpp: plain loops over rows (memory-bound copies and mixes; the
// experts' GEMMs are the layer's work). cuda/moe_ops.cu has the device twins.
#include "hpct/kernels/moe_ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace hpct::kernels {

void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) {
  for (size_t i = 0; i < n; ++i) std::memcpy(dst + i * C, src + (size_t)rows[i] * C, (size_t)C * sizeof(float));
}

void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C) {
  for (size_t i = 0; i < n; ++i) std::memcpy(dst + (size_t)rows[i] * C, src + i * C, (size_t)C * sizeof(float));
}

void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K, int C) {
  std::memset(out, 0, (size_t)N * C * sizeof(float));
  for (int t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k) {
      const size_t i = (size_t)t * K + k;
      if (pos[i] < 0) continue;
      const float w = weight[i];
      const float* yr = y + (size_t)pos[i] * C;
      float* dst = out + (size_t)t * C;
      for (int c = 0; c < C; ++c) dst[c] += w * yr[c];
    }
}

void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                          const float* weight, int N, int K, int C) {
  for (int t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k) {
      const size_t i = (size_t)t * K + k;
      dweight[i] = 0.0f;
      if (pos[i] < 0) continue;
      const float w = weight[i];
      const float* g = dout + (size_t)t * C;
      const float* yr = y + (size_t)pos[i] * C;
      float* dyr = dy + (size_t)pos[i] * C;
      double dw = 0;
      for (int c = 0; c < C; ++c) dyr[c] = w * g[c], dw += (double)g[c] * yr[c];
      dweight[i] = static_cast<float>(dw);
    }
}

void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C) {
  for (int t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k) {
      const size_t i = (size_t)t * K + k;
      if (pos[i] < 0) continue;
      const float* src = drows + (size_t)pos[i] * C;
      float* d = dx + (size_t)t * C;
      for (int c = 0; c < C; ++c) d[c] += src[c];
    }
}

void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate) {
  if (accumulate)
    for (size_t i = 0; i < n; ++i) out[i] += a[i] * b[i];
  else
    for (size_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C) {
  for (int t = 0; t < N; ++t) {
    float* c2 = coef + (size_t)t * 2;
    const float mx = std::max(c2[0], c2[1]);
    const float e0 = std::exp(c2[0] - mx), e1 = std::exp(c2[1] - mx);
    c2[0] = e0 / (e0 + e1), c2[1] = e1 / (e0 + e1);
    for (int c = 0; c < C; ++c) {
      const size_t i = (size_t)t * C + c;
      out[i] = c2[0] * moe[i] + c2[1] * dense[i];
    }
  }
}

void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                           const float* moe, const float* dense, int N, int C) {
  for (int t = 0; t < N; ++t) {
    const float* c2 = coef + (size_t)t * 2;
    double g0 = 0, g1 = 0;
    for (int c = 0; c < C; ++c) {
      const size_t i = (size_t)t * C + c;
      dmoe[i] = c2[0] * dout[i];
      ddense[i] = c2[1] * dout[i];
      g0 += (double)dout[i] * moe[i];
      g1 += (double)dout[i] * dense[i];
    }
    // softmax backward: dz_j = c_j (g_j - sum_i c_i g_i)
    const double dot = c2[0] * g0 + c2[1] * g1;
    dlogits[(size_t)t * 2] = static_cast<float>(c2[0] * (g0 - dot));
    dlogits[(size_t)t * 2 + 1] = static_cast<float>(c2[1] * (g1 - dot));
  }
}

}  // namespace hpct::kernels
