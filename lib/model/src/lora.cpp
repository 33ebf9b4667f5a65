// LoRA adapters on the GPT's linears (see LoraConfig in gpt.hpp): the forward adds
// scale * (x A^T) B^T to a linear's output, the backward gives dA, dB and the input's share. Only
// backend ops (two small GEMMs and a scaled add each way), so it runs on every backend.
//
// Under tensor parallelism (gpt_layout.cpp) the adapters split with the linear they adapt:
// - column-parallel (qkv, fc): A whole, B this rank's output rows. x A^T is whole on every rank;
//   d(x A^T) = dout B is a partial sum over the ranks' outputs: it is summed over the group, then
//   every rank has dA whole, and the input's share is added on rank 0 only (f's backward sums the
//   ranks' input gradients).
// - row-parallel (proj, fc2): A this rank's input columns, B whole. x A^T is a partial sum, summed
//   over the group; the update is added on rank 0 only, before g sums the ranks' outputs (as the
//   row-parallel bias). dB is then whole on every rank.
// - the embedding (vocab-parallel): A this rank's vocabulary rows, B whole. A[token] is gathered
//   from the slice that holds it (summed over the group); on the head's side d(x B) is summed.
// The sums are of (rows, rank) products: rank/C of Megatron's activation all-reduces.
#include <string>

#include "gpt_acts.hpp"

namespace {
}
#include "hpct/model/gpt.hpp"

