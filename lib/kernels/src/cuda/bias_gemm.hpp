// A linear layer's forward with its bias in the GEMM (internal to lib/kernels): out = inp W^T + b in
// one cuBLASLt call with the BIAS epilogue, on 16-bit inputs, instead of a GEMM and a bias pass.
//
// What it is: per (N, C, OC, precision, pointer alignments) a cuBLASLt plan (descriptors and the
// heuristic's first algorithm), made on first use and kept. The sum is cuBLAS's fp32 accumulator
// plus the fp32 bias, rounded once to the fp32 output, as the GEMM and the separate bias pass give
// it (alpha 1: the accumulator is not scaled). Saves the bias pass's read and write of the (N, OC)
// output: 8 bytes an element of every biased linear's output, per micro-step.
// What it is not: the other epilogues (GELU's pass has the bias already: fusions.cu), 16-bit
// outputs, or fp32 inputs (those keep cublasGemmEx and the bias pass). Where cuBLASLt offers no
// algorithm for a plan, forward() says so and the caller runs the two passes.
// HPCT_CUBLASLT=0 in the environment turns it off (the two passes everywhere), should a card or
// driver disagree with it.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "checks.hpp"
#include "hpct/kernels/precision.hpp"

namespace hpct::kernels::cuda {

class BiasGemm {
 public:
  explicit BiasGemm(cudaStream_t stream);
  ~BiasGemm();
  BiasGemm(const BiasGemm&) = delete;
  BiasGemm& operator=(const BiasGemm&) = delete;

  /// out (N, OC) fp32 = inp (N, C) weight (OC, C)^T + bias (OC), inp and weight in p's 16 bits,
  /// queued on the stream; false (nothing queued) where no plan serves: the caller's two passes.
  bool forward(float* out, const uint16_t* inp, const uint16_t* weight, const float* bias, int N, int C, int OC,
               Precision p);
  size_t scratch_bytes() const { return workspace_.bytes; }

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
    bool ok = false;
  };
  // (N, C, OC, bf16, alignments of inp, weight, out, bias)
  using Key = std::tuple<int, int, int, bool, int, int, int, int>;
  Plan& plan(const Key& k, const float* bias);

  cudaStream_t stream_;
  cublasLtHandle_t lt_ = nullptr;
  bool enabled_ = true;
  std::map<Key, Plan> plans_;
  DeviceSlot workspace_;
};

}  // namespace hpct::kernels::cuda
