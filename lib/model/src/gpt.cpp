// GPT-2 forward/backward over hpct::kernels. See gpt.hpp for the contract.
#include "hpct/model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/core/timer.hpp"
#include "gpt_acts.hpp"

namespace hpct::model {

using kernels::Precision;


Gpt::Gpt(const GptConfig& cfg, Precision precision, bool recompute, kernels::OpsBackend* ops,
         const comm::Communicator* ep, const comm::Communicator* tp)
    : cfg_(cfg), precision_(precision), recompute_(recompute), ep_(ep), tp_(tp) {
  cfg_.validate();
  if (!ops) own_ops_ = kernels::cpu_ops();
  ops_ = ops ? ops : own_ops_.get();
  if (ep_) ep_size_ = ep_->size(), ep_rank_ = ep_->rank();
  if (tp_.size() != cfg_.tensor_parallel)
    throw Error("GPT: the tensor-parallel group has " + std::to_string(tp_.size()) + " ranks, the config says " +
                std::to_string(cfg_.tensor_parallel));
  tp_.set_backend(ops_);
  tp_.set_sequence_parallel(cfg_.sequence_parallel);
  Cl_ = cfg_.hidden_size / tp_.size();
  NHl_ = cfg_.num_heads / tp_.size();
  Fl_ = cfg_.ffn() / tp_.size();
  Vl_ = cfg_.padded_vocab() / tp_.size();
  vstart_ = tp_.rank() * Vl_;
  layout_ = layout_for(cfg_, tp_.rank(), &tensors_);
  if (cfg_.lora.adapts(LoraConfig::embedding)) {
    const TensorSpec& a = layout_.find("embedding.word_embeddings.lora_a.weight");
    emb_lora_block_ = a.block;
    emb_lora_a_ = a.offset - layout_.blocks()[a.block].offset;
    emb_lora_b_ = layout_.find("embedding.word_embeddings.lora_b.weight").offset - layout_.blocks()[a.block].offset;
  }
  // The LM head's rows at once, as the backend sizes them: a (rows, Vl) logits buffer, not (N, Vl).
  head_rows_ = std::max(1, ops_->head_rows(Vl_, keeps_half_logits() ? 2 : 4));
  norm_ = Norm(*ops_, cfg_.hidden_size, cfg_.normalization);
  // A set's 16-bit attention output (atty) stays as forward wrote it until backward: the kernel
  // may read it there rather than keep its own copy.
  const kernels::AttentionUse use{static_cast<float>(cfg_.attention_dropout), cfg_.reset_attention_mask,
                                  keeps_half_activations()};
  attention_ = Attention(*ops_, precision_, cfg_.hidden_size, NHl_, Cl_,
                         {cfg_.rotary_dims(), static_cast<float>(cfg_.rope_theta)}, cfg_.kv_heads() / tp_.size(), use);
  mlp_ = Mlp(*ops_, precision_, cfg_.hidden_size, cfg_.mlp);
  moe_ = std::make_unique<Moe>(cfg_, *ops_, tp_, mlp_, ep_, Fl_);
  for (size_t l = 0; l < tensors_.layers.size(); ++l) {
    const Block& o = tensors_.layers[l];
    if (o.experts == 0) continue;
    if (o.experts % ep_size_ != 0)
      throw config_error("--moe-expert-parallel-size",
                         "--moe-expert-parallel-size " + std::to_string(ep_size_) + " does not divide the " +
                             std::to_string(o.experts) + " experts of layer " + std::to_string(l + 1),
                         "choose an expert-parallel size that divides every --num-experts entry");
  }
}

std::vector<int> Gpt::held_blocks() const {
  std::vector<int> held;
  for (size_t b = 0; b < layout_.blocks().size(); ++b) {
    bool mine = true;
    for (const auto& o : tensors_.layers)
      for (size_t e = 0; e < o.expert_blocks.size(); ++e)
        if (o.expert_blocks[e] == static_cast<int>(b)) mine = static_cast<int>(e) / (o.experts / ep_size_) == ep_rank_;
    if (mine) held.push_back(static_cast<int>(b));
  }
  return held;
}

// tp_'s buffers go back first: own_ops_ is declared after tp_, so it is destroyed before it.
Gpt::~Gpt() {
  try {
    settle_losses();  // nothing still copies into the workspace it frees
  } catch (...) {
  }
  tp_.release_buffers();
}

std::pair<const int32_t*, const int32_t*> Gpt::stage_inputs(const int32_t* tokens, const int32_t* targets, int B,
                                                            int T) {
  if (!tokens || !targets) throw Error("GPT: tokens and targets are required (a target < 0 is ignored)");
  ensure_workspace(B, T);
  // Every backend: the embedding ops index rows by token id and cannot see the table's size (a
  // kernel cannot throw either), so ids are bounded here, before anything reads or writes a row.
  const size_t N = (size_t)B * T;
  const int Vp = cfg_.padded_vocab(), V = cfg_.vocab_size;
  for (size_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= Vp)
      throw Error("GPT on " + ops_->name() + ": token " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                  " is outside the vocabulary [0, " + std::to_string(Vp) + ")");
    if (targets[i] >= V)
      throw Error("GPT on " + ops_->name() + ": target " + std::to_string(targets[i]) + " of row " + std::to_string(i) +
                  " is not below V=" + std::to_string(V));
  }
  stage_documents(tokens, B, T);
  if (ops_->host_memory()) return {tokens, targets};
  Workspace& w = *ws_;
  ops_->copy_from_host(w.tokens.as<void>(), tokens, N * sizeof(int32_t));
  ops_->copy_from_host(w.targets.as<void>(), targets, N * sizeof(int32_t));
  return {w.tokens.as<int32_t>(), w.targets.as<int32_t>()};
}

