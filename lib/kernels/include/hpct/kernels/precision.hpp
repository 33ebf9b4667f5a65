// hpct/kernels/precision.hpp — the compute precision of GEMM inputs.
//
// What it is: one enum that every matrix op takes, so bf16/fp16 training is a parameter of the op
// rather than a second copy of the model. What it is not: a storage format. The contract is that
// only the inputs of a GEMM are rounded (bf16: round to nearest even; fp16: IEEE half, overflow to
// inf) and products are accumulated in fp32; gradients, GEMM outputs and the residual stream stay
// fp32. Where those inputs are kept is the caller's choice (operand.hpp): the CPU keeps them in
// fp32 and rounds inside the GEMM; a device model keeps the weights' 16-bit copies and the
// activations GEMMs read in 16 bits (OpsBackend::half_activations), which is the same rounding done
// once, earlier. Trade-off: the CPU pays a rounding pass per GEMM call for one fp32 layout.
#pragma once

namespace hpct::kernels {

enum class Precision { fp32, bf16, fp16 };

/// "fp32", "bf16" or "fp16", for logs and benchmark tables.
constexpr const char* precision_name(Precision p) {
  return p == Precision::fp32 ? "fp32" : p == Precision::bf16 ? "bf16" : "fp16";
}

}  // namespace hpct::kernels
