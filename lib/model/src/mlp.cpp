// The feed-forward network (hpct/model/mlp.hpp).
#include "hpct/model/mlp.hpp"

namespace hpct::model {

MlpTensors Mlp::declare(ParamLayout& layout, const std::string& prefix, int64_t C, int64_t F, const Split& split,
                        const InitSpec& weight, const InitSpec& out_weight, size_t block_base) {
  const InitSpec zero = InitSpec::zeros();
  MlpTensors t;
  t.fcw = layout.add(prefix + "dense_h_to_4h.weight", {F, C}, true, split.fc, weight).offset - block_base;
  t.fcb = layout.add(prefix + "dense_h_to_4h.bias", {F}, false, split.fc, zero).offset - block_base;
  t.projw = layout.add(prefix + "dense_4h_to_h.weight", {C, F}, true, split.fc2, out_weight).offset - block_base;
  t.projb = layout.add(prefix + "dense_4h_to_h.bias", {C}, false, split.replica, zero).offset - block_base;
  return t;
}

void Mlp::hidden(const MlpWeights& w, const float* x, float* fch, float* act, int rows, int F, LinearHooks* hooks) const {
  ops_->matmul_forward(fch, x, w.fcw, w.fcb, rows, C_, F, precision_);
  if (hooks) hooks->forward(LinearHooks::fc, x, fch, rows);
  ops_->gelu_forward(act, fch, (size_t)rows * F);
}

void Mlp::forward(const MlpWeights& w, const float* x, float* fch, float* act, float* out, int rows, int F,
                  LinearHooks* hooks) const {
  hidden(w, x, fch, act, rows, F, hooks);
  ops_->matmul_forward(out, act, w.projw, w.projb, rows, F, C_, precision_);
  if (hooks) hooks->forward(LinearHooks::fc2, act, out, rows);
}

void Mlp::backward(const MlpWeights& w, const MlpGrads& g, const float* x, const float* fch, const float* act,
                   const float* dout, float* dx, int rows, float* dfch, float* dact, int F, LinearHooks* hooks) const {
  const size_t n = (size_t)rows * F;
  ops_->zero(dact, n * sizeof(float));
  ops_->matmul_backward(dact, g.projw, g.projb, dout, act, w.projw, rows, F, C_, precision_);
  if (hooks) hooks->backward(LinearHooks::fc2, act, dout, dact, rows);
  ops_->zero(dfch, n * sizeof(float));
  ops_->gelu_backward(dfch, fch, dact, n);
  ops_->matmul_backward(dx, g.fcw, g.fcb, dfch, x, w.fcw, rows, C_, F, precision_);
  if (hooks) hooks->backward(LinearHooks::fc, x, dfch, dx, rows);
}

}  // namespace hpct::model