double Gpt::flops_per_iteration(long long B, long long T, int kept) const {
  // Megatron's 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) counts forward+backward (x3) plus one
  // recompute forward (x4 in all); without recompute the same model FLOPs are 3/4 of it. Summed
  // layer by layer, and 6*B*s*h*V for the head, so that a layer that random-LTD runs on `kept`
  // tokens per sample counts at that length. A layer's forward is 2 FLOPs per multiply-add of its
  // linears per token (QKV 3h^2, output h^2, the MLP 2hF, SwiGLU's 3hF: with F = 4h, 24h^2 in all)
  // plus 4sh for the attention scores and their weighted sum; x4: 4 * (8h^2 + 2mhF + 4sh) with
  // m = 2 matrices in the MLP (3 for SwiGLU), Megatron's 96h^2(1 + s/6h) at F = 4h.
  const double h = cfg_.hidden_size, s = (double)T, V = cfg_.padded_vocab(), F = cfg_.ffn();
  const double kv = (double)cfg_.kv_heads() / cfg_.num_heads * h;  // key (and value) channels
  const double m = cfg_.mlp == MlpKind::swiglu ? 3 : 2;
  // MoE: a token runs k expert MLPs (and the dense one beside them in a residual MoE) where a dense
  // layer runs one (2mhF per token, x4). Router and combine omitted.
  const double extra_mlps = cfg_.moe.topk - 1 + (cfg_.moe.residual ? 1 : 0);
  // CAC's replay skips the attention output projection (2h^2 per token) and fc2 (2hF per MLP run).
  const bool cac = recompute_ && keeps_communication();
  double f = 6.0 * B * s * h * V;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const bool short_layer = kept > 0 && kept < T && std::binary_search(ltd_layers_.begin(), ltd_layers_.end(), l);
    const double sl = short_layer ? (double)kept : s;
    const bool moe = tensors_.layers[l].experts > 0;
    f += 4.0 * B * sl * (2.0 * h * (2.0 * h + 2.0 * kv) + 2.0 * m * h * F + 4.0 * sl * h);  // QKV h(h+2kv), out h^2
    if (moe) f += 8.0 * m * B * sl * h * F * extra_mlps;
    if (cac) f -= 2.0 * B * sl * h * (h + F) + (moe ? 2.0 * B * sl * h * F * extra_mlps : 0.0);
  }
  return recompute_ ? f : f * 0.75;
}

NormGrads Gpt::scratch_norm_grads(size_t at) const {
  float* d = ws_->dnorm + at;
  return {d, cfg_.normalization == NormKind::layernorm ? d + cfg_.hidden_size : nullptr};
}

