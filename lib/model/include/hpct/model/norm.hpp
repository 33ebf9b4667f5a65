// hpct/model/norm.hpp — a normalisation layer as one component: it declares its tensors and computes
// its forward and backward, so every norm of the model (before attention, before the feed-forward,
// the final one) and the tools that read the table use one definition.
//
// LayerNorm over the C channels of each row: y = (x - mean) * rstd * weight + bias, rstd =
// 1/sqrt(var + 1e-5) (GPT-2's). The per-row statistics are kept for backward. Norms are replicas
// under tensor parallelism; with sequence parallelism each rank normalises its own rows.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"

namespace hpct::model {

/// Where a norm's tensors are in its block: element offsets from the block's start.
struct NormTensors {
  size_t weight = 0, bias = 0;
};
struct NormWeights {
  const float *weight = nullptr, *bias = nullptr;
  static NormWeights at(const float* block, const NormTensors& t) { return {block + t.weight, block + t.bias}; }
};
/// The weight and bias gradients (accumulated into).
struct NormGrads {
  float *weight = nullptr, *bias = nullptr;
};
/// The per-row statistics a forward keeps for backward, `rows` each.
struct NormStats {
  float *mean = nullptr, *rstd = nullptr;
};

class Norm {
 public:
  /// Declares "<name>.weight" (ones) and "<name>.bias" (zeros) of width C in the block being built,
  /// split as `replica`; offsets from `block_base`. Weight and bias are adjacent (weight first).
  static NormTensors declare(ParamLayout& layout, const std::string& name, int64_t C, const Partition& replica,
                             size_t block_base);

  Norm() = default;
  Norm(kernels::OpsBackend& ops, int hidden) : ops_(&ops), C_(hidden) {}

  /// out = norm(x) on `rows` rows; the statistics into s.
  void forward(const NormWeights& w, const float* x, float* out, const NormStats& s, int rows) const;
  /// From dout: the weight gradients and dx ACCUMULATED.
  void backward(const NormWeights& w, const NormGrads& g, const float* x, const NormStats& s, const float* dout,
                float* dx, int rows) const;

 private:
  kernels::OpsBackend* ops_ = nullptr;
  int C_ = 0;
};

}  // namespace hpct::model
