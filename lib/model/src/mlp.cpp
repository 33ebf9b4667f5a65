// The feed-forward network (hpct/model/mlp.hpp).
#include "hpct/model/mlp.hpp"

#include "hpct/core/error.hpp"

namespace hpct::model {

MlpTensors Mlp::declare(ParamLayout& layout, const std::string& prefix, int64_t C, int64_t F, const Split& split,
                        const InitSpec& weight, const InitSpec& out_weight, size_t block_base, MlpKind kind,
                        bool bias) {
  const InitSpec zero = InitSpec::zeros();
  const bool gated = kind == MlpKind::swiglu;
  Partition fc = split.fc;
  if (gated && fc.dim == 0) fc.stride = 2;  // this rank's rows of gate and of up
  MlpTensors t;
  t.fcw = layout.add(prefix + "dense_h_to_4h.weight", {gated ? 2 * F : F, C}, true, fc, weight).offset - block_base;
  t.fcb = bias ? layout.add(prefix + "dense_h_to_4h.bias", {gated ? 2 * F : F}, false, fc, zero).offset - block_base
               : MlpTensors::none;
  t.projw = layout.add(prefix + "dense_4h_to_h.weight", {C, F}, true, split.fc2, out_weight).offset - block_base;
  t.projb = bias ? layout.add(prefix + "dense_4h_to_h.bias", {C}, false, split.replica, zero).offset - block_base
                 : MlpTensors::none;
  return t;
}

void Mlp::hidden(const MlpWeights& w, kernels::Operand x, kernels::Output fch, kernels::Output act, int rows, int F,
                 LinearHooks* hooks, float* wide) const {
  const bool hooked = hooks && hooks->active(LinearHooks::fc);
  if (kind_ == MlpKind::gelu && !hooked) {  // fc, its bias and GELU fused
    ops_->matmul_gelu_forward(fch, act, x, w.fc(), w.fcb, wide, rows, C_, F, precision_);
    return;
  }
  if (!fch.f) throw Error("Mlp::hidden: a 16-bit pre-activation is a GELU MLP's without an fc hook");
  ops_->matmul_forward(fch.f, x, w.fc(), w.fcb, rows, C_, fc_width(F), precision_);
  if (hooks) hooks->forward(LinearHooks::fc, x, fch.f, rows);
  if (kind_ == MlpKind::swiglu) ops_->swiglu_forward(act, fch.f, (size_t)rows, F);
  else ops_->gelu_forward(act, fch.f, (size_t)rows * F);
}

void Mlp::forward(const MlpWeights& w, kernels::Operand x, kernels::Output fch, kernels::Output act, float* out,
                  int rows, int F, LinearHooks* hooks, float* wide) const {
  hidden(w, x, fch, act, rows, F, hooks, wide);
  ops_->matmul_forward(out, act.operand(), w.proj(), w.projb, rows, F, C_, precision_);
  if (hooks) hooks->forward(LinearHooks::fc2, act.operand(), out, rows);
}

void Mlp::backward(const MlpWeights& w, const MlpGrads& g, kernels::Operand x, kernels::Operand fch, kernels::Operand act,
                   const float* dout, float* dx, int rows, float* dfch, float* dact, int F, LinearHooks* hooks) const {
  const size_t n = (size_t)rows * F;
  ops_->matmul_backward_into(dact, g.projw, g.projb, dout, act, w.proj(), rows, F, C_, precision_);  // dact written
  if (hooks) hooks->backward(LinearHooks::fc2, act, dout, dact, rows);
  const int W = fc_width(F);
  // A 16-bit pre-activation (only ever without an fc hook) gets a 16-bit gradient, in dfch's
  // first half: fc's GEMMs read it as it is, as autocast's bf16 gradient.
  const bool narrow = fch.h && !fch.f;
  const kernels::Output d =
      narrow ? kernels::Output::half(reinterpret_cast<uint16_t*>(dfch), precision_) : kernels::Output(dfch);
  if (kind_ == MlpKind::swiglu) {
    ops_->zero(dfch, (size_t)rows * W * sizeof(float));
    ops_->swiglu_backward(dfch, fch.f, dact, (size_t)rows, F);
  } else {
    ops_->gelu_backward_into(d, fch, dact, n, precision_);  // written
  }
  ops_->matmul_backward_into(dx, g.fcw, g.fcb, d.operand(), x, w.fc(), rows, C_, W, precision_);  // dx written
  if (hooks && !narrow) hooks->backward(LinearHooks::fc, x, dfch, dx, rows);
}

}  // namespace hpct::model