// LinearHooks::Linear numbers the linears as LoraConfig::Target does.
struct Gpt::LayerLora final : LinearHooks {
  Gpt& g;
  const Block& o;
  LayerActs& a;
  LayerLora(Gpt& gpt, const Block& block, LayerActs& acts) : g(gpt), o(block), a(acts) {}
  bool active(Linear which) const override { return g.cfg_.lora.adapts(which) && o.lora_block >= 0; }
  void forward(Linear which, kernels::Operand x, float* out, int rows) override {
    g.lora_forward(o, a, which, x, out, rows);
  }
  void backward(Linear which, kernels::Operand x, const float* dout, float* dx, int rows) override {
    g.lora_backward(o, a, which, x, dout, dx, rows);
  }
};
static_assert(int{LinearHooks::qkv} == int{LoraConfig::qkv} && int{LinearHooks::proj} == int{LoraConfig::proj} &&
              int{LinearHooks::fc} == int{LoraConfig::fc} && int{LinearHooks::fc2} == int{LoraConfig::fc2});

// in, out and a.res2 hold this rank's n token rows (all N without sequence parallelism, else the n
// from row r0): the norms run on them and write their rows of the full a.ln1 / a.ln2, which f
// gathers; g sums the row-parallel partial outputs (all N rows, in w.dln) into this rank's rows.
void Gpt::layer_forward(ParamStore& store, int l, const float* lp, LayerActs& a, const float* in, float* out, int B,
                        int T, const int32_t* key_start, const int32_t* pos) {
  const int N = B * T, C = cfg_.hidden_size;
  const Block& o = tensors_.layers[l];
  const uint16_t* lp16 = store.params16(o.block);  // the linears' weights in 16 bits, where the store has them
  const bool sp = tp_.sequence_parallel();
  const size_t NC = (size_t)N * C, n = tp_.local_rows(N), r0 = tp_.first_row(N), nC = n * C;
  float* part = sp ? ws_->dln : a.res2;
  LayerLora lora(*this, o, a);
  // The GEMM inputs a.ln1, a.atty, a.ln2, a.fch_gelu: fp32 wherever sequence parallelism gathers
  // them (keeps_half_activations), and ln2 and fch_gelu in every set an MoE layer uses
  // (set_feeds_moe), so .f is theirs there.
  norm_.forward(NormWeights::at(lp, o.ln1), in, a.ln1.at(r0 * C), {a.ln1_mean, a.ln1_rstd}, (int)n);
  tp_.all_gather(a.ln1.f, NC);
  // Attention: QKV column-parallel (this rank's heads), the output projection row-parallel, then g.
  const AttentionWeights aw = attention(lp, lp16, o);
  const kernels::Dropout attn_drop = dropout_at(l, kernels::DropoutSite::attention_probs, T);
  attention_.mix(aw, a.ln1.operand(), a.qkv, a.att, a.atty, B, T, &attn_drop, key_start, pos, &lora);
  // Kept by training forwards only: an evaluation between steps leaves the last step's alone.
  // One slot per layer, strided by the workspace's rows: random-LTD layers run on fewer rows.
  const size_t slot = tp_.local_rows((size_t)ws_->B * ws_->T) * C;
  float* kept = keeps_communication() && training_ ? ws_->kept_res2 + (size_t)l * slot : nullptr;
  const NormWeights ln2 = NormWeights::at(lp, o.ln2);
  const NormStats ln2_stats{a.ln2_mean, a.ln2_rstd};
  if (replaying_) {  // CAC: the attention output's g is not run again
    std::memcpy(a.res2, kept, nC * sizeof(float));
    norm_.forward(ln2, a.res2, a.ln2.at(r0 * C), ln2_stats, (int)n);
  } else {
    attention_.project(aw, a.atty.operand(), part, N, &lora);
    tp_.reduce_scatter(part, a.res2, NC);
    hidden_dropout(a.res2, l, kernels::DropoutSite::attention_out, B, T);
    norm_.forward_residual(ln2, in, a.res2, a.res2, a.ln2.at(r0 * C), ln2_stats, (int)n);  // res2 = in + attention
    if (kept) std::memcpy(kept, a.res2, nC * sizeof(float));
  }
  tp_.all_gather(a.ln2.f, NC);
  float* ff = sp ? ws_->dln : out;  // the feed-forward's output on all N rows
  if (replaying_) {  // what backward reads only: the layer's output (and its g) is not needed again
    if (o.experts == 0) mlp_.hidden(dense_mlp(lp, lp16, o), a.ln2.operand(), a.fch, a.fch_gelu, N, Fl_, &lora, ws_->dfch);
    else moe_->forward(moe_pass(), store, o, l, lp, moe_dense(lp, lp16, nullptr, o, a), a.ln2.f, ff, N, act_set(a));
    return;
  }
  if (o.experts == 0) {  // fc column-parallel, fc2 row-parallel, then g
    // ws_->dfch: backward's scratch, free in forward, holds fc's fp32 sum where a.fch is 16-bit
    mlp_.forward(dense_mlp(lp, lp16, o), a.ln2.operand(), a.fch, a.fch_gelu, ff, N, Fl_, &lora, ws_->dfch);
    tp_.reduce_scatter(ff, out, NC);
  } else {
    // every tensor-parallel rank routes every row alike
    moe_->forward(moe_pass(), store, o, l, lp, moe_dense(lp, lp16, nullptr, o, a), a.ln2.f, ff, N, act_set(a));
    if (sp) ops_->copy(out, ff + r0 * C, nC * sizeof(float));
  }
  hidden_dropout(out, l, kernels::DropoutSite::mlp_out, B, T);
  ops_->residual_forward(out, a.res2, out, nC);
}

