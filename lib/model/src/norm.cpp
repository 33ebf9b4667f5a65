// Normalisation layers (hpct/model/norm.hpp).
#include "hpct/model/norm.hpp"

namespace hpct::model {

const char* norm_name(NormKind k) { return k == NormKind::rmsnorm ? "rmsnorm" : "layernorm"; }

NormTensors Norm::declare(ParamLayout& layout, const std::string& name, int64_t C, const Partition& replica,
                          size_t block_base, NormKind kind) {
  NormTensors t;
  t.weight = layout.add(name + ".weight", {C}, false, replica, InitSpec::ones()).offset - block_base;
  if (kind == NormKind::layernorm)
    t.bias = layout.add(name + ".bias", {C}, false, replica, InitSpec::zeros()).offset - block_base;
  return t;
}

void Norm::forward(const NormWeights& w, const float* x, kernels::Output out, const NormStats& s, int rows) const {
  if (kind_ == NormKind::rmsnorm) ops_->rmsnorm_forward(out, s.rstd, x, w.weight, rows, C_);
  else ops_->layernorm_forward(out, s.mean, s.rstd, x, w.weight, w.bias, rows, C_);
}

void Norm::forward_residual(const NormWeights& w, const float* skip, const float* branch, float* res,
                            kernels::Output out, const NormStats& s, int rows) const {
  if (kind_ == NormKind::rmsnorm) ops_->residual_rmsnorm_forward(res, out, s.rstd, skip, branch, w.weight, rows, C_);
  else ops_->residual_layernorm_forward(res, out, s.mean, s.rstd, skip, branch, w.weight, w.bias, rows, C_);
}

void Norm::backward(const NormWeights& w, const NormGrads& g, const float* x, const NormStats& s, const float* dout,
                    float* dx, int rows) const {
  if (kind_ == NormKind::rmsnorm) ops_->rmsnorm_backward(dx, g.weight, dout, x, w.weight, s.rstd, rows, C_);
  else ops_->layernorm_backward(dx, g.weight, g.bias, dout, x, w.weight, s.mean, s.rstd, rows, C_);
}

}  // namespace hpct::model
