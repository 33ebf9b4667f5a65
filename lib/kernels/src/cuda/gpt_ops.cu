// CUDA kernels for the rest of the GPT-2 ops (declared in cuda_ops.hpp): embedding, layernorm
// backward, the fused softmax cross-entropy, bias broadcast and reduction, and the causal softmax
// of attention. The GEMMs around them are cuBLAS calls in ops_backend.cu.
//
// Same formulas as cpu_ops.cpp, so the two backends agree to rounding: the cross-entropy's
// normaliser is summed in double, as on the CPU; layernorm backward is the CPU's two-term form.
// Gradient reductions over rows (dbias, dweight) are two-pass column sums over chunks of rows, and
// the position table's sums over the batch are column loops: all deterministic. The token-embedding
// gradient scatters rows with atomicAdd (tokens repeat), so its summation order varies from run to
// run in the last bits.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"
#include "launch.cuh"

namespace hpct::kernels::cuda {
namespace {

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(std::string("hpct::kernels::cuda::") + op + ": " + what);
}

__global__ void widen_half_kernel(float* dst, const uint16_t* src, size_t n, bool bf16) {
  HPCT_GRID_STRIDE(i, n) {
    const uint16_t h = src[i];
    dst[i] = bf16 ? __uint_as_float(static_cast<unsigned>(h) << 16) : __half2float(__ushort_as_half(h));
  }
}

__global__ void add_widened_kernel(float* acc, const uint16_t* src, size_t n, bool bf16) {
  HPCT_GRID_STRIDE(i, n) {
    const uint16_t h = src[i];
    acc[i] += bf16 ? __uint_as_float(static_cast<unsigned>(h) << 16) : __half2float(__ushort_as_half(h));
  }
}

// fp32 -> bf16 bits as lib/kernels/src/bits.hpp's bf16_bits (not __float2bfloat16_rn, whose NaN
// payload may differ): round to nearest even, a NaN stays a quiet NaN.
__device__ inline uint16_t bf16_bits(float f) {
  const unsigned u = __float_as_uint(f);
  const unsigned rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
}

__global__ void accumulate_half_kernel(uint16_t* acc, const float* src, size_t n, bool bf16) {
  HPCT_GRID_STRIDE(i, n) {
    const uint16_t h = acc[i];
    if (bf16) acc[i] = bf16_bits(__uint_as_float(static_cast<unsigned>(h) << 16) + src[i]);
    else acc[i] = __half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(h)) + src[i]));
  }
}

__global__ void encoder_forward_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                       const int32_t* pos, int T, int C, size_t n) {
  HPCT_GRID_STRIDE(i, n) {
    const size_t bt = i / C, c = i % C;
    const int t = pos ? pos[bt] : (int)(bt % T);
    out[i] = wte[(size_t)tokens[bt] * C + c] + (wpe ? wpe[(size_t)t * C + c] : 0.0f);  // no table: rotary positions
  }
}

__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int32_t* tokens, int C, size_t n) {
  HPCT_GRID_STRIDE(i, n) {
    const size_t bt = i / C, c = i % C;
    atomicAdd(&dwte[(size_t)tokens[bt] * C + c], dout[i]);
  }
}

// dwpe[pos[bt]] += dout[bt]: positions repeat, so atomicAdd as for wte.
__global__ void encoder_backward_pos_kernel(float* dwpe, const float* dout, const int32_t* pos, int C, size_t n) {
  HPCT_GRID_STRIDE(i, n) {
    const size_t bt = i / C, c = i % C;
    atomicAdd(&dwpe[(size_t)pos[bt] * C + c], dout[i]);
  }
}

// dwpe[t][c] += sum over b of dout[b][t][c]: one thread per (t, c).
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  HPCT_GRID_STRIDE(i, (size_t)T * C) {
    float s = 0.0f;
    for (int b = 0; b < B; ++b) s += dout[(size_t)b * T * C + i];
    dwpe[i] += s;
  }
}

// One warp per row: dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)).
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                               const float* mean, const float* rstd, int N, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
    const float* x = inp + (size_t)row * C;
    const float* g = dout + (size_t)row * C;
    const float m = mean[row], rs = rstd[row];
    float a = 0.0f, b = 0.0f;
    for (int c = lane; c < C; c += 32) {
      const float dn = g[c] * weight[c];
      a += dn;
      b += dn * (x[c] - m) * rs;
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
    float* d = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
      const float xhat = (x[c] - m) * rs;
      d[c] += rs * (g[c] * weight[c] - a - xhat * b);
    }
  }
}

