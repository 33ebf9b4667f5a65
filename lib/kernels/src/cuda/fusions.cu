// CUDA kernels for the fused forms of OpsBackend (declared in cuda_ops.hpp): a layer's residual
// add with the norm after it, and an MLP's bias with its GELU.
//
// What they are: each does in one kernel what two of elementwise.cu / gpt_ops.cu did, with the same
// formulas (two-pass variance, GELU through sigmoid(2u)), so the result equals the unfused pair to
// rounding. What they buy: the residual add's sum is normalised while it is in cache (one read of
// the (N, C) stream less per layer), and the bias is added while GELU reads the GEMM's output (one
// read and one write of the (N, 4C) pre-activation less); both load 16 bytes at a time where the
// rows allow. Trade-off: one warp per norm row re-reads its row from L1/L2 for the variance and
// the output rather than holding it in registers: any C works, at the cost of cache traffic.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

constexpr float kNormEps = 1e-5f;  // as elementwise.cu's layernorm and rmsnorm
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float gelu(float x) {  // x * sigmoid(2u), as elementwise.cu
  const float u = kGeluScale * (x + kGeluCubic * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}

// Elements of one row as float (V = 1) or float4 (V = 4) loads; C / V of them.
template <int V>
struct Lanes;
template <>
struct Lanes<1> {
  using T = float;
  __device__ static float sum(float x) { return x; }
  __device__ static float sq(float x, float m) { return (x - m) * (x - m); }
};
template <>
struct Lanes<4> {
  using T = float4;
  __device__ static float sum(float4 x) { return (x.x + x.y) + (x.z + x.w); }
  __device__ static float sq(float4 x, float m) {
    return ((x.x - m) * (x.x - m) + (x.y - m) * (x.y - m)) + ((x.z - m) * (x.z - m) + (x.w - m) * (x.w - m));
  }
};

__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add(float4 a, float4 b) { return {a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w}; }
// (x - m) * rs * w + b, element-wise (LayerNorm: as layernorm_forward_kernel's order).
__device__ __forceinline__ float norm_out(float x, float m, float rs, float w, float b) { return (x - m) * rs * w + b; }
__device__ __forceinline__ float4 norm_out(float4 x, float m, float rs, float4 w, float4 b) {
  return {(x.x - m) * rs * w.x + b.x, (x.y - m) * rs * w.y + b.y, (x.z - m) * rs * w.z + b.z, (x.w - m) * rs * w.w + b.w};
}
__device__ __forceinline__ float rms_out(float x, float rs, float w) { return x * rs * w; }
__device__ __forceinline__ float4 rms_out(float4 x, float rs, float4 w) {
  return {x.x * rs * w.x, x.y * rs * w.y, x.z * rs * w.z, x.w * rs * w.w};
}

// One warp per row: res = a + b written, then LayerNorm (mean from the sum, variance in a second
// pass over res: no cancellation) or RMSNorm (Rms) of it. Cv = C / V loads per row.
template <int V, bool Rms>
__global__ void residual_norm_kernel(float* res_f, float* out_f, float* mean, float* rstd, const float* a_f,
                                     const float* b_f, const float* w_f, const float* bias_f, int N, int C) {
  using T = typename Lanes<V>::T;
  const int Cv = C / V, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const T* w = reinterpret_cast<const T*>(w_f);
  const T* bias = reinterpret_cast<const T*>(bias_f);
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
    const size_t off = (size_t)row * Cv;
    const T* a = reinterpret_cast<const T*>(a_f) + off;
    const T* b = reinterpret_cast<const T*>(b_f) + off;
    T* res = reinterpret_cast<T*>(res_f) + off;
    T* out = reinterpret_cast<T*>(out_f) + off;
    float s = 0.0f, ss = 0.0f;
    for (int c = lane; c < Cv; c += 32) {  // each lane re-reads only what it wrote itself
      const T r = add(a[c], b[c]);
      res[c] = r;
      if constexpr (Rms) ss += Lanes<V>::sq(r, 0.0f);
      else s += Lanes<V>::sum(r);
    }
    if constexpr (Rms) {
      const float rs = rsqrtf(warp_sum(ss) / C + kNormEps);
      for (int c = lane; c < Cv; c += 32) out[c] = rms_out(res[c], rs, w[c]);
      if (lane == 0) rstd[row] = rs;
    } else {
      const float m = warp_sum(s) / C;
      float var = 0.0f;
      for (int c = lane; c < Cv; c += 32) var += Lanes<V>::sq(res[c], m);
      const float rs = rsqrtf(warp_sum(var) / C + kNormEps);
      for (int c = lane; c < Cv; c += 32) out[c] = norm_out(res[c], m, rs, w[c], bias[c]);
      if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
      }
    }
  }
}

