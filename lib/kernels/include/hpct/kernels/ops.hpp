// hpct/kernels/ops.hpp — forward and backward of every GPT op, CPU backend.
//
// Conventions as llm.c: row-major fp32 buffers, raw pointers, shapes in comments; every backward
// ACCUMULATES (+=) into the gradients it writes, so the caller zeroes gradients once per step.
// GEMMs go through gemm() with a compute Precision (bf16/fp16 round the inputs; accumulation and
// outputs stay fp32). Element-wise and per-row work runs through Kokkos so it can move to other
// Kokkos backends; the CUDA backend (cuda_ops.hpp) implements the same ops on device pointers.
// Dimension letters: B batch, T sequence, C channels, NH heads, N rows (= B*T), OC output
// channels, V vocabulary, Vp padded vocabulary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace hpct::kernels {

enum class Precision { fp32, bf16, fp16 };

/// Initialises Kokkos once per process (ref-counted) and pins OpenBLAS/OpenMP to one thread per
/// rank (we run one MPI rank per core); finalizes at the last destruction.
class BackendScope {
 public:
  BackendScope();
  ~BackendScope();
  BackendScope(const BackendScope&) = delete;
  BackendScope& operator=(const BackendScope&) = delete;
};
std::string backend_description();

/// C = alpha * op(A) * op(B) + beta * C. fp32: OpenBLAS sgemm. bf16: inputs rounded to bfloat16
/// (round to nearest even) and multiplied by oneDNN (AMX / AVX512-BF16), fp32 accumulation.
/// fp16: inputs rounded to IEEE half (beyond 65504 -> inf), then sgemm.
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
          int ldb, float beta, float* C, int ldc, Precision p = Precision::fp32);

void encoder_forward(float* out /*(B,T,C)*/, const int32_t* tokens /*(B,T)*/, const float* wte /*(V,C)*/,
                     const float* wpe /*(maxT,C)*/, int B, int T, int C);
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);
/// eps = 1e-5; mean and rstd (N) are saved for backward.
void layernorm_forward(float* out /*(N,C)*/, float* mean, float* rstd, const float* inp /*(N,C)*/, const float* weight,
                       const float* bias, int N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int N, int C);
/// out = inp @ weight^T + bias, weight (OC, C) as nn.Linear; bias may be null.
void matmul_forward(float* out /*(N,OC)*/, const float* inp /*(N,C)*/, const float* weight /*(OC,C)*/,
                    const float* bias /*(OC)*/, int N, int C, int OC, Precision p = Precision::fp32);
/// dinp and dbias may be null (skipped).
void matmul_backward(float* dinp /*(N,C)*/, float* dweight /*(OC,C)*/, float* dbias /*(OC)*/, const float* dout /*(N,OC)*/,
                     const float* inp, const float* weight, int N, int C, int OC, Precision p = Precision::fp32);
/// Causal multi-head attention; qkv (B,T,3C) holds q, k, v side by side; att (B,NH,T,T) saves the
/// probabilities (upper triangle 0). Scale 1/sqrt(C/NH).
void attention_forward(float* out /*(B,T,C)*/, float* att, const float* qkv, int B, int T, int C, int NH,
                       Precision p = Precision::fp32);
void attention_backward(float* dqkv /*(B,T,3C)*/, const float* dout /*(B,T,C)*/, const float* qkv, const float* att,
                        int B, int T, int C, int NH, Precision p = Precision::fp32);
/// GELU, tanh approximation (GPT-2).
void gelu_forward(float* out, const float* inp, size_t n);
void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n);
/// out = a + b (out may alias a or b).
void residual_forward(float* out, const float* a, const float* b, size_t n);
/// Fused softmax + cross-entropy, in place: logits (N,Vp) in, dlogits = (softmax - onehot) * dloss
/// out (padding columns >= V ignored and set to 0); losses[i] = -log p[target]. target < 0: ignored
/// (loss 0, gradient row 0).
void softmax_cross_entropy(float* logits_inout, float* losses /*(N)*/, const int32_t* targets /*(N)*/, float dloss,
                           int N, int V, int Vp);
/// AdamW, decoupled weight decay; g = grad * grad_scale; step is 1-based (bias correction).
void adamw_update(float* param, const float* grad, float* m, float* v, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int step, float grad_scale);
double sum_of_squares(const float* x, size_t n);
bool all_finite(const float* x, size_t n);
void scale(float* x, float s, size_t n);

}  // namespace hpct::kernels