// RMSNorm: one warp per row: dinp += rstd * (dnorm - xhat * mean(dnorm * xhat)), xhat = x * rstd.
__global__ void rmsnorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                             const float* rstd, int N, int C) {
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  for (int row = blockIdx.x * warps + threadIdx.x / 32; row < N; row += gridDim.x * warps) {
    const float* x = inp + (size_t)row * C;
    const float* g = dout + (size_t)row * C;
    const float rs = rstd[row];
    float b = 0.0f;
    for (int c = lane; c < C; c += 32) b += g[c] * weight[c] * x[c] * rs;
    b = warp_sum(b) / C;
    float* d = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) d[c] += rs * (g[c] * weight[c] - x[c] * rs * b);
  }
}

// Column sums over rows in two passes, deterministic: each block sums a chunk of kChunkRows rows
// for 32 columns (8 rows at a time per column, then across the 8 in shared memory) into a
// partial, and the second pass adds a column's partials in chunk order. For the layernorm
// parameters it sums dout * xhat (into part_a) beside dout (part_b); for a bias, dout alone.
// RMSNorm's xhat has no mean (mean null), and no bias (out_b null: part_b is summed, not added).
constexpr int kChunkRows = 256;
constexpr int kColTile = 32, kRowLanes = 8;

// dout's values as fp32: its own, or 16-bit ones widened (bf16 when bf16, else IEEE half).
__device__ __forceinline__ float dout_value(const float* d, size_t k, bool) { return d[k]; }
__device__ __forceinline__ float dout_value(const uint16_t* d, size_t k, bool bf16) { return half_value(d[k], bf16); }

template <class D>
__global__ void column_partials_kernel(float* part_a, float* part_b, const D* dout, bool bf16, const float* inp,
                                       const float* mean, const float* rstd, int N, int C) {
  __shared__ float sa[kRowLanes][kColTile + 1], sb[kRowLanes][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  const int r0 = blockIdx.y * kChunkRows, r1 = min(N, r0 + kChunkRows);
  float a = 0.0f, b = 0.0f;
  if (c < C) {
    for (int n = r0 + threadIdx.y; n < r1; n += kRowLanes) {
      const size_t k = (size_t)n * C + c;
      const float g = dout_value(dout, k, bf16);
      b += g;
      if (inp) a += g * (inp[k] - (mean ? mean[n] : 0.0f)) * rstd[n];
    }
  }
  sa[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float ta = 0.0f, tb = 0.0f;
    for (int y = 0; y < kRowLanes; ++y) ta += sa[y][threadIdx.x], tb += sb[y][threadIdx.x];
    part_b[(size_t)blockIdx.y * C + c] = tb;
    if (part_a) part_a[(size_t)blockIdx.y * C + c] = ta;
  }
}

__global__ void column_finish_kernel(float* out_a, float* out_b, const float* part_a, const float* part_b, int chunks,
                                     int C) {
  HPCT_GRID_STRIDE(c, (size_t)C) {
    float ta = 0.0f, tb = 0.0f;
    for (int k = 0; k < chunks; ++k) {
      tb += part_b[(size_t)k * C + c];
      if (part_a) ta += part_a[(size_t)k * C + c];
    }
    if (out_b) out_b[c] += tb;
    if (out_a) out_a[c] += ta;
  }
}

int column_chunks(int N) { return (N + kChunkRows - 1) / kChunkRows; }

// out_b[c] += sum_n dout[n][c]; with inp, out_a[c] += sum_n dout * (inp - mean[n]) * rstd[n].
template <class D>
void column_sums(float* out_a, float* out_b, const D* dout, bool bf16, const float* inp, const float* mean,
                 const float* rstd, int N, int C, float* workspace, cudaStream_t stream, const char* op) {
  const int chunks = column_chunks(N);
  float* part_b = workspace;
  float* part_a = inp ? workspace + (size_t)chunks * C : nullptr;
  const dim3 grid((unsigned)((C + kColTile - 1) / kColTile), (unsigned)chunks), block(kColTile, kRowLanes);
  column_partials_kernel<<<grid, block, 0, stream>>>(part_a, part_b, dout, bf16, inp, mean, rstd, N, C);
  check_launch(op);
  column_finish_kernel<<<blocks_for((size_t)C), kThreads, 0, stream>>>(out_a, out_b, part_a, part_b, chunks, C);
  check_launch(op);
}

__global__ void add_bias_kernel(float* out, const float* bias, int OC, size_t n) {
  HPCT_GRID_STRIDE(i, n) out[i] += bias[i % OC];
}

// One warp per row of a (rows, T, T) stack of score matrices: row r = ((b * NH + h) * T + t) is
// query t; columns lo <= j <= t are softmaxed (lo = key_start[b][t], or 0), the rest set to 0 (the
// CPU keeps them zero too).
__global__ void causal_softmax_forward_kernel(float* att, int T, int NH, size_t rows, const int32_t* key_start) {
  const size_t warps = blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (size_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += (size_t)gridDim.x * warps) {
    const int t = (int)(r % T);
    const int lo = key_start ? key_start[(r / ((size_t)NH * T)) * T + t] : 0;
    float* a = att + r * T;
    float mx = -FLT_MAX;
    for (int j = lo + lane; j <= t; j += 32) mx = fmaxf(mx, a[j]);
    mx = warp_max(mx);
    float s = 0.0f;
    for (int j = lo + lane; j <= t; j += 32) {
      const float e = expf(a[j] - mx);
      a[j] = e;
      s += e;
    }
    const float inv = 1.0f / warp_sum(s);
    for (int j = lane; j < T; j += 32) a[j] = j >= lo && j <= t ? a[j] * inv : 0.0f;
  }
}

// In place on datt: dpre[t][j] = att[t][j] * (datt[t][j] - sum_k att[t][k] * datt[t][k]), 0 above
// the diagonal (the 1/sqrt(HS) scale is applied by the GEMMs that consume it).
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int T, size_t rows) {
  const size_t warps = blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (size_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += (size_t)gridDim.x * warps) {
    const int t = (int)(r % T);
    const float* a = att + r * T;
    float* d = datt + r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += a[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) d[j] = j <= t ? a[j] * (d[j] - dot) : 0.0f;
  }
}