namespace hpct::model {

namespace {
bool column_parallel(int t) { return t == LoraConfig::qkv || t == LoraConfig::fc; }
}  // namespace

std::pair<int, int> Gpt::lora_dims(int t) const {
  const int C = cfg_.hidden_size;
  switch (t) {
    case LoraConfig::qkv: return {C, attention_.qkv_width()};
    case LoraConfig::proj: return {Cl_, C};
    case LoraConfig::fc: return {C, mlp_.fc_width(Fl_)};
    default: return {Fl_, C};
  }
}

void Gpt::lora_use(ParamStore& store, int l, bool grads) {
  const int b = tensors_.layers[l].lora_block;
  if (b < 0) return;
  lora_p_ = store.params(b);
  lora_g_ = grads ? store.grads(b) : nullptr;
}

void Gpt::lora_done(ParamStore& store, int l, bool grads) {
  const int b = tensors_.layers[l].lora_block;
  if (b < 0) return;
  store.release(b);
  if (grads) store.grads_ready(b);
  lora_p_ = nullptr, lora_g_ = nullptr;
}

void Gpt::lora_forward(const Block& o, LayerActs& a, int t, kernels::Operand x, float* out, int rows) {
  if (!cfg_.lora.adapts(t) || o.lora_block < 0) return;
  const int r = cfg_.lora.rank;
  const auto [in, outw] = lora_dims(t);
  float* h = a.lora_h[t];
  ops_->matmul_forward(h, x, lora_p_ + o.lora_a[t], nullptr, rows, in, r, precision_);  // (rows, r)
  if (tp_.enabled() && !column_parallel(t)) {
    tp_.adapter_all_reduce(h, (size_t)rows * r);
    if (tp_.rank() != 0) return;
  }
  ops_->matmul_forward(ws_->lora_t, h, lora_p_ + o.lora_b[t], nullptr, rows, r, outw, precision_);
  ops_->add_scaled(out, ws_->lora_t, static_cast<float>(cfg_.lora.scale()), (size_t)rows * outw);
}

void Gpt::lora_backward(const Block& o, LayerActs& a, int t, kernels::Operand x, const float* dout, float* dx,
                        int rows) {
  if (!cfg_.lora.adapts(t) || o.lora_block < 0) return;
  const int r = cfg_.lora.rank;
  const auto [in, outw] = lora_dims(t);
  const size_t n = (size_t)rows * outw;
  float* dt = ws_->lora_t;  // d(x A^T B^T) = scale * dout
  ops_->zero(dt, n * sizeof(float));
  ops_->add_scaled(dt, dout, static_cast<float>(cfg_.lora.scale()), n);
  float* dh = ws_->lora_dh;
  ops_->zero(dh, (size_t)rows * r * sizeof(float));
  ops_->matmul_backward(dh, lora_g_ ? lora_g_ + o.lora_b[t] : nullptr, nullptr, dt, a.lora_h[t], lora_p_ + o.lora_b[t],
                        rows, r, outw, precision_);
  if (tp_.enabled() && column_parallel(t)) {
    tp_.adapter_all_reduce(dh, (size_t)rows * r);
    if (tp_.rank() != 0) dx = nullptr;
  }
  float* dA = lora_g_ ? lora_g_ + o.lora_a[t] : nullptr;
  if (dx || dA) ops_->matmul_backward(dx, dA, nullptr, dh, x, lora_p_ + o.lora_a[t], rows, in, r, precision_);
}

// The embedding E (Vp, C) adapted to E + s A B^T, A (Vp, rank), B (C, rank): the input row of token
// v gains s A[v] B^T, the logits of x gain s (x B) A^T. Products with B un-transposed use
// matmul_backward's dinp += dout W (a documented contract of the op: W is B as (OC = C, rank)).
void Gpt::lora_embed_forward(const int32_t* tokens, float* x, int N) {
  if (emb_lora_block_ < 0) return;
  const int r = cfg_.lora.rank, C = cfg_.hidden_size;
  const float* A = emb_lora_p_ + emb_lora_a_;
  float* u = ws_->lora_u;  // A[token], (N, r)
  if (tp_.enabled()) {  // the rows of this rank's vocabulary slice, summed over the group
    ops_->vocab_rows(u, A, tokens, (size_t)N, r, vstart_, Vl_);
    tp_.adapter_all_reduce(u, (size_t)N * r);
  } else {
    ops_->gather_rows(u, A, tokens, (size_t)N, r);
  }
  ops_->matmul_forward(ws_->lora_t, u, emb_lora_p_ + emb_lora_b_, nullptr, N, r, C, precision_);
  // x holds this rank's rows under sequence parallelism
  ops_->add_scaled(x, ws_->lora_t + tp_.first_row(N) * C, static_cast<float>(cfg_.lora.scale()), tp_.local_rows(N) * C);
}

void Gpt::lora_head(const float* x, float* logits, int rows, bool backward, float* dx) {
  if (emb_lora_block_ < 0) return;
  const int r = cfg_.lora.rank, C = cfg_.hidden_size, Vp = Vl_;
  const float s = static_cast<float>(cfg_.lora.scale());
  const float* A = emb_lora_p_ + emb_lora_a_;
  const float* Bm = emb_lora_p_ + emb_lora_b_;
  Workspace& w = *ws_;
  float *z = w.lora_z, *zs = w.lora_z + (size_t)head_rows_ * r;  // x B and s x B, (rows, r) each
  if (!backward) {
    ops_->zero(z, (size_t)rows * r * sizeof(float));
    ops_->matmul_backward(z, nullptr, nullptr, x, nullptr, Bm, rows, r, C, precision_);  // z = x B
    ops_->zero(zs, (size_t)rows * r * sizeof(float));
    ops_->add_scaled(zs, z, s, (size_t)rows * r);
    ops_->matmul_forward(w.lora_logits, zs, A, nullptr, rows, r, Vp, precision_);  // s (x B) A^T
    ops_->add_scaled(logits, w.lora_logits, 1.0f, (size_t)rows * Vp);
    return;
  }
  // logits holds d(loss)/d(logits): dA += dlogits^T zs, d(zs) = dlogits A, dz = s d(zs),
  // dB += x^T dz, dx += dz B^T.
  float* dz = w.lora_dh;
  ops_->zero(dz, (size_t)rows * r * sizeof(float));
  ops_->matmul_backward(dz, emb_lora_g_ ? emb_lora_g_ + emb_lora_a_ : nullptr, nullptr, logits, zs, A, rows, r, Vp,
                        precision_);
  tp_.adapter_all_reduce(dz, (size_t)rows * r);  // the vocabulary slices' shares
  ops_->zero(z, (size_t)rows * r * sizeof(float));
  ops_->add_scaled(z, dz, s, (size_t)rows * r);  // z is free now: it holds dz
  if (emb_lora_g_)
    ops_->matmul_backward(nullptr, emb_lora_g_ + emb_lora_b_, nullptr, x, z, Bm, rows, r, C, precision_);
  if (tp_.rank() != 0) return;  // dx is summed over the group after the head
  ops_->matmul_forward(w.lora_t, z, Bm, nullptr, rows, r, C, precision_);  // dz B^T
  ops_->add_scaled(dx, w.lora_t, 1.0f, (size_t)rows * C);
}

// dx: d(embedding output) on every row (the caller gathers them under sequence parallelism).
void Gpt::lora_embed_backward(const int32_t* tokens, const float* dx, int B, int T) {
  if (emb_lora_block_ < 0 || !emb_lora_g_) return;
  const int r = cfg_.lora.rank, C = cfg_.hidden_size, N = B * T;
  Workspace& w = *ws_;
  float* sdx = w.lora_t;  // s dx, (N, C)
  ops_->zero(sdx, (size_t)N * C * sizeof(float));
  ops_->add_scaled(sdx, dx, static_cast<float>(cfg_.lora.scale()), (size_t)N * C);
  const float* Bm = emb_lora_p_ + emb_lora_b_;
  ops_->matmul_backward(nullptr, emb_lora_g_ + emb_lora_b_, nullptr, sdx, w.lora_u, Bm, N, r, C, precision_);  // dB += s dx^T u
  float* du = w.lora_dh;  // d(A[token]) = s dx B, (N, r)
  ops_->zero(du, (size_t)N * r * sizeof(float));
  ops_->matmul_backward(du, nullptr, nullptr, sdx, nullptr, Bm, N, r, C, precision_);
  // dA[token] += du: the embedding's scatter-add (its position gradient goes to scratch)
  ops_->zero(w.lora_dpos, (size_t)T * r * sizeof(float));
  if (tp_.enabled())  // this rank's vocabulary rows
    tp_.embedding_backward(emb_lora_g_ + emb_lora_a_, w.lora_dpos, du, tokens, B, T, r, vstart_, Vl_);
  else ops_->encoder_backward(emb_lora_g_ + emb_lora_a_, w.lora_dpos, du, tokens, B, T, r, nullptr);
}

}  // namespace hpct::model
