// The CUDA backend's materialised attention (materialised_attention.hpp). Row-major products through
// column-major cuBLAS: C^T = op(B)^T op(A)^T, B passed first, M and N swapped.
#include "materialised_attention.hpp"

#include <cmath>
#include <string>

#include "checks.hpp"
#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"

namespace hpct::kernels::cuda {
namespace {

cublasComputeType_t compute_type(Precision p) {
  switch (p) {
    case Precision::bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case Precision::fp16: return CUBLAS_COMPUTE_32F_FAST_16F;
    default: return CUBLAS_COMPUTE_32F;
  }
}

}  // namespace

MaterialisedAttention::~MaterialisedAttention() {
  scratch_.release(stream_);
  out_.release(stream_);
}

void MaterialisedAttention::gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                                 long long sA, const float* B, int ldb, long long sB, float beta, float* Cm, int ldc,
                                 long long sC, int batch, Precision p) {
  if (M == 0 || N == 0 || batch == 0) return;
  check(cublasGemmStridedBatchedEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K,
                                   &alpha, B, CUDA_R_32F, ldb, sB, A, CUDA_R_32F, lda, sA, &beta, Cm, CUDA_R_32F, ldc,
                                   sC, batch, compute_type(p), CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx (" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + ")");
}

void MaterialisedAttention::forward(Output y, float* att, const float* qkv, int B, int T, int C, int NH, Precision p,
                                    const Dropout* drop, const int32_t* key_start) {
  // The products are fp32: a 16-bit output is narrowed from them.
  float* out = y.h ? static_cast<float*>(out_.grown((size_t)B * T * C * sizeof(float), stream_, "a 16-bit attention output's fp32 values")) : y.f;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt((float)HS);
  const long long TT = (long long)T * T;
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + (size_t)b * T * 3 * C;
    // att[h] = scale * q_h k_h^T for every head h at once
    gemm(false, true, T, T, HS, scale, q, 3 * C, HS, q + C, 3 * C, HS, 0.0f, att + (size_t)b * NH * TT, T, TT, NH, p);
  }
  causal_softmax_forward(att, T, NH, (size_t)B * NH * T, key_start, stream_);
  // With attention dropout the values see the dropped probabilities (in the scratch); att keeps
  // the softmax for backward.
  const float* probs = att;
  if (drop && drop->on()) {
    float* dropped = static_cast<float*>(scratch_.grown((size_t)B * NH * TT * sizeof(float), stream_, "the attention dropout's probabilities"));
    attention_dropout(dropped, att, T, NH, (size_t)B * NH * T, *drop, stream_);
    probs = dropped;
  }
  for (int b = 0; b < B; ++b) {
    const float* v = qkv + (size_t)b * T * 3 * C + 2 * C;
    gemm(false, false, T, HS, T, 1.0f, probs + (size_t)b * NH * TT, T, TT, v, 3 * C, HS, 0.0f, out + (size_t)b * T * C,
         C, HS, NH, p);
  }
  if (y.h) narrow_half(y.h, out, (size_t)B * T * C, y.p == Precision::bf16, stream_);
}

void MaterialisedAttention::backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                                     int C, int NH, Precision p, const Dropout* drop, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  const int HS = C / NH;
  const float scale = 1.0f / std::sqrt((float)HS);
  const long long TT = (long long)T * T;
  const size_t rows = (size_t)B * NH * T;
  const bool dropping = drop && drop->on();
  // With dropout the scratch holds d(att) and, after it, the dropped probabilities the values saw.
  float* datt = static_cast<float*>(
      scratch_.grown((size_t)B * NH * TT * (dropping ? 2 : 1) * sizeof(float), stream_, "the attention backward's scratch"));
  const float* probs = att;
  if (dropping) {
    float* dropped = datt + (size_t)B * NH * TT;
    attention_dropout(dropped, att, T, NH, rows, *drop, stream_);
    probs = dropped;
  }
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + (size_t)b * T * 3 * C;
    const float* d = dout + (size_t)b * T * C;
    float* da = datt + (size_t)b * NH * TT;
    const float* a = probs + (size_t)b * NH * TT;
    float* dv = dqkv + (size_t)b * T * 3 * C + 2 * C;
    gemm(false, true, T, T, HS, 1.0f, d, C, HS, q + 2 * C, 3 * C, HS, 0.0f, da, T, TT, NH, p);  // d(att) = dout v^T
    gemm(true, false, T, HS, T, 1.0f, a, T, TT, d, C, HS, beta, dv, 3 * C, HS, NH, p);         // dv += att^T dout
  }
  if (dropping)
    causal_softmax_backward_dropout(datt, att, T, NH, rows, *drop, stream_);
  else
    causal_softmax_backward(datt, att, T, rows, stream_);  // d(att) -> d(scores)
  for (int b = 0; b < B; ++b) {
    const float* q = qkv + (size_t)b * T * 3 * C;
    const float* ds = datt + (size_t)b * NH * TT;
    float* dq = dqkv + (size_t)b * T * 3 * C;
    gemm(false, false, T, HS, T, scale, ds, T, TT, q + C, 3 * C, HS, beta, dq, 3 * C, HS, NH, p);  // dq += s ds k
    gemm(true, false, T, HS, T, scale, ds, T, TT, q, 3 * C, HS, beta, dq + C, 3 * C, HS, NH, p);   // dk += s ds^T q
  }
}

}  // namespace hpct::kernels::cuda
