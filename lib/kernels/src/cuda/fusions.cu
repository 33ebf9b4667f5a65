// CUDA kernels for the fused forms of OpsBackend (declared in cuda_ops.hpp): a layer's residual
// add with the norm after it, and an MLP's bias with its GELU; and the kernels that write an
// activation a GEMM reads next in 16 bits (the norms, GELU, SwiGLU: cuda_ops.hpp's ActOut), and
// the bias + GELU that keeps its pre-activation in 16 bits.
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

// An activation's store: fp32, or 16-bit rounded once (launch.cuh's half_bits). i counts elements
// (V = 1) or groups of four (V = 4; a 16-bit output then stores 8 bytes at once).
__device__ __forceinline__ void store(const ActOut& o, size_t i, float v) {
  if (o.h) o.h[i] = half_bits(v, o.bf16);
  else o.f[i] = v;
}
__device__ __forceinline__ void store(const ActOut& o, size_t i, float4 v) {
  if (o.h) {
    reinterpret_cast<ushort4*>(o.h)[i] =
        make_ushort4(half_bits(v.x, o.bf16), half_bits(v.y, o.bf16), half_bits(v.z, o.bf16), half_bits(v.w, o.bf16));
  } else {
    reinterpret_cast<float4*>(o.f)[i] = v;
  }
}
// Whether an output takes the 4-wide stores.
bool aligned_out(const ActOut& o) { return o.h ? aligned8(o.h) : aligned16(o.f); }

// One warp per row: with Add, res = a + b written and normalised; without, a normalised (res and b
// unused). LayerNorm (mean from the sum, variance in a second pass over the row: no cancellation)
// or RMSNorm (Rms). Cv = C / V loads per row.
template <int V, bool Rms, bool Add>
__global__ void norm_kernel(float* res_f, ActOut out, float* mean, float* rstd, const float* a_f, const float* b_f,
                            const float* w_f, const float* bias_f, int N, int C) {
  using T = typename Lanes<V>::T;
  const int Cv = C / V, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const T* w = reinterpret_cast<const T*>(w_f);
  const T* bias = reinterpret_cast<const T*>(bias_f);
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
    const size_t off = (size_t)row * Cv;
    const T* a = reinterpret_cast<const T*>(a_f) + off;
    T* res = Add ? reinterpret_cast<T*>(res_f) + off : nullptr;
    const T* x = Add ? res : a;  // the row normalised
    float s = 0.0f, ss = 0.0f;
    for (int c = lane; c < Cv; c += 32) {  // each lane re-reads only what it wrote itself
      T r = a[c];
      if constexpr (Add) {
        r = add(r, reinterpret_cast<const T*>(b_f)[off + c]);
        res[c] = r;
      }
      if constexpr (Rms) ss += Lanes<V>::sq(r, 0.0f);
      else s += Lanes<V>::sum(r);
    }
    if constexpr (Rms) {
      const float rs = rsqrtf(warp_sum(ss) / C + kNormEps);
      for (int c = lane; c < Cv; c += 32) store(out, off + c, rms_out(x[c], rs, w[c]));
      if (lane == 0) rstd[row] = rs;
    } else {
      const float m = warp_sum(s) / C;
      float var = 0.0f;
      for (int c = lane; c < Cv; c += 32) var += Lanes<V>::sq(x[c], m);
      const float rs = rsqrtf(warp_sum(var) / C + kNormEps);
      for (int c = lane; c < Cv; c += 32) store(out, off + c, norm_out(x[c], m, rs, w[c], bias[c]));
      if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
      }
    }
  }
}

__device__ __forceinline__ float4 gelu4(float4 x) { return make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w)); }

// A value as a 16-bit store would keep it (bf16 or IEEE half, round to nearest even), widened back.
__device__ __forceinline__ float kept(float x, bool bf16) { return half_value(half_bits(x, bf16), bf16); }
__device__ __forceinline__ float4 kept(float4 x, bool bf16) {
  return make_float4(kept(x.x, bf16), kept(x.y, bf16), kept(x.z, bf16), kept(x.w, bf16));
}

// act = gelu(pre + bias) (per column; no bias when null); n = N * OC / V loads. The sum is written
// to pre_out for the backward: an fp32 pre_out only with a bias (it is pre itself, updated in
// place); a 16-bit one always, and GELU then reads the rounded value it keeps.
template <int V>
__global__ void bias_gelu_kernel(const float* pre_f, ActOut pre_out, ActOut act, const float* bias_f, int OCv,
                                 size_t n) {
  using T = typename Lanes<V>::T;
  const T* pre = reinterpret_cast<const T*>(pre_f);
  const T* bias = reinterpret_cast<const T*>(bias_f);
  HPCT_GRID_STRIDE(i, n) {
    T x = pre[i];
    if (bias) x = add(x, bias[i % OCv]);
    if (pre_out.h) {
      store(pre_out, i, x);
      x = kept(x, pre_out.bf16);
    } else if (bias && pre_out.f) {
      store(pre_out, i, x);
    }
    if constexpr (V == 1) store(act, i, gelu(x));
    else store(act, i, gelu4(x));
  }
}