// Dropout: one thread per element; the mask is dropout.hpp's, the CPU's bit for bit.
__global__ void dropout_kernel(float* x, size_t rows, int C, Dropout d, uint32_t thr, float s) {
  HPCT_GRID_STRIDE(i, rows * (size_t)C) {
    const long long row = d.first_row + (long long)(i / C);
    const uint64_t key = dropout_row_key(d.key, d.first_sample + row / d.T, (uint64_t)(row % d.T));
    x[i] = dropout_keep(key, (uint64_t)(i % C), thr) ? x[i] * s : 0.0f;
  }
}

// The row key of attention row r of a (B, NH, T, T) stack.
__device__ inline uint64_t attention_row_key(const Dropout& d, size_t r, int T, int NH) {
  const int i = (int)(r % T);
  const size_t bh = r / T;
  const int h = (int)(bh % NH);
  const long long b = (long long)(bh / NH);
  return dropout_row_key(d.key, d.first_sample + b, dropout_attention_code(d.head0 + h, i));
}

__global__ void attention_dropout_kernel(float* dst, const float* att, int T, int NH, size_t rows, Dropout d,
                                         uint32_t thr, float s) {
  const size_t warps = blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (size_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += (size_t)gridDim.x * warps) {
    const int t = (int)(r % T);
    const uint64_t key = attention_row_key(d, r, T, NH);
    const float* a = att + r * T;
    float* o = dst + r * T;
    for (int j = lane; j < T; j += 32) o[j] = j <= t && dropout_keep(key, (uint64_t)j, thr) ? a[j] * s : 0.0f;
  }
}

// As causal_softmax_backward_kernel with D = att * mask / (1-p) (the CPU's formula).
__global__ void causal_softmax_backward_dropout_kernel(float* datt, const float* att, int T, int NH, size_t rows,
                                                       Dropout d, uint32_t thr, float s) {
  const size_t warps = blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (size_t r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += (size_t)gridDim.x * warps) {
    const int t = (int)(r % T);
    const uint64_t key = attention_row_key(d, r, T, NH);
    const float* a = att + r * T;
    float* g = datt + r * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += 32) dot += (dropout_keep(key, (uint64_t)j, thr) ? a[j] * s : 0.0f) * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32)
      g[j] = j <= t ? (dropout_keep(key, (uint64_t)j, thr) ? a[j] * s : 0.0f) * g[j] - a[j] * dot : 0.0f;
  }
}

