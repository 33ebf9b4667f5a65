// Gpt's workspace (gpt.hpp): the activations, the LM head's row block and the device's per-row
// inputs for micro-batches up to B x T, how many bytes they take, and their layout in one buffer.
#include <algorithm>
#include <memory>
#include <string>

#include "gpt_acts.hpp"
#include "hpct/core/error.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::model {

// What ensure_workspace(B, T) takes, in floats, and the dimensions it lays them out by.
Gpt::Sizes Gpt::sizes(int B, int T) const {
  Sizes z;
  // Tensor-parallel parts: attention channels Cl = C/T, heads NH/T, MLP width F = 4C/T, Vl = Vp/T.
  const size_t N = (size_t)B * T, C = cfg_.hidden_size, L = cfg_.num_layers;
  z.L = L;
  const size_t Cl = Cl_, F = Fl_, W = mlp_.fc_width(Fl_), Vl = Vl_;  // W: fc's output (SwiGLU: 2F)
  // Sequence parallelism: the residual stream, res2, dres and the norms' statistics hold n = N/T
  // rows; the gathered norm outputs, dfull (gathered gradients) and dslice (scattered) are extra.
  const size_t n = tp_.local_rows(N), sp = tp_.sequence_parallel() ? 1 : 0;
  const size_t nsets = recompute_ ? 1 : L;
  const size_t kept = keeps_communication() ? L * n * C : 0;  // each layer's res2 (CAC)
  const size_t Q = attention_.qkv_width(), dQ = attention_.dqkv_floats(N) / std::max<size_t>(N, 1);  // per row
  z.half = keeps_half_activations();
  z.half_pre = keeps_half_pre_activations();
  z.half_logits = keeps_half_logits();
  z.inputs = attention_.inputs_floats(B, T);
  z.shared_inputs = nsets > 1 && attention_.keeps_inputs(B, T);
  const size_t set_inputs = z.shared_inputs ? 0 : z.inputs;
  const size_t logits = z.half_logits ? ((size_t)head_rows_ * Vl + 1) / 2 : (size_t)head_rows_ * Vl;
  // ln1, ln2, atty and fch_gelu (and lnf below) are GEMM inputs: 16-bit where z.half, except an MoE
  // set's ln2 and fch_gelu (set_feeds_moe).
  size_t sets = 0;
  for (size_t s = 0; s < nsets; ++s) {
    const bool moe = set_feeds_moe(s);
    sets += z.act(N * C) + (moe ? N * C : z.act(N * C)) + n * C + n * 4 + z.act(N * Cl) + set_inputs +
            attention_.state_floats(B, T) + (z.half_pre && !moe ? z.act(N * W) : N * W) +
            (moe ? N * F : z.act(N * F));
  }
  size_t total = sets + (z.shared_inputs ? z.inputs : 0) + (L + 1) * n * C + z.act(N * C) + 2 * n + n * C + N * C + N * Cl + N * dQ +
                 N * (W + F) + logits + N + sp * (N * C + n * C + 4 * C) + kept +
                 (ltd_layers_.empty() ? 0 : (3 + 2 * sp) * N * C) + (cfg_.hidden_dropout > 0 ? n * C : 0);
  z.N = N, z.C = C, z.Cl = Cl, z.F = F, z.W = W, z.Vl = Vl, z.n = n, z.sp = sp, z.nsets = nsets, z.kept = kept, z.Q = Q;
  z.dQ = dQ, z.floats = total;
  if (cfg_.lora.enabled()) {  // x A^T per adapted linear and set; update scratch; the frozen norms' discarded gradients
    z.widest = std::max({C, Q, W});  // the widest adapter output: qkv's, fc's, or C
    const size_t r = cfg_.lora.rank, sets = nsets * 4 * N * r, extra = N * z.widest + N * r + (sp ? 0 : 4 * C);
    z.lora_emb = emb_lora_block_ >= 0 ? N * r + 2 * (size_t)head_rows_ * r + (size_t)head_rows_ * Vl + (size_t)T * r : 0;
    z.lora_floats = sets + extra + z.lora_emb;
  }
  return z;
}

bool Gpt::keeps_half_activations() const {
  return ops_->half_activations(precision_) && !tp_.sequence_parallel() && emb_lora_block_ < 0;
}

bool Gpt::keeps_half_pre_activations() const {
  return keeps_half_activations() && ops_->half_pre_activations(precision_) && cfg_.mlp == MlpKind::gelu &&
         !cfg_.lora.adapts(LoraConfig::fc);
}

bool Gpt::keeps_half_logits() const {
  return ops_->half_logits(precision_) && !tp_.enabled() && emb_lora_block_ < 0;
}

bool Gpt::set_feeds_moe(size_t s) const {
  if (s > 0) return s < tensors_.layers.size() && tensors_.layers[s].experts > 0;
  for (const Block& o : tensors_.layers)
    if (o.experts > 0) return true;
  return false;
}

size_t Gpt::workspace_bytes(int B, int T) const {
  const Sizes z = sizes(B, T);
  // The device's token, target, document-key and position buffers (int32 per row), and random-LTD's
  // kept rows per dropping layer, their starts and (rotary) positions.
  const size_t ltd = ltd_layers_.empty() ? 0 : ltd_layers_.size() + 1 + (cfg_.rotary ? 1 : 0);
  const size_t rows = ops_->host_memory() ? 0 : z.N * (2 + (cfg_.reset_attention_mask ? 1 : 0) +
                                                    (cfg_.reset_position_ids ? 1 : 0) + ltd);
  return (z.floats + z.lora_floats) * sizeof(float) + rows * sizeof(int32_t);
}