Moe::Pass Gpt::moe_pass() const {
  Moe::Pass p;
  p.training = training_;
  p.replaying = replaying_;
  p.keep_per_layer = keeps_communication() && training_;
  p.dloss = dloss_;
  p.batch_rows = batch_rows_;
  return p;
}

Moe::Dense Gpt::moe_dense(const float* lp, const uint16_t* lp16, float* lg, const Block& o, LayerActs& a) const {
  Moe::Dense d;
  d.w = dense_mlp(lp, lp16, o);
  d.g = MlpGrads::at(lg, o.mlp);
  d.fch = a.fch.f, d.fch_gelu = a.fch_gelu.f;
  d.dfch = ws_->dfch, d.dfch_gelu = ws_->dfch_gelu;
  d.width = Fl_;
  return d;
}

int Gpt::act_set(const LayerActs& a) const { return static_cast<int>(&a - ws_->acts.data()); }

void Gpt::set_communication_aware_checkpointing(bool on) {
  // The replay copies the kept residuals with host memcpy: the CPU backend's memory only.
  if (on && recompute_ && !ops_->host_memory())
    throw config_error("--communication-aware-checkpointing", "--communication-aware-checkpointing runs on the CPU backend only",
                       "drop it, or train with --device cpu");
  // The replay skips the attention output's and fc2's forward, and with them LoRA's x A^T there.
  if (on && recompute_ && cfg_.lora.enabled())
    throw config_error("--communication-aware-checkpointing",
                       "--communication-aware-checkpointing does not keep LoRA adapters' products for the replay",
                       "drop it (--checkpoint-activations alone recomputes them)");
  cac_ = on;
  ws_.reset();  // the next step sizes the workspace with (or without) the kept residuals
  moe_->clear_kept();
}

size_t Gpt::kept_for_replay_bytes() const {
  if (!keeps_communication() || !ws_) return 0;
  return (size_t)cfg_.num_layers * tp_.local_rows((size_t)ws_->B * ws_->T) * cfg_.hidden_size * sizeof(float) +
         moe_->kept_bytes();
}

const float* Gpt::gather_rows(const float* d, int N) {
  if (!tp_.sequence_parallel()) return d;
  const size_t C = cfg_.hidden_size;
  ops_->copy(ws_->dfull + tp_.first_row(N) * C, d, tp_.local_rows(N) * C * sizeof(float));
  tp_.all_gather(ws_->dfull, (size_t)N * C);
  return ws_->dfull;
}

