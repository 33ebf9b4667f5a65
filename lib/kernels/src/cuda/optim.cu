// The optimizer step on the device (declared in cuda_ops.hpp): one multi-tensor AdamW launch over
// every run of a rank's state (fp32 master, 16-bit or fp32 gradient, moments, the 16-bit copy
// written in the same pass), the gradient's sum of squares in a fixed order, and the 16-bit
// conversions the ZeRO engines need. Same formulas as cpu_optim.cpp (bias corrections computed on
// the host in double), so the CPU and GPU steps agree to rounding (the GPU may contract into FMAs).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

constexpr unsigned kSumBlocks = 1024;  // first-pass blocks of sum_squares at most (the second pass: one block)

// One block per tile of kAdamwTile elements of one run; the run found by binary search over the
// prefix sums of tiles (a few hundred runs: 8-9 steps, from L1).
__global__ void adamw_multi_kernel(const DeviceAdamwRun* runs, const unsigned* first_tile, int count, float lr,
                                   float beta1, float beta2, float eps, float bc1, float bc2, float grad_scale,
                                   bool bf16) {
  const unsigned tile = blockIdx.x;
  int lo = 0, hi = count - 1;
  while (lo < hi) {  // the last run whose first tile is <= tile
    const int mid = (lo + hi + 1) / 2;
    if (first_tile[mid] <= tile) lo = mid;
    else hi = mid - 1;
  }
  const DeviceAdamwRun r = runs[lo];
  const size_t begin = size_t(tile - first_tile[lo]) * kAdamwTile;
  const size_t end = begin + kAdamwTile < r.n ? begin + kAdamwTile : r.n;
  // cpu_optim.cpp's folded form and constants (computed in float from the same bias corrections).
  const float step_size = lr / bc1, inv_sqrt_bc2 = 1.0f / sqrtf(bc2), decay = 1.0f - lr * r.weight_decay;
  for (size_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float g = (r.grad ? r.grad[i] : half_value(r.grad16[i], bf16)) * grad_scale;
    const float mi = beta1 * r.m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * r.v[i] + (1.0f - beta2) * g * g;
    r.m[i] = mi;
    r.v[i] = vi;
    const float p = r.param[i] * decay - step_size * (mi / (sqrtf(vi) * inv_sqrt_bc2 + eps));
    r.param[i] = p;
    if (r.param16) r.param16[i] = half_bits(p, bf16);
  }
}

__device__ double block_sum(double s) {
  __shared__ double warps[32];
  s = warp_sum(s);
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  if (lane == 0) warps[w] = s;
  __syncthreads();
  s = threadIdx.x < blockDim.x / 32 ? warps[threadIdx.x] : 0.0;
  if (w == 0) s = warp_sum(s);
  return s;
}

__global__ void sum_squares_kernel(double* partial, const float* x, const uint16_t* x16, size_t n, bool bf16) {
  double s = 0;
  HPCT_GRID_STRIDE(i, n) {
    const double v = x ? x[i] : half_value(x16[i], bf16);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void count_zeros_kernel(double* partial, const float* x, const uint16_t* x16, size_t n) {
  double s = 0;
  HPCT_GRID_STRIDE(i, n) s += x ? (x[i] == 0.0f) : ((x16[i] & 0x7fffu) == 0);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* partial, unsigned count) {
  double s = 0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) partial[count] = s;
}

__global__ void narrow_half_kernel(uint16_t* dst, const float* src, size_t n, bool bf16) {
  HPCT_GRID_STRIDE(i, n) dst[i] = half_bits(src[i], bf16);
}

__global__ void add_half_kernel(uint16_t* acc, const uint16_t* x, size_t n, bool bf16) {
  HPCT_GRID_STRIDE(i, n) acc[i] = half_bits(half_value(acc[i], bf16) + half_value(x[i], bf16), bf16);
}

}  // namespace

void adamw_multi(const DeviceAdamwRun* runs, const unsigned* first_tile, int count, unsigned tiles, float lr,
                 float beta1, float beta2, float eps, float bc1, float bc2, float grad_scale, bool bf16,
                 cudaStream_t stream) {
  if (count == 0 || tiles == 0) return;
  adamw_multi_kernel<<<tiles, kThreads, 0, stream>>>(runs, first_tile, count, lr, beta1, beta2, eps, bc1, bc2,
                                                     grad_scale, bf16);
  check_launch("adamw_multi");
}

unsigned sum_squares_blocks(size_t n) {
  const unsigned b = blocks_for(n);
  return b < kSumBlocks ? (b ? b : 1) : kSumBlocks;
}

void sum_squares(double* partial, const float* x, const uint16_t* x16, size_t n, bool bf16, cudaStream_t stream) {
  const unsigned blocks = sum_squares_blocks(n);
  sum_squares_kernel<<<blocks, kThreads, 0, stream>>>(partial, x, x16, n, bf16);
  check_launch("sum_squares");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partial, blocks);
  check_launch("sum_squares (partials)");
}

void count_zeros(double* partial, const float* x, const uint16_t* x16, size_t n, cudaStream_t stream) {
  const unsigned blocks = sum_squares_blocks(n);
  count_zeros_kernel<<<blocks, kThreads, 0, stream>>>(partial, x, x16, n);
  check_launch("count_zeros");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partial, blocks);
  check_launch("count_zeros (partials)");
}

void narrow_half(uint16_t* dst, const float* src, size_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  narrow_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, n, bf16);
  check_launch("narrow_half");
}

void add_half(uint16_t* acc, const uint16_t* x, size_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  add_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(acc, x, n, bf16);
  check_launch("add_half");
}

}  // namespace hpct::kernels::cuda
