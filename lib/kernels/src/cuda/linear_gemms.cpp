// The linear layers' GEMMs on the CUDA backend (linear_gemms.hpp). Row-major products through
// column-major cuBLAS as ops_backend.cu's gemm(): C^T = op(B)^T op(A)^T, B passed first.
#include "linear_gemms.hpp"

#include <string>

#include "checks.hpp"
#include "hpct/core/error.hpp"
#include "hpct/kernels/cuda_ops.hpp"

namespace hpct::kernels::cuda {
namespace {
bool half_precision(Precision p) { return p != Precision::fp32; }

}  // namespace

LinearGemms::~LinearGemms() {
  for (DeviceSlot& s : slots_) s.release(stream_);
  wide_.release(stream_);
  bias_.reset();
}

const float* LinearGemms::fp32(Operand x, const char* what) {
  if (!x.f) throw Error(std::string("CUDA backend: ") + what + ": a GEMM input given only in 16 bits in an fp32 op");
  return x.f;
}

const uint16_t* LinearGemms::narrow(Operand x, size_t n, Precision p, int s) {
  if (x.h) return x.h;
  auto* h = static_cast<uint16_t*>(slots_[s].grown(n * sizeof(uint16_t), stream_, "a narrowed GEMM input"));
  cuda::narrow_half(h, x.f, n, p == Precision::bf16, stream_);
  return h;
}

void LinearGemms::gemm(bool ta, bool tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb,
                       float beta, void* Cm, int ldc, bool half, Precision p, bool half_out) {
  if (M == 0 || N == 0) return;
  const float alpha = 1.0f;
  const cudaDataType_t in = !half ? CUDA_R_32F : p == Precision::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  // 16-bit inputs: the tensor-core kernels with fp32 accumulation. fp32 inputs in a 16-bit op: cuBLAS
  // may round them inside the kernel; in an fp32 op it may not (no TF32).
  const cublasComputeType_t compute = half || p == Precision::fp32 ? CUBLAS_COMPUTE_32F
                                      : p == Precision::bf16      ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                                  : CUBLAS_COMPUTE_32F_FAST_16F;
  check(cublasGemmEx(blas_, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, in, ldb,
                     A, in, lda, &beta, Cm, half_out ? in : CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx (" + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
            (half ? ", 16-bit inputs)" : ")"));
}

void LinearGemms::forward(float* out, Operand inp, Operand weight, int N, int C, int OC, Precision p,
                          const float* bias) {
  const size_t ni = (size_t)N * C, nw = (size_t)OC * C;
  if (half_precision(p) && ((inp.h && weight.h) || !inp.f || !weight.f)) {
    const uint16_t *x = narrow(inp, ni, p, 0), *w = narrow(weight, nw, p, 1);
    if (bias && bias_->forward(out, x, w, bias, N, C, OC, p)) return;  // the bias in the GEMM
    gemm(false, true, N, OC, C, x, C, w, C, 0.0f, out, OC, true, p);
  } else {
    gemm(false, true, N, OC, C, fp32(inp, "linear forward"), C, fp32(weight, "linear forward"), C, 0.0f, out, OC,
         false, p);
  }
  if (bias) cuda::add_bias(out, bias, N, OC, stream_);
}

void LinearGemms::forward_half(uint16_t* out, Operand inp, Operand weight, int N, int C, int OC, Precision p) {
  const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  if ((inp.h && weight.h) || !inp.f || !weight.f) {  // 16-bit inputs: cuBLAS writes the 16-bit product
    gemm(false, true, N, OC, C, narrow(inp, ni, p, 0), C, narrow(weight, nw, p, 1), C, 0.0f, out, OC, true, p, true);
    return;
  }
  auto* f = static_cast<float*>(wide_.grown(no * sizeof(float), stream_, "a 16-bit product's fp32 values"));
  forward(f, inp, weight, N, C, OC, p);
  cuda::narrow_half(out, f, no, p == Precision::bf16, stream_);
}

void LinearGemms::backward(float* dinp, float beta, float* dweight, Operand dout, Operand inp, Operand weight, int N,
                           int C, int OC, Precision p) {
  const size_t ni = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
  const bool half = half_precision(p);
  // Both operands in 16 bits, or dout only in 16 bits (the LM head's 16-bit gradient): both
  // products on 16 bits (dout narrowed once, or as it is; an fp32-only operand narrowed); an input
  // given only in 16 bits: its product runs on 16 bits whatever it costs.
  const bool both = half && ((inp.h && weight.h) || (dout.h && !dout.f));
  const bool dinp16 = dinp && half && (both || !weight.f), dweight16 = dweight && half && (both || !inp.f);
  const uint16_t* dout16 = dinp16 || dweight16 ? narrow(dout, no, p, 2) : nullptr;
  // An fp32 product from a dout given only in 16 bits (not reached in a 16-bit op, where `both`
  // holds then): widened once (exact).
  const bool fp32_products = (dinp && !dinp16) || (dweight && !dweight16);
  const float* dout32 = dout.f;
  if (fp32_products && !dout32) {
    auto* w = static_cast<float*>(wide_.grown(no * sizeof(float), stream_, "a 16-bit output gradient widened"));
    cuda::widen_half(w, dout.h, no, p == Precision::bf16, stream_);
    dout32 = w;
  }
  if (dinp16) gemm(false, false, N, C, OC, dout16, OC, narrow(weight, nw, p, 1), C, beta, dinp, C, true, p);
  else if (dinp) gemm(false, false, N, C, OC, dout32, OC, fp32(weight, "linear backward"), C, beta, dinp, C, false, p);
  if (dweight16) gemm(true, false, OC, C, N, dout16, OC, narrow(inp, ni, p, 0), C, 1.0f, dweight, C, true, p);
  else if (dweight) gemm(true, false, OC, C, N, dout32, OC, fp32(inp, "linear backward"), C, 1.0f, dweight, C, false, p);
}

}  // namespace hpct::kernels::cuda
