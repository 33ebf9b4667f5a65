// LoRA adapters on the GPT's linears (see LoraConfig in gpt.hpp): the forward adds
// scale * (x A^T) B^T to a linear's output, the backward gives dA, dB and the input's share. Only
// backend ops (two small GEMMs and a scaled add each way), so it runs on every backend.
#include <string>

#include "gpt_acts.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::model {

namespace {
// Input and output widths of each adapted linear (LoraConfig::Target order), for hidden C.
int lora_in(int t, int C) { return t == LoraConfig::fc2 ? 4 * C : C; }
int lora_out(int t, int C) { return t == LoraConfig::qkv ? 3 * C : t == LoraConfig::fc ? 4 * C : C; }
}  // namespace

void Gpt::lora_use(ParamStore& store, int l, bool grads) {
  const int b = blocks_[l].lora_block;
  if (b < 0) return;
  lora_p_ = store.params(b);
  lora_g_ = grads ? store.grads(b) : nullptr;
}

void Gpt::lora_done(ParamStore& store, int l, bool grads) {
  const int b = blocks_[l].lora_block;
  if (b < 0) return;
  store.release(b);
  if (grads) store.grads_ready(b);
  lora_p_ = nullptr, lora_g_ = nullptr;
}

void Gpt::lora_forward(const Block& o, LayerActs& a, int t, const float* x, float* out, int rows) {
  if (!cfg_.lora.adapts(t) || o.lora_block < 0) return;
  const int r = cfg_.lora.rank, C = cfg_.hidden_size, in = lora_in(t, C), outw = lora_out(t, C);
  float* h = a.lora_h[t];
  ops_->matmul_forward(h, x, lora_p_ + o.lora_a[t], nullptr, rows, in, r, precision_);  // (rows, r)
  ops_->matmul_forward(ws_->lora_t, h, lora_p_ + o.lora_b[t], nullptr, rows, r, outw, precision_);
  ops_->add_scaled(out, ws_->lora_t, static_cast<float>(cfg_.lora.scale()), (size_t)rows * outw);
}

void Gpt::lora_backward(const Block& o, LayerActs& a, int t, const float* x, const float* dout, float* dx, int rows) {
  if (!cfg_.lora.adapts(t) || o.lora_block < 0) return;
  const int r = cfg_.lora.rank, C = cfg_.hidden_size, in = lora_in(t, C), outw = lora_out(t, C);
  const size_t n = (size_t)rows * outw;
  float* dt = ws_->lora_t;  // d(x A^T B^T) = scale * dout
  ops_->zero(dt, n * sizeof(float));
  ops_->add_scaled(dt, dout, static_cast<float>(cfg_.lora.scale()), n);
  float* dh = ws_->lora_dh;
  ops_->zero(dh, (size_t)rows * r * sizeof(float));
  ops_->matmul_backward(dh, lora_g_ ? lora_g_ + o.lora_b[t] : nullptr, nullptr, dt, a.lora_h[t], lora_p_ + o.lora_b[t],
                        rows, r, outw, precision_);
  ops_->matmul_backward(dx, lora_g_ ? lora_g_ + o.lora_a[t] : nullptr, nullptr, dh, x, lora_p_ + o.lora_a[t], rows, in,
                        r, precision_);
}

}  // namespace hpct::model