void Gpt::ensure_workspace(int B, int T) {
  if (T > cfg_.max_seq_length)
    throw config_error("--seq-length", "sequence of " + std::to_string(T) + " tokens exceeds the model's " +
                                           std::to_string(cfg_.max_seq_length) + " positions");
  if (tp_.sequence_parallel() && ((long long)B * T) % tp_.size() != 0)
    throw config_error("--sequence-parallel", "--sequence-parallel splits the " + std::to_string((long long)B * T) +
                                                  " token rows of a micro-batch (" + std::to_string(B) + " x " +
                                                  std::to_string(T) + ") over --tensor-model-parallel-size " +
                                                  std::to_string(tp_.size()) + ", which does not divide them",
                       "choose --seq-length or --micro-batch-size so that their product is divisible by the size");
  if (ws_ && (size_t)B * T <= (size_t)ws_->B * ws_->T && T <= ws_->T && B <= ws_->B) return;
  auto ws = std::make_unique<Workspace>();
  ws->B = B;
  ws->T = T;
  const Sizes z = sizes(B, T);
  const size_t N = z.N, C = z.C, Cl = z.Cl, F = z.F, W = z.W, Vl = z.Vl, n = z.n, sp = z.sp, nsets = z.nsets, kept = z.kept,
               L = z.L, dQ = z.dQ, total = z.floats;
  settle_losses();  // a loss download into the old buffers has finished
  ws_.reset();  // the old buffers go back before the new ones are taken
  ws->mem = kernels::BackendBuffer(*ops_, total * sizeof(float));
  ops_->zero(ws->mem.as<void>(), total * sizeof(float));
  float* p = ws->mem.as<float>();
  auto take = [&](size_t n) { float* r = p; p += n; return r; };
  auto take_act = [&](size_t n) -> kernels::Output {  // a GEMM input (sizes(): z.act)
    if (!z.half) return take(n);
    return kernels::Output::half(reinterpret_cast<uint16_t*>(take(z.act(n))), precision_);
  };
  ws->acts.resize(nsets);
  float* shared_qkv = z.shared_inputs ? take(z.inputs) : nullptr;
  for (size_t s = 0; s < nsets; ++s) {
    LayerActs& a = ws->acts[s];
    const bool moe = set_feeds_moe(s);
    a.ln1 = take_act(N * C);
    a.ln1_mean = take(n);
    a.ln1_rstd = take(n);
    a.qkv = shared_qkv ? shared_qkv : take(z.inputs);
    a.att = take(attention_.state_floats(B, T));
    a.atty = take_act(N * Cl);
    a.res2 = take(n * C);
    a.ln2 = moe ? kernels::Output(take(N * C)) : take_act(N * C);
    a.ln2_mean = take(n);
    a.ln2_rstd = take(n);
    a.fch = z.half_pre && !moe ? take_act(N * W) : kernels::Output(take(N * W));
    a.fch_gelu = moe ? kernels::Output(take(N * F)) : take_act(N * F);
  }
  ws->res = take((L + 1) * n * C);
  ws->lnf = take_act(N * C);
  ws->lnf_mean = take(n);
  ws->lnf_rstd = take(n);
  ws->dres = take(n * C);
  ws->dln = take(N * C);
  ws->datty = take(N * Cl);
  ws->dqkv = take(N * dQ);
  ws->dfch = take(N * W);
  ws->dfch_gelu = take(N * F);
  ws->logits = take(z.half_logits ? ((size_t)head_rows_ * Vl + 1) / 2 : (size_t)head_rows_ * Vl);
  ws->losses = take(N);
  if (kept) ws->kept_res2 = take(kept);
  if (!ltd_layers_.empty()) ws->ltd = take((3 + 2 * sp) * N * C);  // + the whole stream and output under SP
  if (cfg_.hidden_dropout > 0) ws->ddrop = take(n * C);
  if (sp) {
    ws->dfull = take(N * C);
    ws->dslice = take(n * C);
    ws->dnorm = take(4 * C);
  }
  if (cfg_.lora.enabled()) {  // laid out as sizes() counts it
    const size_t widest = z.widest, r = cfg_.lora.rank, emb = z.lora_emb;
    ws->lora_mem = kernels::BackendBuffer(*ops_, z.lora_floats * sizeof(float));
    float* q = ws->lora_mem.as<float>();
    for (auto& a : ws->acts)
      for (int t = 0; t < 4; ++t) a.lora_h[t] = q, q += N * r;
    ws->lora_t = q, q += N * widest;
    ws->lora_dh = q, q += N * r;
    if (!sp) ws->dnorm = q, q += 4 * C;
    if (emb) {
      ws->lora_u = q, q += N * r;
      ws->lora_z = q, q += 2 * (size_t)head_rows_ * r;
      ws->lora_logits = q, q += (size_t)head_rows_ * Vl;
      ws->lora_dpos = q;
    }
  }
  if (!ops_->host_memory()) {
    ws->host_losses = kernels::HostBuffer(*ops_, N * sizeof(float));
    ws->tokens = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
    ws->targets = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
    if (cfg_.reset_attention_mask) ws->key_start = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
    if (cfg_.reset_position_ids) ws->positions = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
    if (!ltd_layers_.empty()) {
      ws->ltd_rows.resize(L);
      for (int l : ltd_layers_) ws->ltd_rows[l] = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
      ws->ltd_start = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
      if (cfg_.rotary) ws->ltd_pos = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
    }
  }
  ws_ = std::move(ws);
}

size_t Gpt::activation_bytes() const {
  return (ws_ ? ws_->mem.bytes() + ws_->tokens.bytes() + ws_->targets.bytes() + ws_->key_start.bytes() +
                    ws_->positions.bytes() + ws_->lora_mem.bytes()
              : 0) +
         ops_->scratch_bytes();
}

}  // namespace hpct::model
