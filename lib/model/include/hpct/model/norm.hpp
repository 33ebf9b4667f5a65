// hpct/model/norm.hpp — a normalisation layer as one component: it declares its tensors and computes
// its forward and backward, so every norm of the model (before attention, before the feed-forward,
// the final one) and the tools that read the table use one definition.
//
// Two kinds (Megatron's --normalization):
// - layernorm: y = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + 1e-5) (GPT-2's);
// - rmsnorm:   y = x * rstd * weight, rstd = 1/sqrt(mean(x^2) + 1e-5), no bias (Llama's).
// The per-row statistics are kept for backward. Norms are replicas under tensor parallelism; with
// sequence parallelism each rank normalises its own rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::model {

enum class NormKind { layernorm, rmsnorm };
/// "layernorm" / "rmsnorm" (Megatron's --normalization values).
const char* norm_name(NormKind k);

/// Where a norm's tensors are in its block: element offsets from the block's start (bias: none for
/// RMSNorm).
struct NormTensors {
  static constexpr size_t none = std::numeric_limits<size_t>::max();
  size_t weight = 0, bias = none;
};
struct NormWeights {
  const float *weight = nullptr, *bias = nullptr;
  static NormWeights at(const float* block, const NormTensors& t) {
    return {block + t.weight, t.bias == NormTensors::none ? nullptr : block + t.bias};
  }
};
/// The weight and bias gradients (accumulated into; bias null for RMSNorm).
struct NormGrads {
  float *weight = nullptr, *bias = nullptr;
};
/// The per-row statistics a forward keeps for backward, `rows` each (mean: LayerNorm's only).
struct NormStats {
  float *mean = nullptr, *rstd = nullptr;
};

class Norm {
 public:
  /// Declares "<name>.weight" (ones) and, for LayerNorm, "<name>.bias" (zeros) of width C in the
  /// block being built, split as `replica`; offsets from `block_base`. Weight and bias are adjacent
  /// (weight first).
  static NormTensors declare(ParamLayout& layout, const std::string& name, int64_t C, const Partition& replica,
                             size_t block_base, NormKind kind);

  Norm() = default;
  Norm(kernels::OpsBackend& ops, int hidden, NormKind kind) : ops_(&ops), C_(hidden), kind_(kind) {}
  NormKind kind() const { return kind_; }

  /// out = norm(x) on `rows` rows (fp32, or 16-bit where GEMMs read it next: kernels/operand.hpp);
  /// the statistics into s.
  void forward(const NormWeights& w, const float* x, kernels::Output out, const NormStats& s, int rows) const;
  /// The residual add before a norm with the norm: res = skip + branch (res may be either), then
  /// out = norm(res); one pass on backends that fuse it (OpsBackend::residual_layernorm_forward).
  void forward_residual(const NormWeights& w, const float* skip, const float* branch, float* res, kernels::Output out,
                        const NormStats& s, int rows) const;
  /// From dout: the weight gradients and dx ACCUMULATED.
  void backward(const NormWeights& w, const NormGrads& g, const float* x, const NormStats& s, const float* dout,
                float* dx, int rows) const;

 private:
  kernels::OpsBackend* ops_ = nullptr;
  int C_ = 0;
  NormKind kind_ = NormKind::layernorm;
};

}  // namespace hpct::model