// dres holds d(loss)/d(layer output) on entry and d(loss)/d(layer input) on return (this rank's
// rows under sequence parallelism: the linears get every row's gradient from gather_rows, and
// their input gradients come back as this rank's rows, dsl; the norms' weight gradients are then
// partial sums over those rows, summed over the group before they join lg).
void Gpt::layer_backward(ParamStore& store, int l, const float* lp, float* lg, LayerActs& a, const float* in,
                         float* dres, int B, int T, const int32_t* pos) {
  const int N = B * T, C = cfg_.hidden_size;
  const Block& o = tensors_.layers[l];
  const uint16_t* lp16 = store.params16(o.block);
  Workspace& w = *ws_;
  const bool sp = tp_.sequence_parallel();
  const size_t NC = (size_t)N * C, n = tp_.local_rows(N), r0 = tp_.first_row(N);
  float* dsl = sp ? w.dslice : w.dln;
  // A frozen block (LoRA's base: lg null) gets no weight gradients. The norms' gradients: lg, or
  // w.dnorm (ln1's weight, bias, then ln2's; sequence parallelism's partial sums, a frozen block's scratch).
  const bool scratch = sp || !lg;
  const NormGrads dn1 = scratch ? scratch_norm_grads(0) : norm_grads(lg, o.ln1);
  const NormGrads dn2 = scratch ? scratch_norm_grads(2 * C) : norm_grads(lg, o.ln2);
  LayerLora lora(*this, o, a);
  if (sp) ops_->zero(w.dnorm, 4 * C * sizeof(float));
  if (o.experts > 0) ops_->zero(w.dln, NC * sizeof(float));  // MoE accumulates its parts; the dense MLP writes
  const float* dout = gather_rows(hidden_dropout_grad(dres, l, kernels::DropoutSite::mlp_out, B, T), N);
  if (o.experts == 0) {
    mlp_.backward(dense_mlp(lp, lp16, o), MlpGrads::at(lg, o.mlp), a.ln2.operand(), a.fch.operand(), a.fch_gelu.operand(), dout,
                  w.dln, N, w.dfch, w.dfch_gelu, Fl_, &lora);
    tp_.reduce_scatter(w.dln, dsl, NC);  // f's backward: the parts' input gradients summed
  } else {
    moe_->backward(moe_pass(), store, o, lp, lg, moe_dense(lp, lp16, lg, o, a), a.ln2.f, dout, w.dln, N, act_set(a));  // whole on every rank
    if (sp) ops_->copy(dsl, w.dln + r0 * C, n * C * sizeof(float));
  }
  // residual: d(res2) = dres (skip path) + layernorm2 backward, accumulated in place
  norm_.backward(NormWeights::at(lp, o.ln2), dn2, a.res2, {a.ln2_mean, a.ln2_rstd}, dsl, dres, (int)n);
  const float* dproj = gather_rows(hidden_dropout_grad(dres, l, kernels::DropoutSite::attention_out, B, T), N);
  const kernels::Dropout attn_drop = dropout_at(l, kernels::DropoutSite::attention_probs, T);
  attention_.backward(attention(lp, lp16, o), AttentionGrads::at(lg, o.attn), a.ln1.operand(), a.qkv, a.att,
                      a.atty.operand(), dproj, w.dln, B, T, w.datty, w.dqkv, &attn_drop, pos, &lora);
  tp_.reduce_scatter(w.dln, dsl, NC);
  norm_.backward(NormWeights::at(lp, o.ln1), dn1, in, {a.ln1_mean, a.ln1_rstd}, dsl, dres, (int)n);
  if (sp && lg) {  // (a frozen block's norms: scratch, not reduced)
    tp_.reduce_partial_grads(w.dnorm, 4 * C);
    const NormGrads sums[2] = {dn1, dn2}, into[2] = {norm_grads(lg, o.ln1), norm_grads(lg, o.ln2)};
    for (int i = 0; i < 2; ++i) {
      ops_->residual_forward(into[i].weight, into[i].weight, sums[i].weight, C);
      if (into[i].bias) ops_->residual_forward(into[i].bias, into[i].bias, sums[i].bias, C);
    }
  }
}

