// Self-attention (hpct/model/attention.hpp).
#include "hpct/model/attention.hpp"

namespace hpct::model {

AttentionTensors Attention::declare(ParamLayout& layout, const std::string& prefix, int64_t C, const Split& split,
                                    const InitSpec& weight, const InitSpec& out_weight, size_t block_base, bool bias) {
  const InitSpec zero = InitSpec::zeros();
  AttentionTensors t;
  t.qkvw = layout.add(prefix + "query_key_value.weight", {3 * C, C}, true, split.qkv, weight).offset - block_base;
  if (bias) t.qkvb = layout.add(prefix + "query_key_value.bias", {3 * C}, false, split.qkv, zero).offset - block_base;
  else t.qkvb = AttentionTensors::none;
  t.projw = layout.add(prefix + "dense.weight", {C, C}, true, split.proj, out_weight).offset - block_base;
  if (bias) t.projb = layout.add(prefix + "dense.bias", {C}, false, split.replica, zero).offset - block_base;
  else t.projb = AttentionTensors::none;
  return t;
}

void Attention::qkv(const AttentionWeights& w, const float* x, float* qkv, int rows, LinearHooks* hooks) const {
  ops_->matmul_forward(qkv, x, w.qkvw, w.qkvb, rows, C_, 3 * Cl_, precision_);
  if (hooks) hooks->forward(LinearHooks::qkv, x, qkv, rows);
}

void Attention::rotate(float* qkv, int rows, const int32_t* pos) const {
  if (rotary_.dims > 0 && rows > 0) ops_->rope(qkv, 1, rows, Cl_, NH_, rotary_.dims, rotary_.theta, pos, false);
}

void Attention::mix(const AttentionWeights& w, const float* x, float* qkv, float* att, float* y, int B, int T,
                    const kernels::Dropout* drop, const int32_t* key_start, const int32_t* pos, LinearHooks* hooks) const {
  this->qkv(w, x, qkv, B * T, hooks);
  if (rotary_.dims > 0) ops_->rope(qkv, B, T, Cl_, NH_, rotary_.dims, rotary_.theta, pos, false);
  ops_->attention_forward(y, att, qkv, B, T, Cl_, NH_, precision_, drop, key_start);
}

void Attention::project(const AttentionWeights& w, const float* y, float* out, int rows, LinearHooks* hooks) const {
  ops_->matmul_forward(out, y, w.projw, w.projb, rows, Cl_, C_, precision_);
  if (hooks) hooks->forward(LinearHooks::proj, y, out, rows);
}

void Attention::backward(const AttentionWeights& w, const AttentionGrads& g, const float* x, const float* qkv,
                         const float* att, const float* y, const float* dout, float* dx, int B, int T, float* dy,
                         float* dqkv, const kernels::Dropout* drop, const int32_t* pos, LinearHooks* hooks) const {
  const int N = B * T;
  const size_t NCl = (size_t)N * Cl_;
  ops_->zero(dy, NCl * sizeof(float));
  ops_->matmul_backward(dy, g.projw, g.projb, dout, y, w.projw, N, Cl_, C_, precision_);
  if (hooks) hooks->backward(LinearHooks::proj, y, dout, dy, N);
  ops_->zero(dqkv, 3 * NCl * sizeof(float));
  ops_->attention_backward(dqkv, dy, qkv, att, B, T, Cl_, NH_, precision_, drop);
  if (rotary_.dims > 0) ops_->rope(dqkv, B, T, Cl_, NH_, rotary_.dims, rotary_.theta, pos, true);  // before the rotation
  ops_->matmul_backward(dx, g.qkvw, g.qkvb, dqkv, x, w.qkvw, N, C_, 3 * Cl_, precision_);
  if (hooks) hooks->backward(LinearHooks::qkv, x, dqkv, dx, N);
}

}  // namespace hpct::model
