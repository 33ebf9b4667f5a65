// CUDA twins of the element-wise and per-row ops in cpu_ops.cpp (declared in cuda_ops.hpp).
//
// What it is: gelu forward/backward, residual, AdamW and layernorm forward on device pointers,
// with the same formulas as the CPU path (GELU through sigmoid(2u), two-pass layernorm variance,
// bias corrections in double) so CPU and GPU runs agree to rounding. What it is not: tuned; float4
// (128-bit) loads only in the residual add and GELU's backward (the hot ones; aligned, n % 4 == 0),
// the fused forms in fusions.cu. Trade-off: grid-stride loops over a capped grid, one warp
// per layernorm row (C = 768 is 24 values per lane): simple, and these ops are bandwidth-bound.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu_sigmoid(float x) {  // 0.5 (1 + tanh(u)) = sigmoid(2u)
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
  HPCT_GRID_STRIDE(i, n) {
    const float x = inp[i];
    out[i] = x * gelu_sigmoid(x);
  }
}

__device__ __forceinline__ float gelu_grad(float x, float dout) {
  const float s = gelu_sigmoid(x);
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
  return (s + 2.0f * x * s * (1.0f - s) * du) * dout;
}

template <bool Accumulate>
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n) {
  HPCT_GRID_STRIDE(i, n) {
    const float d = gelu_grad(inp[i], dout[i]);
    if constexpr (Accumulate) dinp[i] += d;
    else dinp[i] = d;
  }
}

// The same on float4s (n4 = n / 4 of them; 16-byte aligned pointers): 128-bit loads and stores.
template <bool Accumulate>
__global__ void gelu_backward4_kernel(float4* dinp, const float4* inp, const float4* dout, size_t n4) {
  HPCT_GRID_STRIDE(i, n4) {
    const float4 x = inp[i], g = dout[i];
    float4 d = make_float4(gelu_grad(x.x, g.x), gelu_grad(x.y, g.y), gelu_grad(x.z, g.z), gelu_grad(x.w, g.w));
    if constexpr (Accumulate) {
      const float4 o = dinp[i];
      d = make_float4(o.x + d.x, o.y + d.y, o.z + d.z, o.w + d.w);
    }
    dinp[i] = d;
  }
}

// dinp = gelu'(inp) * dout WRITTEN, inp in 16 bits (the pre-activation bias_gelu_forward_narrow
// kept), into fp32 dinp or (Half) 16-bit dinp16 rounded once, four elements a thread where the
// pointers allow (8-byte 16-bit loads and stores).
template <int V, bool Half>
__global__ void gelu_backward_half_kernel(float* dinp, uint16_t* dinp16, const uint16_t* inp, bool bf16,
                                          const float* dout, size_t n) {
  HPCT_GRID_STRIDE(i, n) {
    if constexpr (V == 1) {
      const float d = gelu_grad(half_value(inp[i], bf16), dout[i]);
      if constexpr (Half) dinp16[i] = half_bits(d, bf16);
      else dinp[i] = d;
    } else {
      const ushort4 h = reinterpret_cast<const ushort4*>(inp)[i];
      const float4 g = reinterpret_cast<const float4*>(dout)[i];
      const float4 d = make_float4(gelu_grad(half_value(h.x, bf16), g.x), gelu_grad(half_value(h.y, bf16), g.y),
                                   gelu_grad(half_value(h.z, bf16), g.z), gelu_grad(half_value(h.w, bf16), g.w));
      if constexpr (Half)
        reinterpret_cast<ushort4*>(dinp16)[i] =
            make_ushort4(half_bits(d.x, bf16), half_bits(d.y, bf16), half_bits(d.z, bf16), half_bits(d.w, bf16));
      else
        reinterpret_cast<float4*>(dinp)[i] = d;
    }
  }
}

