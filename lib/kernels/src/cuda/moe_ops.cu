// CUDA twins of moe_ops.hpp (declared in cuda_ops.hpp): the MoE layer's row moves and mixes.
//
// One thread per output element for the copies and mixes (a token's routes summed in k order, as
// on the CPU); one warp per route for the combine weights' gradient and per token for the residual
// mix's coefficient gradient (dot products over C, in double as on the CPU, summed in another
// order). Deterministic: no atomics, every output written by one thread.
#include <cuda_runtime.h>

#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

__global__ void gather_rows_kernel(float* dst, const float* src, const int32_t* rows, size_t n, int C) {
  HPCT_GRID_STRIDE(e, n * C) {
    const size_t i = e / C, c = e % C;
    dst[e] = src[(size_t)rows[i] * C + c];
  }
}

__global__ void scatter_rows_kernel(float* dst, const float* src, const int32_t* rows, size_t n, int C) {
  HPCT_GRID_STRIDE(e, n * C) {
    const size_t i = e / C, c = e % C;
    dst[(size_t)rows[i] * C + c] = src[e];
  }
}

__global__ void combine_kernel(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K,
                               int C) {
  HPCT_GRID_STRIDE(e, (size_t)N * C) {
    const size_t t = e / C, c = e % C;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) {
      const int32_t p = pos[t * K + k];
      if (p >= 0) acc += weight[t * K + k] * y[(size_t)p * C + c];
    }
    out[e] = acc;
  }
}

// One warp per route: its dy row and its weight's gradient.
__global__ void combine_backward_kernel(float* dy, float* dweight, const float* dout, const float* y,
                                        const int32_t* pos, const float* weight, int N, int K, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const size_t routes = (size_t)N * K;
  for (size_t i = blockIdx.x * (size_t)warps + threadIdx.x / 32; i < routes; i += (size_t)gridDim.x * warps) {
    const int32_t p = pos[i];
    if (p < 0) {
      if (lane == 0) dweight[i] = 0.0f;
      continue;
    }
    const float w = weight[i];
    const float* g = dout + (i / K) * C;
    const float* yr = y + (size_t)p * C;
    float* dyr = dy + (size_t)p * C;
    double dw = 0;
    for (int c = lane; c < C; c += 32) dyr[c] = w * g[c], dw += (double)g[c] * yr[c];
    dw = warp_sum(dw);
    if (lane == 0) dweight[i] = static_cast<float>(dw);
  }
}

__global__ void dispatch_backward_kernel(float* dx, const float* drows, const int32_t* pos, int N, int K, int C) {
  HPCT_GRID_STRIDE(e, (size_t)N * C) {
    const size_t t = e / C, c = e % C;
    float acc = dx[e];
    for (int k = 0; k < K; ++k) {
      const int32_t p = pos[t * K + k];
      if (p >= 0) acc += drows[(size_t)p * C + c];
    }
    dx[e] = acc;
  }
}

__global__ void multiply_kernel(float* out, const float* a, const float* b, size_t n, bool accumulate) {
  HPCT_GRID_STRIDE(i, n)
    out[i] = accumulate ? out[i] + a[i] * b[i] : a[i] * b[i];
}

// One warp per token: the softmax of its two logits (every lane computes it), then the mix.
__global__ void residual_mix_kernel(float* out, float* coef, const float* moe, const float* dense, int N, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int t = blockIdx.x * warps + threadIdx.x / 32; t < N; t += gridDim.x * warps) {
    float* c2 = coef + (size_t)t * 2;
    const float l0 = c2[0], l1 = c2[1];
    const float mx = fmaxf(l0, l1);
    const float e0 = expf(l0 - mx), e1 = expf(l1 - mx);
    const float c0 = e0 / (e0 + e1), c1 = e1 / (e0 + e1);
    __syncwarp();
    if (lane == 0) c2[0] = c0, c2[1] = c1;
    for (int c = lane; c < C; c += 32) {
      const size_t i = (size_t)t * C + c;
      out[i] = c0 * moe[i] + c1 * dense[i];
    }
  }
}