// Final norm + tied LM head + loss, chunked over rows. With backward, also writes d(x) into dx
// (overwritten) and accumulates the head's share of d(wte) and the final norm's gradients.
void Gpt::head(kernels::Operand hw, float* hg, const float* fp, float* fg, const float* x, const int32_t* targets,
               int B, int T, float dloss, bool backward, float* dx) {
  const int N = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  Workspace& w = *ws_;
  // Vocab-parallel: this rank's Vl_ columns of the logits; the loss over the group (tensor_parallel.hpp).
  // x (and dx) hold this rank's rows under sequence parallelism; the norm's output is gathered.
  const bool sp = tp_.sequence_parallel();
  const size_t NC = (size_t)N * C, n = tp_.local_rows(N), r0 = tp_.first_row(N);
  const NormWeights nw = NormWeights::at(fp, tensors_.final_norm);
  norm_.forward(nw, x, w.lnf.at(r0 * C), {w.lnf_mean, w.lnf_rstd}, (int)n);
  tp_.all_gather(w.lnf.f, NC);  // fp32 under sequence parallelism
  if (backward) ops_->zero(w.dln, (size_t)N * C * sizeof(float));
  const bool half = keeps_half_logits();
  auto* logits16 = reinterpret_cast<uint16_t*>(w.logits);  // the row block's 16-bit logits (keeps_half_logits)
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    int rows = std::min(head_rows_, N - r0);
    const kernels::Operand xin = w.lnf.operand().at((size_t)r0 * C);  // fp32 with the embedding's adapters
    if (half) {  // logits, loss and gradient in 16 bits (no tensor parallelism, no adapters here)
      ops_->matmul_forward_half(logits16, xin, hw, rows, C, Vl_, precision_);
      ops_->softmax_cross_entropy_half(logits16, w.losses + r0, targets + r0, dloss, rows, V, Vp, precision_);
      if (backward) ops_->matmul_backward_half(w.dln + (size_t)r0 * C, hg, logits16, xin, hw, rows, C, Vl_, precision_);
      continue;
    }
    ops_->matmul_forward(w.logits, xin, hw, nullptr, rows, C, Vl_, precision_);
    lora_head(xin.f, w.logits, rows, false, nullptr);
    if (tp_.enabled())
      tp_.cross_entropy(w.logits, w.losses + r0, targets + r0, dloss, rows, Vl_, vstart_, V, backward);
    else
      ops_->softmax_cross_entropy(w.logits, w.losses + r0, targets + r0, dloss, rows, V, Vp);
    if (backward) {
      ops_->matmul_backward(w.dln + (size_t)r0 * C, hg, nullptr, w.logits, xin, hw, rows, C, Vl_, precision_);
      lora_head(xin.f, w.logits, rows, true, w.dln + (size_t)r0 * C);
    }
  }
  if (!ops_->host_memory()) {  // read back beside the backward (nothing after this writes w.losses)
    settle_losses();
    loss_download_ = ops_->download_async(w.host_losses.as<void>(), w.losses, (size_t)N * sizeof(float));
    loss_pending_ = true;
  }
  if (backward) {
    float* dsl = sp ? w.dslice : w.dln;
    tp_.reduce_scatter(w.dln, dsl, NC);
    ops_->zero(dx, n * C * sizeof(float));
    // weight, bias: partial sums in w.dnorm under sequence parallelism; scratch when frozen
    const bool scratch = sp || !fg;
    const NormGrads dn = scratch ? scratch_norm_grads(0) : norm_grads(fg, tensors_.final_norm);
    if (sp) ops_->zero(w.dnorm, 2 * C * sizeof(float));
    norm_.backward(nw, dn, x, {w.lnf_mean, w.lnf_rstd}, dsl, dx, (int)n);
    if (sp && fg) {
      tp_.reduce_partial_grads(w.dnorm, 2 * C);
      const NormGrads into = norm_grads(fg, tensors_.final_norm);
      ops_->residual_forward(into.weight, into.weight, dn.weight, C);
      if (into.bias) ops_->residual_forward(into.bias, into.bias, dn.bias, C);
    }
  }
}

