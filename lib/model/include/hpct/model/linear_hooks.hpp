// hpct/model/linear_hooks.hpp — what runs beside a block's linears (LoRA's adapters). The blocks
// (model/attention.hpp, model/mlp.hpp) call a hook after each linear's forward and backward, so an
// adapter needs no knowledge of the block's other ops.
#pragma once
#include "hpct/kernels/operand.hpp"

namespace hpct::model {

class LinearHooks {
 public:
  /// A transformer layer's linears, numbered as LoraConfig::Target: the attention's query/key/value
  /// and output projections, the MLP's fc and fc2.
  enum Linear { qkv = 0, proj = 1, fc = 2, fc2 = 3 };
  virtual ~LinearHooks() = default;
  /// Whether anything runs beside `which` (a block may fuse the linear with the op after it only
  /// when nothing is added to its output in between).
  virtual bool active(Linear which) const = 0;
  /// After `which`'s forward: its input x (either form: kernels/operand.hpp) and its output `out`
  /// (to add to), on `rows` rows.
  virtual void forward(Linear which, kernels::Operand x, float* out, int rows) = 0;
  /// After `which`'s backward: its input, its output's gradient, and the input gradient to add to.
  virtual void backward(Linear which, kernels::Operand x, const float* dout, float* dx, int rows) = 0;
};

}  // namespace hpct::model
