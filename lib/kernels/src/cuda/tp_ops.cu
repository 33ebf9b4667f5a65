// CUDA twins of tp_ops.hpp (declared in cuda_ops.hpp): the vocab-parallel embedding's and cross
// entropy's rows.
//
// One thread per output element for the row copies, the position adds and the cross entropy's last
// pass; one block per row for the maxima and the sums (sums in double, as on the CPU, in another
// order). The slice's embedding gradient adds with atomicAdd, as the whole embedding's does
// (gpt_ops.cu): ids repeat, so its sums' order is not fixed.
#include <cuda_runtime.h>

#include <cmath>

#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

__global__ void vocab_rows_kernel(float* out, const float* part, const int32_t* ids, size_t N, int width, int first,
                                  int count) {
  HPCT_GRID_STRIDE(e, N * width) {
    const size_t i = e / width, c = e % width;
    const long long r = (long long)ids[i] - first;
    out[e] = r >= 0 && r < count ? part[(size_t)r * width + c] : 0.0f;
  }
}

__global__ void vocab_rows_backward_kernel(float* dpart, const float* dout, const int32_t* ids, size_t N, int width,
                                           int first, int count) {
  HPCT_GRID_STRIDE(e, N * width) {
    const size_t i = e / width, c = e % width;
    const long long r = (long long)ids[i] - first;
    if (r >= 0 && r < count) atomicAdd(&dpart[(size_t)r * width + c], dout[e]);
  }
}

__global__ void add_position_rows_kernel(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows,
                                         int T, int C) {
  HPCT_GRID_STRIDE(e, rows * C) {
    const size_t k = e / C, c = e % C, i = first + k;
    out[e] += wpe[(pos ? (size_t)pos[i] : i % T) * C + c];
  }
}

// One block per row: the maximum of its real columns.
__global__ void vocab_ce_max_kernel(float* mx, const float* logits, int vl, int valid) {
  __shared__ float smax[kThreads / 32];
  const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const float* x = logits + (size_t)row * vl;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, x[j]);
  m = warp_max(m);
  if (lane == 0) smax[warp] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  m = smax[0];
  for (int w = 1; w < nwarps; ++w) m = fmaxf(m, smax[w]);
  mx[row] = m;
}

// One block per row: the sum of exponentials over its real columns, and the target's shifted logit.
__global__ void vocab_ce_sums_kernel(double* sums, const float* logits, const float* mx, const int32_t* targets,
                                     int rows, int vl, int vstart, int valid) {
  __shared__ double ssum[kThreads / 32];
  const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  const float* x = logits + (size_t)row * vl;
  const float m = mx[row];
  double s = 0.0;
  for (int j = threadIdx.x; j < valid; j += blockDim.x) s += (double)expf(x[j] - m);
  s = warp_sum(s);
  if (lane == 0) ssum[warp] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  double sum = 0.0;
  for (int w = 0; w < nwarps; ++w) sum += ssum[w];
  sums[row] = sum;
  const long long t = (long long)targets[row] - vstart;
  sums[rows + row] = targets[row] >= 0 && t >= 0 && t < valid ? (double)(x[t] - m) : 0.0;
}

__global__ void vocab_ce_losses_kernel(float* losses, const double* sums, const int32_t* targets, int rows) {
  HPCT_GRID_STRIDE(i, (size_t)rows) losses[i] = targets[i] < 0 ? 0.0f : (float)(log(sums[i]) - sums[rows + i]);
}

__global__ void vocab_ce_grad_kernel(float* logits, const float* mx, const double* sums, const int32_t* targets,
                                     float dloss, int rows, int vl, int vstart, int valid) {
  HPCT_GRID_STRIDE(e, (size_t)rows * vl) {
    const size_t i = e / vl;
    const int j = (int)(e % vl);
    if (targets[i] < 0 || j >= valid) {
      logits[e] = 0.0f;
      continue;
    }
    const float g = (float)(dloss / sums[i]);
    float v = expf(logits[e] - mx[i]) * g;
    if ((long long)targets[i] - vstart == j) v -= dloss;
    logits[e] = v;
  }
}

}  // namespace

void vocab_rows(float* out, const float* part, const int32_t* ids, size_t N, int width, int first, int count,
                cudaStream_t stream) {
  if (N == 0 || width == 0) return;
  vocab_rows_kernel<<<blocks_for(N * width), kThreads, 0, stream>>>(out, part, ids, N, width, first, count);
  check_launch("vocab_rows");
}

void vocab_rows_backward(float* dpart, const float* dout, const int32_t* ids, size_t N, int width, int first, int count,
                         cudaStream_t stream) {
  if (N == 0 || width == 0) return;
  vocab_rows_backward_kernel<<<blocks_for(N * width), kThreads, 0, stream>>>(dpart, dout, ids, N, width, first, count);
  check_launch("vocab_rows_backward");
}

void add_position_rows(float* out, const float* wpe, const int32_t* pos, size_t first, size_t rows, int T, int C,
                       cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  add_position_rows_kernel<<<blocks_for(rows * C), kThreads, 0, stream>>>(out, wpe, pos, first, rows, T, C);
  check_launch("add_position_rows");
}

void vocab_ce_max(float* mx, const float* logits, int rows, int vl, int valid, cudaStream_t stream) {
  if (rows <= 0) return;
  vocab_ce_max_kernel<<<rows, kThreads, 0, stream>>>(mx, logits, vl, valid);
  check_launch("vocab_ce_max");
}

void vocab_ce_sums(double* sums, const float* logits, const float* mx, const int32_t* targets, int rows, int vl,
                   int vstart, int valid, cudaStream_t stream) {
  if (rows <= 0) return;
  vocab_ce_sums_kernel<<<rows, kThreads, 0, stream>>>(sums, logits, mx, targets, rows, vl, vstart, valid);
  check_launch("vocab_ce_sums");
}

void vocab_ce_finish(float* logits, float* losses, const float* mx, const double* sums, const int32_t* targets,
                     float dloss, int rows, int vl, int vstart, int valid, bool backward, cudaStream_t stream) {
  if (rows <= 0) return;
  vocab_ce_losses_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(losses, sums, targets, rows);
  check_launch("vocab_ce_finish");
  if (!backward) return;
  const size_t n = (size_t)rows * vl;
  vocab_ce_grad_kernel<<<blocks_for(n), kThreads, 0, stream>>>(logits, mx, sums, targets, dloss, rows, vl, vstart,
                                                               valid);
  check_launch("vocab_ce_finish");
}

}  // namespace hpct::kernels::cuda