// Rotary positions: one thread per (row, query or key head, pair i < rot/2).
__global__ void rope_kernel(float* qkv, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos,
                            float sign, size_t n) {
  const int d = C / NH, half = rot / 2;
  const size_t W = (size_t)C + 2 * (size_t)KV * d;
  HPCT_GRID_STRIDE(k, n) {
    const int i = (int)(k % half);
    const size_t rest = k / half;
    const int h = (int)(rest % (NH + KV));  // q heads, then the k heads after them
    const size_t r = rest / (NH + KV);
    const float p = (float)(pos ? pos[r] : (int)(r % T));
    const float ang = p * powf(theta, -2.0f * i / rot);
    float s, c;
    sincosf(ang, &s, &c);
    s *= sign;
    float* x = qkv + r * W + (size_t)h * d;
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

// Grouped-query attention: one thread per element of the widened (rows, 3C) row.
__global__ void expand_kv_kernel(float* out, const float* inp, int C, int NH, int KV, size_t n) {
  const int d = C / NH, G = NH / KV;
  const size_t W = (size_t)C + 2 * (size_t)KV * d;
  HPCT_GRID_STRIDE(i, n) {
    const size_t r = i / (3 * (size_t)C), c = i % (3 * (size_t)C);
    const int sec = (int)(c / C), h = (int)((c % C) / d), e = (int)(c % d);
    out[i] = sec == 0 ? inp[r * W + c] : inp[r * W + C + (size_t)(sec - 1) * KV * d + (size_t)(h / G) * d + e];
  }
}

// One thread per element of the grouped (rows, C + 2 KV d) row: a key/value element sums its group.
__global__ void reduce_kv_kernel(float* dinp, const float* dout, int C, int NH, int KV, size_t n) {
  const int d = C / NH, G = NH / KV;
  const size_t W = (size_t)C + 2 * (size_t)KV * d;
  HPCT_GRID_STRIDE(i, n) {
    const size_t r = i / W, c = i % W;
    const float* g = dout + r * 3 * (size_t)C;
    if (c < (size_t)C) {
      dinp[i] = g[c];
      continue;
    }
    const size_t kc = c - C;
    const int sec = 1 + (int)(kc / ((size_t)KV * d)), k = (int)((kc % ((size_t)KV * d)) / d), e = (int)(kc % d);
    float s = 0.0f;
    for (int j = 0; j < G; ++j) s += g[(size_t)sec * C + (size_t)(k * G + j) * d + e];
    dinp[i] = s;
  }
}

// SwiGLU: element i of the (rows, F) output reads gate and up of its row.
__global__ void swiglu_forward_kernel(float* out, const float* inp, size_t n, int F) {
  HPCT_GRID_STRIDE(i, n) {
    const size_t r = i / F, j = i % F;
    const float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j];
    out[i] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void swiglu_backward_kernel(float* dinp, const float* inp, const float* dout, size_t n, int F) {
  HPCT_GRID_STRIDE(i, n) {
    const size_t r = i / F, j = i % F, at = r * 2 * F + j;
    const float g = inp[at], u = inp[at + F], s = 1.0f / (1.0f + expf(-g));
    dinp[at] += dout[i] * u * s * (1.0f + g * (1.0f - s));
    dinp[at + F] += dout[i] * g * s;
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  HPCT_GRID_STRIDE(i, n)
    out[i] = a[i] + b[i];
}
__global__ void residual_forward4_kernel(float4* out, const float4* a, const float4* b, size_t n4) {
  HPCT_GRID_STRIDE(i, n4) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
  }
}

__global__ void add_scaled_kernel(float* y, const float* x, float a, size_t n) {
  HPCT_GRID_STRIDE(i, n)
    y[i] += a * x[i];
}

__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale) {
  HPCT_GRID_STRIDE(i, n) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    // cpu_optim.cpp's folded form (the constants in float from the same bias corrections).
    param[i] = param[i] * (1.0f - lr * weight_decay) - (lr / bc1) * (mi / (sqrtf(vi) * (1.0f / sqrtf(bc2)) + eps));
  }
}

// One warp per row; the row is read three times (mean, variance, output), from L1/L2 after the
// first: no cancellation in the variance, as on the CPU.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                         const float* bias, int N, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
    const float* x = inp + (size_t)row * C;  // (C)
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    const float m = warp_sum(s) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float d = x[c] - m;
      var += d * d;
    }
    const float rs = rsqrtf(warp_sum(var) / C + kLayerNormEps);
    float* o = out + (size_t)row * C;  // (C)
    for (int c = lane; c < C; c += 32) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = rs;
    }
  }
}