// pre += bias (per column; none when bias is null), act = gelu(pre); n = N * OC / V loads.
template <int V>
__global__ void bias_gelu_kernel(float* pre_f, float* act_f, const float* bias_f, int OCv, size_t n) {
  using T = typename Lanes<V>::T;
  T* pre = reinterpret_cast<T*>(pre_f);
  T* act = reinterpret_cast<T*>(act_f);
  const T* bias = reinterpret_cast<const T*>(bias_f);
  HPCT_GRID_STRIDE(i, n) {
    T x = pre[i];
    if (bias) {
      x = add(x, bias[i % OCv]);
      pre[i] = x;
    }
    if constexpr (V == 1) {
      act[i] = gelu(x);
    } else {
      act[i] = make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w));
    }
  }
}

template <bool Rms>
void residual_norm(float* res, float* out, float* mean, float* rstd, const float* a, const float* b, const float* w,
                   const float* bias, int N, int C, cudaStream_t stream, const char* op) {
  if (N < 0 || C <= 0)
    throw Error(std::string("hpct::kernels::cuda::") + op + ": need N >= 0 and C > 0 (N=" + std::to_string(N) +
                ", C=" + std::to_string(C) + ")");
  if (N == 0) return;
  const unsigned blocks = blocks_for((size_t)N * 32);  // one warp per row
  const bool v4 = C % 4 == 0 && aligned16(res) && aligned16(out) && aligned16(a) && aligned16(b) && aligned16(w) &&
                  aligned16(bias);
  if (v4) residual_norm_kernel<4, Rms><<<blocks, kThreads, 0, stream>>>(res, out, mean, rstd, a, b, w, bias, N, C);
  else residual_norm_kernel<1, Rms><<<blocks, kThreads, 0, stream>>>(res, out, mean, rstd, a, b, w, bias, N, C);
  check_launch(op);
}

}  // namespace

void residual_layernorm_forward(float* res, float* out, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C, cudaStream_t stream) {
  residual_norm<false>(res, out, mean, rstd, a, b, weight, bias, N, C, stream, "residual_layernorm_forward");
}

void residual_rmsnorm_forward(float* res, float* out, float* rstd, const float* a, const float* b, const float* weight,
                              int N, int C, cudaStream_t stream) {
  residual_norm<true>(res, out, nullptr, rstd, a, b, weight, nullptr, N, C, stream, "residual_rmsnorm_forward");
}

void bias_gelu_forward(float* pre, float* act, const float* bias, int N, int OC, cudaStream_t stream) {
  if (N < 0 || OC <= 0)
    throw Error("hpct::kernels::cuda::bias_gelu_forward: need N >= 0 and OC > 0 (N=" + std::to_string(N) +
                ", OC=" + std::to_string(OC) + ")");
  const size_t n = (size_t)N * OC;
  if (n == 0) return;
  if (OC % 4 == 0 && aligned16(pre) && aligned16(act) && aligned16(bias))
    bias_gelu_kernel<4><<<blocks_for(n / 4), kThreads, 0, stream>>>(pre, act, bias, OC / 4, n / 4);
  else
    bias_gelu_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(pre, act, bias, OC, n);
  check_launch("bias_gelu_forward");
}

}  // namespace hpct::kernels::cuda
