// hpct/kernels/precision.hpp — the compute precision of GEMM inputs.
//
// What it is: one enum that every matrix op takes, so bf16/fp16 training is a parameter of the op
// rather than a second copy of the model. What it is not: a storage format. Parameters,
// activations, gradients and GEMM outputs stay fp32 everywhere; only the inputs of a GEMM are
// rounded (bf16: round to nearest even; fp16: IEEE half, overflow to inf) and products are
// accumulated in fp32. Trade-off: rounding costs one extra pass over both GEMM inputs per call,
// in exchange for a single fp32 activation layout and exact fp32 master weights.
#pragma once

namespace hpct::kernels {

enum class Precision { fp32, bf16, fp16 };

/// "fp32", "bf16" or "fp16", for logs and benchmark tables.
constexpr const char* precision_name(Precision p) {
  return p == Precision::fp32 ? "fp32" : p == Precision::bf16 ? "bf16" : "fp16";
}

}  // namespace hpct::kernels
