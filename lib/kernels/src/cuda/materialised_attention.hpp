// The CUDA backend's materialised attention (internal to lib/kernels): the kernel that serves where
// cuDNN's fused one does not (fp32, head sizes or options it refuses, --attention-kernel plain).
//
// What it is: per batch row, one strided-batched GEMM over the heads for q k^T (scaled), the causal
// softmax kernel (per-document masks through key_start), one for att v: the full T x T product
// (twice the causal FLOPs), with the (B, NH, T, T) probabilities as the op's state. Backward
// likewise, with a (B, NH, T, T) scratch for d(att) (and the dropped probabilities) kept between
// calls. GEMMs in fp32, or with cuBLAS allowed to round to 16 bits inside (CUBLAS_COMPUTE_32F_FAST_*),
// as the CPU's contract says; a 16-bit output is narrowed from the fp32 product.
// What it is not: the fused kernel (fused_attention.hpp), which the backend tries first.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "checks.hpp"
#include "hpct/kernels/dropout.hpp"
#include "hpct/kernels/operand.hpp"
#include "hpct/kernels/precision.hpp"

namespace hpct::kernels::cuda {

class MaterialisedAttention {
 public:
  MaterialisedAttention(cublasHandle_t blas, cudaStream_t stream) : blas_(blas), stream_(stream) {}
  /// The stream has been synchronised (or is about to be destroyed after one).
  ~MaterialisedAttention();
  MaterialisedAttention(const MaterialisedAttention&) = delete;
  MaterialisedAttention& operator=(const MaterialisedAttention&) = delete;

  /// y (B*T, C) from qkv (B*T, 3C); att: the B x NH x T x T probabilities, written.
  void forward(Output y, float* att, const float* qkv, int B, int T, int C, int NH, Precision p, const Dropout* drop,
               const int32_t* key_start);
  /// dqkv (B*T, 3C) += (accumulate) or = the gradient from dout (B*T, C).
  void backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                Precision p, const Dropout* drop, bool accumulate);
  size_t scratch_bytes() const { return scratch_.bytes + out_.bytes; }

 private:
  // Row-major C = alpha op(A) op(B) + beta C, `batch` times with element strides sA, sB, sC
  // (op(A) is M x K, op(B) K x N; lda/ldb/ldc are row strides).
  void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, long long sA, const float* B,
            int ldb, long long sB, float beta, float* Cm, int ldc, long long sC, int batch, Precision p);

  cublasHandle_t blas_;
  cudaStream_t stream_;
  DeviceSlot scratch_;  // d(att), the dropped probabilities
  DeviceSlot out_;      // a 16-bit output's fp32 values
};

}  // namespace hpct::kernels::cuda
