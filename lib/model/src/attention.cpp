// Self-attention (hpct/model/attention.hpp).
#include "hpct/model/attention.hpp"

namespace hpct::model {

AttentionTensors Attention::declare(ParamLayout& layout, const std::string& prefix, int64_t C, const Split& split,
                                    const InitSpec& weight, const InitSpec& out_weight, size_t block_base, bool bias,
                                    int64_t kv_channels) {
  const InitSpec zero = InitSpec::zeros();
  const int64_t KVC = kv_channels > 0 ? kv_channels : C, rows = C + 2 * KVC;
  Partition qkv = split.qkv;
  if (KVC != C && qkv.dim == 0) qkv.sections = {C, KVC, KVC}, qkv.stride = 1;  // q | k | v of their own sizes
  AttentionTensors t;
  t.qkvw = layout.add(prefix + "query_key_value.weight", {rows, C}, true, qkv, weight).offset - block_base;
  if (bias) t.qkvb = layout.add(prefix + "query_key_value.bias", {rows}, false, qkv, zero).offset - block_base;
  else t.qkvb = AttentionTensors::none;
  t.projw = layout.add(prefix + "dense.weight", {C, C}, true, split.proj, out_weight).offset - block_base;
  if (bias) t.projb = layout.add(prefix + "dense.bias", {C}, false, split.replica, zero).offset - block_base;
  else t.projb = AttentionTensors::none;
  return t;
}

void Attention::qkv(const AttentionWeights& w, kernels::Operand x, float* qkv, int rows, LinearHooks* hooks) const {
  ops_->matmul_forward(qkv, x, w.qkv(), w.qkvb, rows, C_, qkv_width(), precision_);
  if (hooks) hooks->forward(LinearHooks::qkv, x, qkv, rows);
}

void Attention::rotate(float* qkv, int rows, const int32_t* pos) const {
  if (rotary_.dims > 0 && rows > 0) ops_->rope(qkv, 1, rows, Cl_, NH_, KV_, rotary_.dims, rotary_.theta, pos, false);
}

void Attention::mix(const AttentionWeights& w, kernels::Operand x, float* qkv, float* att, kernels::Output y, int B,
                    int T,
                    const kernels::Dropout* drop, const int32_t* key_start, const int32_t* pos, LinearHooks* hooks) const {
  const size_t N = (size_t)B * T;
  this->qkv(w, x, qkv, (int)N, hooks);
  if (rotary_.dims > 0) ops_->rope(qkv, B, T, Cl_, NH_, KV_, rotary_.dims, rotary_.theta, pos, false);
  const float* heads = qkv;
  if (grouped()) {  // every query head its key/value head's copy, after the qkv rows
    float* wide = qkv + N * qkv_width();
    ops_->expand_kv(wide, qkv, N, Cl_, NH_, KV_);
    heads = wide;
  }
  ops_->attention_forward(y, att, heads, B, T, Cl_, NH_, precision_, drop, key_start, use_);
}

void Attention::project(const AttentionWeights& w, kernels::Operand y, float* out, int rows, LinearHooks* hooks) const {
  ops_->matmul_forward(out, y, w.proj(), w.projb, rows, Cl_, C_, precision_);
  if (hooks) hooks->forward(LinearHooks::proj, y, out, rows);
}

void Attention::backward(const AttentionWeights& w, const AttentionGrads& g, kernels::Operand x, const float* qkv,
                         const float* att, kernels::Operand y, const float* dout, float* dx, int B, int T, float* dy,
                         float* dqkv, const kernels::Dropout* drop, const int32_t* pos, LinearHooks* hooks) const {
  const int N = B * T;
  ops_->matmul_backward_into(dy, g.projw, g.projb, dout, y, w.proj(), N, Cl_, C_, precision_);  // dy written
  if (hooks) hooks->backward(LinearHooks::proj, y, dout, dy, N);
  // Grouped: the op's gradient for every query head's key/value copy (after dqkv's grouped rows),
  // then summed into the shared heads.
  float* dheads = grouped() ? dqkv + (size_t)N * qkv_width() : dqkv;
  const float* heads = qkv && grouped() ? qkv + (size_t)N * qkv_width() : qkv;  // as mix() gave the op
  // A 16-bit gradient (half_gradient) goes to the qkv GEMMs as it is, in dqkv's first half.
  const bool narrow = half_gradient(B, T, x, hooks);
  const kernels::Output d =
      narrow ? kernels::Output::half(reinterpret_cast<uint16_t*>(dqkv), precision_) : kernels::Output(dheads);
  ops_->attention_backward_into(d, dy, heads, att, y, B, T, Cl_, NH_, precision_, drop, use_);  // written
  if (grouped()) ops_->reduce_kv(dqkv, dheads, (size_t)N, Cl_, NH_, KV_);
  if (rotary_.dims > 0) ops_->rope(dqkv, B, T, Cl_, NH_, KV_, rotary_.dims, rotary_.theta, pos, true);  // before the rotation
  const kernels::Operand dq = narrow ? d.operand() : kernels::Operand(dqkv);
  ops_->matmul_backward_into(dx, g.qkvw, g.qkvb, dq, x, w.qkv(), N, C_, qkv_width(), precision_);  // dx written
  if (hooks && !narrow) hooks->backward(LinearHooks::qkv, x, dqkv, dx, N);
}

bool Attention::half_gradient(int B, int T, kernels::Operand x, LinearHooks* hooks) const {
  return x.h && !grouped() && rotary_.dims == 0 && !(hooks && hooks->active(LinearHooks::qkv)) &&
         kernel(B, T).half_gradient;
}

}  // namespace hpct::model
