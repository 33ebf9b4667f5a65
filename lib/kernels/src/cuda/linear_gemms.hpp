// The CUDA backend's linear-layer GEMMs (internal to lib/kernels): out = inp W^T and its two
// gradients, on fp32 or on native 16-bit inputs.
//
// What it is: the choice of inputs for each product, and the cuBLAS calls. In a bf16/fp16 op the
// products run on 16-bit inputs (cuBLAS's bf16/fp16 tensor-core kernels, fp32 output and
// accumulation) when the layer's input and weight both come in 16 bits (operand.hpp: a weight's
// stored copy, an activation written narrow; a backward then narrows its output gradient once for
// its two products), and a product runs on them when one of its inputs comes only in 16 bits (the
// other narrowed); otherwise on the fp32 inputs with cuBLAS allowed to round them to 16 bits inside
// the kernel (CUBLAS_COMPUTE_32F_FAST_16BF / _16F), as before there were 16-bit operands. Either
// way the inputs are rounded to nearest even and the products summed in fp32: the CPU's contract.
// A bias, where the forward is given one on 16-bit inputs, goes into the GEMM (cuBLASLt's BIAS
// epilogue: bias_gemm.hpp); elsewhere it is added in a pass after the GEMM.
// What it is not: attention's batched products (ops_backend.cu) or a tuned plan search.
// Trade-off: narrowing costs a pass over the input (6 bytes an element): paid for an output
// gradient that two products then read at 2 bytes, and where an input has no fp32 form; never for
// an input that a product can read once in fp32, so a 16-bit weight beside an fp32 activation
// changes nothing until the activation comes in 16 bits too.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <memory>

#include "bias_gemm.hpp"
#include "checks.hpp"
#include "hpct/kernels/operand.hpp"
#include "hpct/kernels/precision.hpp"

namespace hpct::kernels::cuda {

class LinearGemms {
 public:
  LinearGemms(cublasHandle_t blas, cudaStream_t stream)
      : blas_(blas), stream_(stream), bias_(std::make_unique<BiasGemm>(stream)) {}
  /// The stream has been synchronised (or is about to be destroyed after one).
  ~LinearGemms();
  LinearGemms(const LinearGemms&) = delete;
  LinearGemms& operator=(const LinearGemms&) = delete;

  /// out (N, OC) = inp (N, C) weight (OC, C)^T (+ bias (OC), where given).
  void forward(float* out, Operand inp, Operand weight, int N, int C, int OC, Precision p,
               const float* bias = nullptr);
  /// out (N, OC) in p's 16 bits (the LM head's logits): on 16-bit inputs a 16-bit product (fp32
  /// accumulation, rounded once); on fp32 ones the fp32 product narrowed.
  void forward_half(uint16_t* out, Operand inp, Operand weight, int N, int C, int OC, Precision p);
  /// From dout (N, OC): dinp (N, C) = beta dinp + dout weight (skipped when dinp is null) and
  /// dweight (OC, C) += dout^T inp (skipped when dweight is null). dout in either form or both
  /// (its 16-bit form is used as it is; an fp32 product widens it).
  void backward(float* dinp, float beta, float* dweight, Operand dout, Operand inp, Operand weight, int N, int C,
                int OC, Precision p);
  /// Bytes of the narrowing buffers kept between calls.
  size_t scratch_bytes() const {
    return slots_[0].bytes + slots_[1].bytes + slots_[2].bytes + wide_.bytes + bias_->scratch_bytes();
  }

 private:
  // Row-major C (M, N) = op(A) op(B) + beta C with op(A) (M, K) and op(B) (K, N); elements fp32
  // (half = false) or 16-bit in p's format.
  void gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, float beta,
            void* Cm, int ldc, bool half, Precision p, bool half_out = false);
  // x's 16-bit values: its own, or its fp32 ones narrowed into slot s.
  const uint16_t* narrow(Operand x, size_t n, Precision p, int s);
  static const float* fp32(Operand x, const char* what);

  cublasHandle_t blas_;
  cudaStream_t stream_;
  DeviceSlot slots_[3];  // 0, 1: a product's inputs; 2: the backward's output gradient
  DeviceSlot wide_;      // an fp32 product's 16-bit output before narrowing, or a 16-bit dout widened
  std::unique_ptr<BiasGemm> bias_;
};

}  // namespace hpct::kernels::cuda
