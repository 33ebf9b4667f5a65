// Dropout inside the model (Megatron's places; see gpt.hpp's GptConfig and kernels/dropout.hpp).
//
// Sites: the embedding output (layer -1), each layer's attention probabilities, and the outputs
// of its attention projection and of its MLP or MoE before their residual adds. Every mask is a
// function of (run seed, layer, site, global sample, position, column), so a micro-batch gets the
// same masks on any data-, tensor- or sequence-parallel layout, in activation recomputation (the
// forward is replayed with the same masks) and after a resume. Backward applies the same mask to
// the gradient (dropout is linear); nothing is stored.
// random-LTD layers run on the kept rows as shorter sequences: their positions are the rows' places
// in the kept subset, itself a function of the sample, so that stays layout-independent too.
#include "gpt_acts.hpp"

namespace hpct::model {

kernels::Dropout Gpt::dropout_at(int l, kernels::DropoutSite site, int T, long long first_row) const {
  kernels::Dropout d;
  const double p = site == kernels::DropoutSite::attention_probs ? cfg_.attention_dropout : cfg_.hidden_dropout;
  if (!training_ || !(p > 0)) return d;  // p = 0: every op is the identity, bitwise
  d.p = static_cast<float>(p);
  d.key = kernels::dropout_site_key(drop_seed_, l, site);
  d.first_sample = drop_first_;
  d.T = T;
  d.first_row = first_row;
  d.head0 = tp_.rank() * NHl_;  // this rank's heads are [rank * NH/T, ...): global head numbers
  return d;
}

void Gpt::hidden_dropout(float* x, int l, kernels::DropoutSite site, int B, int T) {
  const size_t N = (size_t)B * T;
  const kernels::Dropout d = dropout_at(l, site, T, static_cast<long long>(tp_.first_row(N)));
  if (d.on()) ops_->dropout(x, tp_.local_rows(N), cfg_.hidden_size, d);
}

const float* Gpt::hidden_dropout_grad(const float* d, int l, kernels::DropoutSite site, int B, int T) {
  const size_t N = (size_t)B * T;
  const kernels::Dropout drop = dropout_at(l, site, T, static_cast<long long>(tp_.first_row(N)));
  if (!drop.on()) return d;
  const size_t n = tp_.local_rows(N), C = cfg_.hidden_size;
  ops_->copy(ws_->ddrop, d, n * C * sizeof(float));
  ops_->dropout(ws_->ddrop, n, static_cast<int>(C), drop);
  return ws_->ddrop;
}

}  // namespace hpct::model