// One block per row, as the CPU: max and the normaliser (in double) over the V real columns, loss
// -log softmax[target]; the row becomes (softmax - onehot) * dloss, padding columns 0. A target < 0
// gives loss 0 and a zero row. Targets >= V were refused on the host.
// One block per row; the logits fp32 (Half false) or 16-bit in bf16's or IEEE half's format (the
// LM head's 16-bit logits: read as their fp32 values, the gradient rounded once on the way out).
template <bool Half>
__global__ void softmax_cross_entropy_kernel(float* logits, uint16_t* logits16, bool bf16, float* losses,
                                             const int32_t* targets, float dloss, int V, int Vp) {
  __shared__ float smax[kThreads / 32];
  __shared__ double ssum[kThreads / 32];
  const int row = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  float* xf = Half ? nullptr : logits + (size_t)row * Vp;
  uint16_t* xh = Half ? logits16 + (size_t)row * Vp : nullptr;
  auto x = [&](int j) { return Half ? half_value(xh[j], bf16) : xf[j]; };
  auto put = [&](int j, float v) {
    if (Half) xh[j] = half_bits(v, bf16);
    else xf[j] = v;
  };
  const int32_t tgt = targets[row];
  if (tgt < 0) {
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) put(j, 0.0f);
    if (threadIdx.x == 0) losses[row] = 0.0f;
    return;
  }
  float mx = -FLT_MAX;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x(j));
  mx = warp_max(mx);
  if (lane == 0) smax[warp] = mx;
  __syncthreads();
  mx = smax[0];
  for (int w = 1; w < nwarps; ++w) mx = fmaxf(mx, smax[w]);
  double s = 0.0;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += (double)expf(x(j) - mx);
  s = warp_sum(s);
  if (lane == 0) ssum[warp] = s;
  __syncthreads();
  double sum = 0.0;
  for (int w = 0; w < nwarps; ++w) sum += ssum[w];
  const float shifted_target = x(tgt) - mx;
  __syncthreads();  // every thread has read x[tgt] before the row is overwritten
  const float inv = (float)(1.0 / sum);
  for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
    const float p = j < V ? expf(x(j) - mx) * inv : 0.0f;
    put(j, j < V ? (p - (j == tgt ? 1.0f : 0.0f)) * dloss : 0.0f);
  }
  if (threadIdx.x == 0) losses[row] = (float)(log(sum) - (double)shifted_target);
}

}  // namespace

void widen_half(float* dst, const uint16_t* src, size_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  widen_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, src, n, bf16);
  check_launch("widen_half");
}

void add_widened(float* acc, const uint16_t* src, size_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  add_widened_kernel<<<blocks_for(n), kThreads, 0, stream>>>(acc, src, n, bf16);
  check_launch("add_widened");
}

void accumulate_half(uint16_t* acc, const float* src, size_t n, bool bf16, cudaStream_t stream) {
  if (n == 0) return;
  accumulate_half_kernel<<<blocks_for(n), kThreads, 0, stream>>>(acc, src, n, bf16);
  check_launch("accumulate_half");
}

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C,
                     const int32_t* pos, cudaStream_t stream) {
  const size_t n = (size_t)B * T * C;
  if (n == 0) return;
  encoder_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, tokens, wte, wpe, pos, T, C, n);
  check_launch("encoder_forward");
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                      const int32_t* pos, cudaStream_t stream) {
  const size_t n = (size_t)B * T * C;
  if (n == 0) return;
  if (dwte) {  // null: a frozen word embedding (ops.hpp)
    encoder_backward_wte_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dwte, dout, tokens, C, n);
    check_launch("encoder_backward");
  }
  if (!dwpe) return;  // no position table
  if (pos) encoder_backward_pos_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dwpe, dout, pos, C, n);
  else encoder_backward_wpe_kernel<<<blocks_for((size_t)T * C), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  check_launch("encoder_backward");
}

size_t column_sum_workspace(int N, int C) { return N > 0 && C > 0 ? 2 * (size_t)column_chunks(N) * C : 0; }

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C, float* workspace,
                        cudaStream_t stream) {
  require(N >= 0 && C > 0, "layernorm_backward", "need N >= 0 and C > 0");
  require(N < 65535 * kChunkRows, "layernorm_backward", "more than 16.7M rows in one call");
  if (N == 0) return;
  layernorm_backward_dinp_kernel<<<blocks_for((size_t)N * 32), kThreads, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                                       rstd, N, C);
  check_launch("layernorm_backward");
  column_sums(dweight, dbias, dout, true, inp, mean, rstd, N, C, workspace, stream, "layernorm_backward");
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int N, int C, float* workspace, cudaStream_t stream) {
  require(N >= 0 && C > 0, "rmsnorm_backward", "need N >= 0 and C > 0");
  require(N < 65535 * kChunkRows, "rmsnorm_backward", "more than 16.7M rows in one call");
  if (N == 0) return;
  rmsnorm_backward_dinp_kernel<<<blocks_for((size_t)N * 32), kThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, N, C);
  check_launch("rmsnorm_backward");
  column_sums(dweight, nullptr, dout, true, inp, nullptr, rstd, N, C, workspace, stream, "rmsnorm_backward");
}