__global__ void residual_mix_backward_kernel(float* dmoe, float* ddense, float* dlogits, const float* dout,
                                             const float* coef, const float* moe, const float* dense, int N, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int t = blockIdx.x * warps + threadIdx.x / 32; t < N; t += gridDim.x * warps) {
    const float c0 = coef[(size_t)t * 2], c1 = coef[(size_t)t * 2 + 1];
    double g0 = 0, g1 = 0;
    for (int c = lane; c < C; c += 32) {
      const size_t i = (size_t)t * C + c;
      dmoe[i] = c0 * dout[i];
      ddense[i] = c1 * dout[i];
      g0 += (double)dout[i] * moe[i];
      g1 += (double)dout[i] * dense[i];
    }
    g0 = warp_sum(g0), g1 = warp_sum(g1);
    if (lane == 0) {
      const double dot = c0 * g0 + c1 * g1;
      dlogits[(size_t)t * 2] = static_cast<float>(c0 * (g0 - dot));
      dlogits[(size_t)t * 2 + 1] = static_cast<float>(c1 * (g1 - dot));
    }
  }
}

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(std::string("hpct::kernels::cuda::") + op + ": " + what);
}

}  // namespace

void gather_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C, cudaStream_t stream) {
  require(C > 0, "gather_rows", "need C > 0, got " + std::to_string(C));
  if (n == 0) return;
  gather_rows_kernel<<<blocks_for(n * C), kThreads, 0, stream>>>(dst, src, rows, n, C);
  check_launch("gather_rows");
}

void scatter_rows(float* dst, const float* src, const int32_t* rows, size_t n, int C, cudaStream_t stream) {
  require(C > 0, "scatter_rows", "need C > 0, got " + std::to_string(C));
  if (n == 0) return;
  scatter_rows_kernel<<<blocks_for(n * C), kThreads, 0, stream>>>(dst, src, rows, n, C);
  check_launch("scatter_rows");
}

void moe_combine(float* out, const float* y, const int32_t* pos, const float* weight, int N, int K, int C,
                 cudaStream_t stream) {
  require(N >= 0 && K > 0 && C > 0, "moe_combine", "need N >= 0, K > 0, C > 0");
  if (N == 0) return;
  combine_kernel<<<blocks_for((size_t)N * C), kThreads, 0, stream>>>(out, y, pos, weight, N, K, C);
  check_launch("moe_combine");
}

void moe_combine_backward(float* dy, float* dweight, const float* dout, const float* y, const int32_t* pos,
                          const float* weight, int N, int K, int C, cudaStream_t stream) {
  require(N >= 0 && K > 0 && C > 0, "moe_combine_backward", "need N >= 0, K > 0, C > 0");
  if (N == 0) return;
  combine_backward_kernel<<<blocks_for((size_t)N * K * 32), kThreads, 0, stream>>>(dy, dweight, dout, y, pos, weight,
                                                                                   N, K, C);
  check_launch("moe_combine_backward");
}

void moe_dispatch_backward(float* dx, const float* drows, const int32_t* pos, int N, int K, int C,
                           cudaStream_t stream) {
  require(N >= 0 && K > 0 && C > 0, "moe_dispatch_backward", "need N >= 0, K > 0, C > 0");
  if (N == 0) return;
  dispatch_backward_kernel<<<blocks_for((size_t)N * C), kThreads, 0, stream>>>(dx, drows, pos, N, K, C);
  check_launch("moe_dispatch_backward");
}

void multiply(float* out, const float* a, const float* b, size_t n, bool accumulate, cudaStream_t stream) {
  if (n == 0) return;
  multiply_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, a, b, n, accumulate);
  check_launch("multiply");
}

void residual_mix(float* out, float* coef, const float* moe, const float* dense, int N, int C, cudaStream_t stream) {
  require(N >= 0 && C > 0, "residual_mix", "need N >= 0, C > 0");
  if (N == 0) return;
  residual_mix_kernel<<<blocks_for((size_t)N * 32), kThreads, 0, stream>>>(out, coef, moe, dense, N, C);
  check_launch("residual_mix");
}

void residual_mix_backward(float* dmoe, float* ddense, float* dlogits, const float* dout, const float* coef,
                           const float* moe, const float* dense, int N, int C, cudaStream_t stream) {
  require(N >= 0 && C > 0, "residual_mix_backward", "need N >= 0, C > 0");
  if (N == 0) return;
  residual_mix_backward_kernel<<<blocks_for((size_t)N * 32), kThreads, 0, stream>>>(dmoe, ddense, dlogits, dout, coef,
                                                                                     moe, dense, N, C);
  check_launch("residual_mix_backward");
}

}  // namespace hpct::kernels::cuda