// Embedding and every layer's forward into the residual stream res[0..L]. With keep_acts each layer
// saves its activations in its own set (for backward without recompute); otherwise all share set 0.
// Returns the embedding block's parameters, still held (the tied head needs them).
const float* Gpt::forward_layers(ParamStore& store, const int32_t* tokens, int B, int T, bool keep_acts) {
  Workspace& w = *ws_;
  const int C = cfg_.hidden_size;
  const size_t NC = tp_.local_rows((size_t)B * T) * C;  // the residual stream's rows on this rank
  const float* ep = store.params(0);
  const float* pe = !tensors_.learned_positions ? nullptr  // rotary: no table
                    : (tensors_.position_block ? store.params(tensors_.position_block) : ep) + tensors_.wpe;
  if (tp_.enabled())
    tp_.embedding_forward(w.res, tokens, ep + tensors_.wte, pe, B, T, C, vstart_, Vl_, w.dln, positions_);
  else ops_->encoder_forward(w.res, tokens, ep + tensors_.wte, pe, B, T, C, positions_);
  if (tensors_.learned_positions && tensors_.position_block) store.release(tensors_.position_block);
  if (emb_lora_block_ >= 0) {  // held until the head (the caller releases it)
    emb_lora_p_ = store.params(emb_lora_block_);
    lora_embed_forward(tokens, w.res, B * T);
  }
  hidden_dropout(w.res, -1, kernels::DropoutSite::embedding, B, T);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const int b = tensors_.layers[l].block;
    LayerActs& a = w.acts[keep_acts ? l : 0];
    const float* lp = store.params(b);
    lora_use(store, l, false);
    run_layer_forward(store, l, lp, a, w.res + l * NC, w.res + (l + 1) * NC, B, T, true);
    lora_done(store, l, false);
    store.release(b);
  }
  return ep;
}

void Gpt::settle_losses() {
  if (!loss_pending_) return;
  loss_pending_ = false;
  ops_->wait_transfer(loss_download_);
}

double Gpt::head_loss(int N) {
  settle_losses();
  const float* losses = ops_->host_memory() ? ws_->losses : ws_->host_losses.as<float>();
  double sum = 0;
  for (int i = 0; i < N; ++i) sum += losses[i];  // in row order, as on every backend
  return sum;
}

std::pair<kernels::Operand, float*> Gpt::use_head(ParamStore& store, const float* ep, bool grads) {
  // A frozen block (LoRA's base) has no gradients (and no 16-bit copy): null, not an offset from null.
  auto at = [](const uint16_t* block16, size_t off) { return block16 ? block16 + off : nullptr; };
  if (tensors_.output_block < 0) {
    float* g = grads ? store.grads(0) : nullptr;
    return {kernels::Operand(ep + tensors_.wte, at(store.params16(0), tensors_.wte)), g ? g + tensors_.wte : nullptr};
  }
  const float* p = store.params(tensors_.output_block) + tensors_.output;
  const uint16_t* p16 = at(store.params16(tensors_.output_block), tensors_.output);
  float* g = grads ? store.grads(tensors_.output_block) : nullptr;
  return {kernels::Operand(p, p16), g ? g + tensors_.output : nullptr};
}

void Gpt::done_head(ParamStore& store, bool grads) {
  if (tensors_.output_block < 0) return;
  store.release(tensors_.output_block);
  if (grads) store.grads_ready(tensors_.output_block);
}