void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream) {
  const size_t n = (size_t)N * OC;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n), kThreads, 0, stream>>>(out, bias, OC, n);
  check_launch("add_bias");
}

void bias_backward(float* dbias, const float* dout, int N, int OC, float* workspace, cudaStream_t stream) {
  require(N < 65535 * kChunkRows, "bias_backward", "more than 16.7M rows in one call");
  if (OC <= 0 || N <= 0) return;
  column_sums(nullptr, dbias, dout, true, nullptr, nullptr, nullptr, N, OC, workspace, stream, "bias_backward");
}

void bias_backward_half(float* dbias, const uint16_t* dout, bool bf16, int N, int OC, float* workspace,
                        cudaStream_t stream) {
  require(N < 65535 * kChunkRows, "bias_backward_half", "more than 16.7M rows in one call");
  if (OC <= 0 || N <= 0) return;
  column_sums(nullptr, dbias, dout, bf16, nullptr, nullptr, nullptr, N, OC, workspace, stream, "bias_backward_half");
}

void causal_softmax_forward(float* att, int T, int NH, size_t rows, const int32_t* key_start, cudaStream_t stream) {
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(att, T, NH, rows, key_start);
  check_launch("causal_softmax_forward");
}

void causal_softmax_backward(float* datt, const float* att, int T, size_t rows, cudaStream_t stream) {
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(datt, att, T, rows);
  check_launch("causal_softmax_backward");
}

void dropout(float* x, size_t rows, int C, const Dropout& d, cudaStream_t stream) {
  require(C > 0 && d.T > 0 && d.p >= 0.0f && d.p < 1.0f, "dropout", "need C > 0, T > 0 and 0 <= p < 1");
  if (!d.on() || rows == 0) return;
  dropout_kernel<<<blocks_for(rows * (size_t)C), kThreads, 0, stream>>>(x, rows, C, d, d.threshold(), d.scale());
  check_launch("dropout");
}

void attention_dropout(float* dst, const float* att, int T, int NH, size_t rows, const Dropout& d,
                       cudaStream_t stream) {
  if (rows == 0) return;
  attention_dropout_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(dst, att, T, NH, rows, d, d.threshold(),
                                                                          d.scale());
  check_launch("attention_dropout");
}

void causal_softmax_backward_dropout(float* datt, const float* att, int T, int NH, size_t rows, const Dropout& d,
                                     cudaStream_t stream) {
  if (rows == 0) return;
  causal_softmax_backward_dropout_kernel<<<blocks_for(rows * 32), kThreads, 0, stream>>>(datt, att, T, NH, rows, d,
                                                                                        d.threshold(), d.scale());
  check_launch("causal_softmax_backward_dropout");
}

namespace {
// One launch for both forms of the logits (fp32, or 16-bit in bf16's or IEEE half's format).
template <bool Half>
void launch_cross_entropy(float* logits, uint16_t* logits16, bool bf16, float* losses, const int32_t* targets,
                          float dloss, int N, int V, int Vp, cudaStream_t stream, const char* op) {
  require(N >= 0 && V > 0 && Vp >= V, op, "need 0 < V <= Vp (V=" + std::to_string(V) + ", Vp=" + std::to_string(Vp) + ")");
  if (N == 0) return;
  softmax_cross_entropy_kernel<Half><<<N, kThreads, 0, stream>>>(logits, logits16, bf16, losses, targets, dloss, V, Vp);
  check_launch(op);
}
}  // namespace

void softmax_cross_entropy(float* logits_inout, float* losses, const int32_t* targets, float dloss, int N, int V,
                           int Vp, cudaStream_t stream) {
  launch_cross_entropy<false>(logits_inout, nullptr, false, losses, targets, dloss, N, V, Vp, stream,
                              "softmax_cross_entropy");
}

void softmax_cross_entropy_half(uint16_t* logits_inout, float* losses, const int32_t* targets, float dloss, int N, int V,
                                int Vp, bool bf16, cudaStream_t stream) {
  launch_cross_entropy<true>(nullptr, logits_inout, bf16, losses, targets, dloss, N, V, Vp, stream,
                             "softmax_cross_entropy_half");
}

}  // namespace hpct::kernels::cuda
