// hpct/kernels/cuda_ops.hpp — CUDA kernels for the element-wise and per-row GPT-2 ops.
//
// What it is: the device twins of ops.hpp's gelu, residual, adamw and layernorm forward, with the
// same math and the same contracts (backward accumulates), on device pointers and an explicit
// stream. What it is not (yet): the whole model on a GPU; GEMMs and attention still run on the CPU
// path, and nothing here allocates or copies memory. Trade-off: one thread per element (per row
// for layernorm: a warp) with grid-stride loops: simple and bandwidth-bound, which these ops are.
// Declared only in CUDA builds (HPCT_HAVE_CUDA, set by lib/kernels when nvcc is found). Launch
// errors throw hpct::Error; kernels run asynchronously on `stream`.
#pragma once
#if defined(HPCT_HAVE_CUDA)
#include <cstddef>

#if defined(__CUDACC__)
#include <cuda_runtime_api.h>
#else
// The same type as the CUDA runtime's typedef, so host code needs no CUDA include directory.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#endif

namespace hpct::kernels::cuda {

/// GELU, tanh approximation (GPT-2), as hpct::kernels::gelu_forward.
void gelu_forward(float* out /*(n)*/, const float* inp /*(n)*/, size_t n, cudaStream_t stream);
/// dinp += gelu'(inp) * dout.
void gelu_backward(float* dinp /*(n)*/, const float* inp /*(n)*/, const float* dout /*(n)*/, size_t n,
                   cudaStream_t stream);
/// out = a + b; out may alias a or b.
void residual_forward(float* out /*(n)*/, const float* a /*(n)*/, const float* b /*(n)*/, size_t n, cudaStream_t stream);
/// AdamW as hpct::kernels::adamw_update (step is 1-based).
void adamw_update(float* param /*(n)*/, const float* grad /*(n)*/, float* m /*(n)*/, float* v /*(n)*/, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step, float grad_scale,
                  cudaStream_t stream);
/// LayerNorm, eps 1e-5, saving mean and rstd, as hpct::kernels::layernorm_forward.
void layernorm_forward(float* out /*(N,C)*/, float* mean /*(N)*/, float* rstd /*(N)*/, const float* inp /*(N,C)*/,
                       const float* weight /*(C)*/, const float* bias /*(C)*/, int N, int C, cudaStream_t stream);

}  // namespace hpct::kernels::cuda
#endif  // HPCT_HAVE_CUDA