double Gpt::forward_backward(ParamStore& store, const int32_t* host_tokens, const int32_t* host_targets, int B, int T,
                             float dloss) {
  Marks mk;
  mk.start = ops_->mark();  // before the inputs' upload: it is the forward's
  const auto [tokens, targets] = stage_inputs(host_tokens, host_targets, B, T);
  training_ = true;
  dloss_ = dloss;
  batch_rows_ = B * T;
  Timer phase;
  const float* ep = forward_layers(store, tokens, B, T, /*keep_acts=*/!recompute_);
  phase_.forward += phase.seconds();
  mk.forward_end = ops_->mark();
  phase.reset();
  Workspace& w = *ws_;
  const int L = cfg_.num_layers, C = cfg_.hidden_size;
  const size_t NC = tp_.local_rows((size_t)B * T) * C;  // the residual stream's rows on this rank
  const int F = tensors_.final_block;
  const float* fp = store.params(F);
  if (emb_lora_block_ >= 0) emb_lora_g_ = store.grads(emb_lora_block_);
  const auto [hw, hg] = use_head(store, ep, true);
  head(hw, hg, fp, store.grads(F), w.res + L * NC, targets, B, T, dloss, true, w.dres);
  done_head(store, true);
  if (emb_lora_block_ >= 0) store.release(emb_lora_block_);
  store.release(F);
  store.release(0);  // a tied head was the last reader of the embedding's parameters (ZeRO-3 frees them now)
  store.grads_ready(F);
  for (int l = L - 1; l >= 0; --l) {
    LayerActs& a = w.acts[recompute_ ? 0 : l];
    const int b = tensors_.layers[l].block;
    const float* lp = store.params(b);
    lora_use(store, l, true);
    if (recompute_) {  // with CAC a replay: the kept results of the forward's collectives
      struct Replay {
        bool& on;
        ~Replay() { on = false; }  // cleared on a throw too: a later forward must not replay
      } replay{replaying_};
      replaying_ = keeps_communication();
      run_layer_forward(store, l, lp, a, w.res + l * NC, w.res + (l + 1) * NC, B, T, false);
    }
    run_layer_backward(store, l, lp, store.grads(b), a, w.res + l * NC, w.dres, B, T);
    lora_done(store, l, true);
    store.release(b);
    store.grads_ready(b);
  }
  float* eg = store.grads(0);
  float* pg = tensors_.learned_positions && tensors_.position_block ? store.grads(tensors_.position_block)
                                                                    : eg;  // LoRA: the positions may train alone
  float* dwpe = tensors_.learned_positions && pg ? pg + tensors_.wpe : nullptr;  // rotary: no table
  hidden_dropout(w.dres, -1, kernels::DropoutSite::embedding, B, T);  // in place: nothing reads dres after
  // Every row of d(embedding output) (gathered once under sequence parallelism)
  const float* demb = pg || emb_lora_block_ >= 0 ? gather_rows(w.dres, B * T) : w.dres;
  if (!pg) {  // a frozen embedding (LoRA): nothing to compute
  } else if (tp_.enabled())  // eg null: LoRA's frozen words beside trained positions
    tp_.embedding_backward(eg ? eg + tensors_.wte : nullptr, dwpe, demb, tokens, B, T, C, vstart_, Vl_, positions_);
  else ops_->encoder_backward(eg ? eg + tensors_.wte : nullptr, dwpe, w.dres, tokens, B, T, C, positions_);
  if (emb_lora_block_ >= 0) {  // the embedding's adapters: the input side's share, then complete
    emb_lora_p_ = store.params(emb_lora_block_);
    emb_lora_g_ = store.grads(emb_lora_block_);
    lora_embed_backward(tokens, demb, B, T);
    store.release(emb_lora_block_);
    store.grads_ready(emb_lora_block_);
    emb_lora_p_ = nullptr, emb_lora_g_ = nullptr;
  }
  if (tensors_.learned_positions && tensors_.position_block) store.grads_ready(tensors_.position_block);
  store.grads_ready(0);
  phase_.backward += phase.seconds();
  mk.backward_end = ops_->mark();
  marks_.push_back(mk);
  return head_loss(B * T);
}

double Gpt::forward_loss(ParamStore& store, const int32_t* host_tokens, const int32_t* host_targets, int B, int T) {
  const auto [tokens, targets] = stage_inputs(host_tokens, host_targets, B, T);
  training_ = false;
  batch_rows_ = B * T;
  // evaluation keeps no activations for backward: every layer reuses the first set
  const float* ep = forward_layers(store, tokens, B, T, /*keep_acts=*/false);
  Workspace& w = *ws_;
  const int L = cfg_.num_layers;
  const size_t NC = tp_.local_rows((size_t)B * T) * cfg_.hidden_size;
  emb_lora_g_ = nullptr;
  const auto [hw, hg] = use_head(store, ep, false);
  head(hw, hg, store.params(tensors_.final_block), nullptr, w.res + L * NC, targets, B, T, 0.0f, false, nullptr);
  const double loss = head_loss(B * T);
  done_head(store, false);
  if (emb_lora_block_ >= 0) store.release(emb_lora_block_), emb_lora_p_ = nullptr;
  store.release(tensors_.final_block);
  store.release(0);
  return loss;
}

}  // namespace hpct::model