// RMSNorm: one warp per row, as layernorm_forward_kernel without the mean and the bias.
__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, const float* weight, int N, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
    const float* x = inp + (size_t)row * C;  // (C)
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    const float rs = rsqrtf(warp_sum(ss) / C + kLayerNormEps);
    float* o = out + (size_t)row * C;  // (C)
    for (int c = lane; c < C; c += 32) o[c] = x[c] * rs * weight[c];
    if (lane == 0) rstd[row] = rs;
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C, cudaStream_t stream) {
  if (N < 0 || C <= 0)
    throw Error("hpct::kernels::cuda::rmsnorm_forward: need N >= 0 and C > 0 (N=" + std::to_string(N) +
                ", C=" + std::to_string(C) + ")");
  if (N == 0) return;
  rmsnorm_forward_kernel<<<blocks_for((size_t)N * 32), kThreads, 0, stream>>>(out, rstd, inp, weight, N, C);
  check_launch("rmsnorm_forward");
}

void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, inp, n);
  check_launch("gelu_forward");
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n, cudaStream_t stream, bool accumulate) {
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
    auto* d4 = reinterpret_cast<float4*>(dinp);
    const auto* x4 = reinterpret_cast<const float4*>(inp);
    const auto* g4 = reinterpret_cast<const float4*>(dout);
    if (accumulate) gelu_backward4_kernel<true><<<blocks_for(n / 4), kThreads, 0, stream>>>(d4, x4, g4, n / 4);
    else gelu_backward4_kernel<false><<<blocks_for(n / 4), kThreads, 0, stream>>>(d4, x4, g4, n / 4);
  } else if (accumulate) {
    gelu_backward_kernel<true><<<blocks_for(n), kThreads, 0, stream>>>(dinp, inp, dout, n);
  } else {
    gelu_backward_kernel<false><<<blocks_for(n), kThreads, 0, stream>>>(dinp, inp, dout, n);
  }
  check_launch("gelu_backward");
}

void gelu_backward_half(float* dinp, uint16_t* dinp16, const uint16_t* inp, bool bf16, const float* dout, size_t n,
                        cudaStream_t stream) {
  if (n == 0) return;
  if ((dinp == nullptr) == (dinp16 == nullptr))
    throw Error("hpct::kernels::cuda::gelu_backward_half: exactly one of dinp and dinp16");
  const bool v4 = n % 4 == 0 && aligned16(dinp) && aligned8(dinp16) && aligned8(inp) && aligned16(dout);
  const unsigned blocks = blocks_for(v4 ? n / 4 : n);
  const size_t count = v4 ? n / 4 : n;
  if (v4 && dinp16) gelu_backward_half_kernel<4, true><<<blocks, kThreads, 0, stream>>>(dinp, dinp16, inp, bf16, dout, count);
  else if (v4) gelu_backward_half_kernel<4, false><<<blocks, kThreads, 0, stream>>>(dinp, dinp16, inp, bf16, dout, count);
  else if (dinp16) gelu_backward_half_kernel<1, true><<<blocks, kThreads, 0, stream>>>(dinp, dinp16, inp, bf16, dout, count);
  else gelu_backward_half_kernel<1, false><<<blocks, kThreads, 0, stream>>>(dinp, dinp16, inp, bf16, dout, count);
  check_launch("gelu_backward_half");
}

