// hpct/model/mlp.hpp — the transformer's feed-forward network as one component: it declares its
// tensors (names, shapes, tensor-parallel splits, initialisation) and computes its forward and
// backward. A dense layer's MLP, the MLP beside a residual MoE's experts and every expert are this
// one class, so a new feed-forward (SwiGLU) is written here once.
//
// fc (C -> F), GELU, fc2 (F -> C); Megatron's names dense_h_to_4h and dense_4h_to_h. Or SwiGLU
// (Megatron's --swiglu, Llama's MLP): fc (C -> 2F, rows [gate | up]), silu(gate) * up, fc2 (F -> C).
// With tensor parallelism F is this rank's part: fc column-parallel (a SwiGLU fc by sections, stride
// 2: this rank's gate rows and up rows, so its output is its own [gate | up]), fc2 row-parallel, so
// the caller passes fc2's bias on one rank only and sums the output (and the input gradient) over
// the group.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "hpct/core/param_layout.hpp"
#include "hpct/kernels/ops_backend.hpp"
#include "hpct/model/linear_hooks.hpp"

namespace hpct::model {

enum class MlpKind { gelu, swiglu };

/// Where an MLP's tensors are in its block: element offsets from the block's start (the biases
/// `none` without them: --disable-bias-linear).
struct MlpTensors {
  static constexpr size_t none = std::numeric_limits<size_t>::max();
  size_t fcw = 0, fcb = 0, projw = 0, projb = 0;
};

/// One MLP's parameters (projb null: no bias added, a row-parallel part off rank 0) or gradients
/// (null: not computed, a frozen block's).
struct MlpWeights {
  const float *fcw = nullptr, *fcb = nullptr, *projw = nullptr, *projb = nullptr;
  // The matrices' 16-bit copies where the store keeps them (ParamStore::params16; nullptr: none).
  const uint16_t *fcw16 = nullptr, *projw16 = nullptr;
  /// block16: the block's 16-bit copy (nullptr: none).
  static MlpWeights at(const float* block, const MlpTensors& t, const uint16_t* block16 = nullptr) {
    auto bias = [&](size_t o) { return o == MlpTensors::none ? nullptr : block + o; };
    MlpWeights w{block + t.fcw, bias(t.fcb), block + t.projw, bias(t.projb)};
    if (block16) w.fcw16 = block16 + t.fcw, w.projw16 = block16 + t.projw;
    return w;
  }
  kernels::Operand fc() const { return {fcw, fcw16}; }
  kernels::Operand proj() const { return {projw, projw16}; }
};
struct MlpGrads {
  float *fcw = nullptr, *fcb = nullptr, *projw = nullptr, *projb = nullptr;
  static MlpGrads at(float* block, const MlpTensors& t) {
    if (!block) return {};
    auto bias = [&](size_t o) { return o == MlpTensors::none ? nullptr : block + o; };
    return {block + t.fcw, bias(t.fcb), block + t.projw, bias(t.projb)};
  }
};

class Mlp {
 public:
  /// How the tensors split over the tensor-parallel group: fc's rows, fc2's columns; fc2's bias is
  /// a replica.
  struct Split {
    Partition fc, fc2, replica;
  };
  /// Declares fc's and fc2's weight and bias under `prefix` ("layers.0.mlp.", "layers.1.mlp.experts.3.")
  /// in the block being built, of hidden size C and full width F; `weight` and `out_weight` are
  /// fc's and fc2's initialisation (biases start at zero). Offsets from `block_base`. A SwiGLU fc
  /// has 2F rows (gate, then up) and a column-parallel split by those two sections. No biases
  /// without `bias`.
  static MlpTensors declare(ParamLayout& layout, const std::string& prefix, int64_t C, int64_t F, const Split& split,
                            const InitSpec& weight, const InitSpec& out_weight, size_t block_base, MlpKind kind,
                            bool bias = true);

  Mlp() = default;
  Mlp(kernels::OpsBackend& ops, kernels::Precision precision, int hidden, MlpKind kind)
      : ops_(&ops), precision_(precision), C_(hidden), kind_(kind) {}
  MlpKind kind() const { return kind_; }
  /// fc's output width for an MLP F wide (2F for SwiGLU): the row width of fch and dfch.
  int fc_width(int F) const { return kind_ == MlpKind::swiglu ? 2 * F : F; }

  /// fc and its activation only (what a recompute pass that keeps the output needs): fch = x fc^T + b
  /// (rows of fc_width(F)), act = GELU(fch) or SwiGLU(fch) (rows of F), on `rows` rows.
  /// x and act in either form (kernels/operand.hpp: 16 bits where the model keeps its GEMM inputs
  /// narrow); fch is fp32 (the activation's backward reads it), or 16-bit for a GELU MLP whose fc
  /// has no hook (OpsBackend::half_pre_activations: GELU then reads the rounded value), with
  /// `wide` rows x F floats of scratch for the fp32 sum (nullptr where fch is fp32).
  void hidden(const MlpWeights& w, kernels::Operand x, kernels::Output fch, kernels::Output act, int rows, int F,
              LinearHooks* hooks, float* wide = nullptr) const;
  /// The whole MLP: out = GELU(x fc^T + b) fc2^T + b2; fch and act are kept for backward.
  void forward(const MlpWeights& w, kernels::Operand x, kernels::Output fch, kernels::Output act, float* out, int rows,
               int F, LinearHooks* hooks, float* wide = nullptr) const;
  /// From dout: the weight gradients ACCUMULATED, dx WRITTEN (no memset first); dfch (rows x
  /// fc_width(F)) and dact (rows x F) are scratch. fch as forward kept it; where it is 16-bit so is
  /// its gradient (in dfch's first half), which fc's GEMMs and bias sum read as it is.
  void backward(const MlpWeights& w, const MlpGrads& g, kernels::Operand x, kernels::Operand fch, kernels::Operand act,
                const float* dout, float* dx, int rows, float* dfch, float* dact, int F, LinearHooks* hooks) const;

 private:
  kernels::OpsBackend* ops_ = nullptr;
  kernels::Precision precision_ = kernels::Precision::fp32;
  int C_ = 0;
  MlpKind kind_ = MlpKind::gelu;
};

}  // namespace hpct::model