// SwiGLU into an activation store: element i of the (rows, F) output reads gate and up of its row,
// as elementwise.cu's swiglu_forward_kernel.
__global__ void swiglu_kernel(ActOut out, const float* inp, size_t n, int F) {
  HPCT_GRID_STRIDE(i, n) {
    const size_t r = i / F, j = i % F;
    const float g = inp[r * 2 * F + j], u = inp[r * 2 * F + F + j];
    store(out, i, g / (1.0f + expf(-g)) * u);
  }
}

template <bool Rms, bool Add>
void norm(float* res, ActOut out, float* mean, float* rstd, const float* a, const float* b, const float* w,
          const float* bias, int N, int C, cudaStream_t stream, const char* op) {
  if (N < 0 || C <= 0)
    throw Error(std::string("hpct::kernels::cuda::") + op + ": need N >= 0 and C > 0 (N=" + std::to_string(N) +
                ", C=" + std::to_string(C) + ")");
  if (N == 0) return;
  const unsigned blocks = blocks_for((size_t)N * 32);  // one warp per row
  const bool v4 = C % 4 == 0 && aligned16(res) && aligned_out(out) && aligned16(a) && aligned16(b) && aligned16(w) &&
                  aligned16(bias);
  if (v4) norm_kernel<4, Rms, Add><<<blocks, kThreads, 0, stream>>>(res, out, mean, rstd, a, b, w, bias, N, C);
  else norm_kernel<1, Rms, Add><<<blocks, kThreads, 0, stream>>>(res, out, mean, rstd, a, b, w, bias, N, C);
  check_launch(op);
}

void gelu_into(const float* pre, ActOut pre_out, ActOut act, const float* bias, int N, int OC, cudaStream_t stream,
               const char* op) {
  if (N < 0 || OC <= 0)
    throw Error(std::string("hpct::kernels::cuda::") + op + ": need N >= 0 and OC > 0 (N=" + std::to_string(N) +
                ", OC=" + std::to_string(OC) + ")");
  const size_t n = (size_t)N * OC;
  if (n == 0) return;
  if (OC % 4 == 0 && aligned16(pre) && aligned_out(pre_out) && aligned_out(act) && aligned16(bias))
    bias_gelu_kernel<4><<<blocks_for(n / 4), kThreads, 0, stream>>>(pre, pre_out, act, bias, OC / 4, n / 4);
  else
    bias_gelu_kernel<1><<<blocks_for(n), kThreads, 0, stream>>>(pre, pre_out, act, bias, OC, n);
  check_launch(op);
}

}  // namespace

void residual_layernorm_forward(float* res, ActOut out, float* mean, float* rstd, const float* a, const float* b,
                                const float* weight, const float* bias, int N, int C, cudaStream_t stream) {
  norm<false, true>(res, out, mean, rstd, a, b, weight, bias, N, C, stream, "residual_layernorm_forward");
}

void residual_rmsnorm_forward(float* res, ActOut out, float* rstd, const float* a, const float* b, const float* weight,
                              int N, int C, cudaStream_t stream) {
  norm<true, true>(res, out, nullptr, rstd, a, b, weight, nullptr, N, C, stream, "residual_rmsnorm_forward");
}

void layernorm_forward(ActOut out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int N, int C, cudaStream_t stream) {
  norm<false, false>(nullptr, out, mean, rstd, inp, nullptr, weight, bias, N, C, stream, "layernorm_forward");
}

void rmsnorm_forward(ActOut out, float* rstd, const float* inp, const float* weight, int N, int C,
                     cudaStream_t stream) {
  norm<true, false>(nullptr, out, nullptr, rstd, inp, nullptr, weight, nullptr, N, C, stream, "rmsnorm_forward");
}

void bias_gelu_forward(float* pre, ActOut act, const float* bias, int N, int OC, cudaStream_t stream) {
  gelu_into(pre, ActOut{pre, nullptr, true}, act, bias, N, OC, stream, "bias_gelu_forward");
}

void bias_gelu_forward_narrow(const float* wide, uint16_t* pre, bool bf16, ActOut act, const float* bias, int N, int OC,
                              cudaStream_t stream) {
  gelu_into(wide, ActOut{nullptr, pre, bf16}, act, bias, N, OC, stream, "bias_gelu_forward_narrow");
}

void gelu_forward(ActOut out, const float* inp, size_t n, cudaStream_t stream) {
  // One row of n columns: the bias-free kernel, the input left as it is.
  if (n > (size_t)INT32_MAX) throw Error("hpct::kernels::cuda::gelu_forward: more than 2^31 - 1 elements");
  gelu_into(inp, ActOut{}, out, nullptr, 1, static_cast<int>(n), stream, "gelu_forward");
}

void swiglu_forward(ActOut out, const float* inp, size_t rows, int F, cudaStream_t stream) {
  const size_t n = rows * (size_t)F;
  if (n == 0) return;
  swiglu_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, inp, n, F);
  check_launch("swiglu_forward");
}

}  // namespace hpct::kernels::cuda