void rope(float* qkv, int B, int T, int C, int NH, int KV, int rot, float theta, const int32_t* pos, bool inverse,
          cudaStream_t stream) {
  if (NH <= 0 || KV <= 0 || C % NH != 0 || rot <= 0 || rot % 2 != 0 || rot > C / NH || T <= 0)
    throw Error("hpct::kernels::cuda::rope: need C divisible by NH and an even rot in (0, C/NH] (C=" + std::to_string(C) +
                ", NH=" + std::to_string(NH) + ", rot=" + std::to_string(rot) + ")");
  const size_t n = (size_t)B * T * (NH + KV) * (rot / 2);
  if (n == 0) return;
  rope_kernel<<<blocks_for(n), kThreads, 0, stream>>>(qkv, T, C, NH, KV, rot, theta, pos, inverse ? -1.0f : 1.0f, n);
  check_launch("rope");
}

void expand_kv(float* out, const float* inp, size_t rows, int C, int NH, int KV, cudaStream_t stream) {
  if (NH <= 0 || KV <= 0 || NH % KV != 0 || C % NH != 0) throw Error("hpct::kernels::cuda::expand_kv: need KV | NH | C");
  const size_t n = rows * 3 * (size_t)C;
  if (n == 0) return;
  expand_kv_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, inp, C, NH, KV, n);
  check_launch("expand_kv");
}

void reduce_kv(float* dinp, const float* dout, size_t rows, int C, int NH, int KV, cudaStream_t stream) {
  if (NH <= 0 || KV <= 0 || NH % KV != 0 || C % NH != 0) throw Error("hpct::kernels::cuda::reduce_kv: need KV | NH | C");
  const size_t n = rows * ((size_t)C + 2 * (size_t)KV * (C / NH));
  if (n == 0) return;
  reduce_kv_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dinp, dout, C, NH, KV, n);
  check_launch("reduce_kv");
}

void swiglu_forward(float* out, const float* inp, size_t rows, int F, cudaStream_t stream) {
  const size_t n = rows * (size_t)F;
  if (n == 0) return;
  swiglu_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, inp, n, F);
  check_launch("swiglu_forward");
}

void swiglu_backward(float* dinp, const float* inp, const float* dout, size_t rows, int F, cudaStream_t stream) {
  const size_t n = rows * (size_t)F;
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dinp, inp, dout, n, F);
  check_launch("swiglu_backward");
}

void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(out) && aligned16(a) && aligned16(b))
    residual_forward4_kernel<<<blocks_for(n / 4), kThreads, 0, stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b), n / 4);
  else
    residual_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, a, b, n);
  check_launch("residual_forward");
}

void add_scaled(float* y, const float* x, float a, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_scaled_kernel<<<blocks_for(n), kThreads, 0, stream>>>(y, x, a, n);
  check_launch("add_scaled");
}

void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int step, float grad_scale, cudaStream_t stream) {
  if (step < 1) throw Error("hpct::kernels::cuda::adamw_update: step is 1-based, got " + std::to_string(step));
  if (n == 0) return;
  const float bc1 = (float)(1.0 - std::pow((double)beta1, step));
  const float bc2 = (float)(1.0 - std::pow((double)beta2, step));
  adamw_kernel<<<blocks_for(n), kThreads, 0, stream>>>(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, bc1,
                                                      bc2, grad_scale);
  check_launch("adamw_update");
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, cudaStream_t stream) {
  if (N < 0 || C <= 0)
    throw Error("hpct::kernels::cuda::layernorm_forward: need N >= 0 and C > 0 (N=" + std::to_string(N) +
                ", C=" + std::to_string(C) + ")");
  if (N == 0) return;
  // 32 threads (one warp) per row.
  layernorm_forward_kernel<<<blocks_for((size_t)N * 32), kThreads, 0, stream>>>(out, mean, rstd, inp, weight, bias, N,
                                                                                C);
  check_launch("layernorm_forward");
}

}  // namespace hpct::kernels::cuda
