// GPT-2 forward/backward over hpct::kernels. See gpt.hpp for the contract.
#include "hpct/model/gpt.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"

namespace hpct::model {

using kernels::Precision;

void GptConfig::validate() const {
  auto pos = [](int v, const char* key) {
    if (v <= 0) throw config_error(key, std::string(key) + " must be positive, got " + std::to_string(v));
  };
  pos(num_layers, "--num-layers");
  pos(hidden_size, "--hidden-size");
  pos(num_heads, "--num-attention-heads");
  pos(max_seq_length, "--seq-length");
  pos(vocab_size, "--vocab-size");
  pos(vocab_multiple, "--make-vocab-size-divisible-by");
  if ((long long)vocab_size + vocab_multiple - 1 > 2147483647LL)  // padded_vocab() must not overflow
    throw config_error("--make-vocab-size-divisible-by", "--vocab-size " + std::to_string(vocab_size) +
                                                              " padded to a multiple of " + std::to_string(vocab_multiple) +
                                                              " does not fit 32 bits");
  if (hidden_size % num_heads != 0)
    throw config_error("--num-attention-heads", "--hidden-size " + std::to_string(hidden_size) +
                                                    " is not divisible by --num-attention-heads " +
                                                    std::to_string(num_heads));
  if (!(init_std > 0)) throw config_error("--init-method-std", "--init-method-std must be positive");
}

std::string GptConfig::describe() const {
  return "GPT: " + std::to_string(num_layers) + " layers, hidden " + std::to_string(hidden_size) + ", " +
         std::to_string(num_heads) + " heads, seq " + std::to_string(max_seq_length) + ", vocab " +
         std::to_string(vocab_size) + " (padded " + std::to_string(padded_vocab()) + ")";
}

// One layer's saved activations. With recompute there is one set, refilled per layer in backward.
struct Gpt::LayerActs {
  float* ln1;       // (N, C)
  float* ln1_mean;  // (N)
  float* ln1_rstd;  // (N)
  float* qkv;       // (N, 3C)
  float* att;       // (B, NH, T, T)
  float* atty;      // (N, C)
  float* res2;      // (N, C) residual after attention
  float* ln2;       // (N, C)
  float* ln2_mean;  // (N)
  float* ln2_rstd;  // (N)
  float* fch;       // (N, 4C)
  float* fch_gelu;  // (N, 4C)
};

struct Gpt::Workspace {
  int B = 0, T = 0;
  kernels::BackendBuffer mem;  // every float buffer below, in the backend's memory
  std::vector<LayerActs> acts;
  float* res = nullptr;       // (L+1, N, C) layer inputs; res[L] is the last layer's output
  float* lnf = nullptr;       // (N, C)
  float* lnf_mean = nullptr;  // (N)
  float* lnf_rstd = nullptr;  // (N)
  float* dres = nullptr;      // (N, C)
  float* dln = nullptr;       // (N, C) scratch for dln1 / dln2 / datty / dlnf
  float* datty = nullptr;     // (N, C)
  float* dqkv = nullptr;      // (N, 3C)
  float* dfch = nullptr;      // (N, 4C)
  float* dfch_gelu = nullptr; // (N, 4C)
  float* logits = nullptr;    // (kHeadRows, Vp)
  float* losses = nullptr;    // (N), in the backend's memory
  std::vector<float> host_losses;       // (N): the losses read back, on a device backend
  kernels::BackendBuffer tokens, targets;  // (N) int32 each, on a device backend
};

// Rows of the LM head processed at once: bounds the (rows, Vp) logits buffer (51 MB at
// Vp = 50304) instead of materialising (N, Vp), which is the largest tensor of a small GPT.
static constexpr int kHeadRows = 256;

Gpt::Gpt(const GptConfig& cfg, Precision precision, bool recompute, kernels::OpsBackend* ops)
    : cfg_(cfg), precision_(precision), recompute_(recompute) {
  cfg_.validate();
  if (!ops) own_ops_ = kernels::cpu_ops();
  ops_ = ops ? ops : own_ops_.get();
  const int64_t C = cfg_.hidden_size, Vp = cfg_.padded_vocab(), T = cfg_.max_seq_length;
  layout_.begin_block("embedding");
  wte_ = layout_.add("embedding.word_embeddings.weight", {Vp, C}, true).offset;
  wpe_ = layout_.add("embedding.position_embeddings.weight", {T, C}, true).offset;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    layout_.begin_block("layers." + std::to_string(l));
    size_t base = layout_.numel();
    auto rel = [&](const std::string& n, std::vector<int64_t> s, bool wd) { return layout_.add(p + n, std::move(s), wd).offset - base; };
    LayerOffsets o;
    o.ln1w = rel("input_layernorm.weight", {C}, false);
    o.ln1b = rel("input_layernorm.bias", {C}, false);
    o.qkvw = rel("attention.query_key_value.weight", {3 * C, C}, true);
    o.qkvb = rel("attention.query_key_value.bias", {3 * C}, false);
    o.projw = rel("attention.dense.weight", {C, C}, true);
    o.projb = rel("attention.dense.bias", {C}, false);
    o.ln2w = rel("post_attention_layernorm.weight", {C}, false);
    o.ln2b = rel("post_attention_layernorm.bias", {C}, false);
    o.fcw = rel("mlp.dense_h_to_4h.weight", {4 * C, C}, true);
    o.fcb = rel("mlp.dense_h_to_4h.bias", {4 * C}, false);
    o.fcprojw = rel("mlp.dense_4h_to_h.weight", {C, 4 * C}, true);
    o.fcprojb = rel("mlp.dense_4h_to_h.bias", {C}, false);
    lo_ = o;  // identical for every layer
  }
  layout_.begin_block("final_norm");
  size_t base = layout_.numel();
  lnfw_ = layout_.add("final_layernorm.weight", {C}, false).offset - base;
  lnfb_ = layout_.add("final_layernorm.bias", {C}, false).offset - base;
}

Gpt::~Gpt() = default;

void Gpt::init_params(float* params, uint64_t seed) const {
  for (size_t b = 0; b < layout_.blocks().size(); ++b)
    init_block(static_cast<int>(b), params + layout_.blocks()[b].offset, seed);
}

void Gpt::init_block(int block, float* dst, uint64_t seed) const {
  const double std_w = cfg_.init_std;
  const double std_out = cfg_.init_std / std::sqrt(2.0 * cfg_.num_layers);
  const size_t base = layout_.blocks()[block].offset;
  for (const auto& t : layout_.tensors()) {
    if (t.block != block) continue;
    float* p = dst + (t.offset - base);
    // One stream per tensor, keyed by its index: init does not depend on how others are laid out.
    Rng rng(mix_seed(seed, std::hash<std::string>{}(t.name) & 0xffffffffu, 0x1417));
    bool is_norm_weight = t.name.find("layernorm.weight") != std::string::npos;
    bool is_bias = t.name.size() >= 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    bool is_out = t.name.find("attention.dense.weight") != std::string::npos ||
                  t.name.find("dense_4h_to_h.weight") != std::string::npos;
    for (size_t i = 0; i < t.numel; ++i) {
      if (is_norm_weight) p[i] = 1.0f;
      else if (is_bias) p[i] = 0.0f;
      else p[i] = static_cast<float>(rng.normal() * (is_out ? std_out : std_w));
    }
  }
}

void Gpt::ensure_workspace(int B, int T) {
  if (T > cfg_.max_seq_length)
    throw config_error("--seq-length", "sequence of " + std::to_string(T) + " tokens exceeds the model's " +
                                           std::to_string(cfg_.max_seq_length) + " positions");
  if (ws_ && (size_t)B * T <= (size_t)ws_->B * ws_->T && T <= ws_->T && B <= ws_->B) return;
  auto ws = std::make_unique<Workspace>();
  ws->B = B;
  ws->T = T;
  const size_t N = (size_t)B * T, C = cfg_.hidden_size, NH = cfg_.num_heads, L = cfg_.num_layers;
  const size_t Vp = cfg_.padded_vocab();
  const size_t nsets = recompute_ ? 1 : L;
  size_t per_layer = N * C * 5 + N * 4 + N * 3 * C + (size_t)B * NH * T * T + N * 4 * C * 2;
  size_t total = nsets * per_layer + (L + 1) * N * C + N * C + 2 * N + N * C * 3 + N * 3 * C + N * 4 * C * 2 +
                 (size_t)kHeadRows * Vp + N;
  ws_.reset();  // the old buffers go back before the new ones are taken
  ws->mem = kernels::BackendBuffer(*ops_, total * sizeof(float));
  ops_->zero(ws->mem.as<void>(), total * sizeof(float));
  float* p = ws->mem.as<float>();
  auto take = [&](size_t n) { float* r = p; p += n; return r; };
  ws->acts.resize(nsets);
  for (auto& a : ws->acts) {
    a.ln1 = take(N * C);
    a.ln1_mean = take(N);
    a.ln1_rstd = take(N);
    a.qkv = take(N * 3 * C);
    a.att = take((size_t)B * NH * T * T);
    a.atty = take(N * C);
    a.res2 = take(N * C);
    a.ln2 = take(N * C);
    a.ln2_mean = take(N);
    a.ln2_rstd = take(N);
    a.fch = take(N * 4 * C);
    a.fch_gelu = take(N * 4 * C);
  }
  ws->res = take((L + 1) * N * C);
  ws->lnf = take(N * C);
  ws->lnf_mean = take(N);
  ws->lnf_rstd = take(N);
  ws->dres = take(N * C);
  ws->dln = take(N * C);
  ws->datty = take(N * C);
  ws->dqkv = take(N * 3 * C);
  ws->dfch = take(N * 4 * C);
  ws->dfch_gelu = take(N * 4 * C);
  ws->logits = take((size_t)kHeadRows * Vp);
  ws->losses = take(N);
  if (!ops_->host_memory()) {
    ws->host_losses.assign(N, 0.0f);
    ws->tokens = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
    ws->targets = kernels::BackendBuffer(*ops_, N * sizeof(int32_t));
  }
  ws_ = std::move(ws);
}

size_t Gpt::activation_bytes() const {
  return (ws_ ? ws_->mem.bytes() + ws_->tokens.bytes() + ws_->targets.bytes() : 0) + ops_->scratch_bytes();
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
  if (ops_->host_memory()) return {tokens, targets};
  Workspace& w = *ws_;
  ops_->copy_from_host(w.tokens.as<void>(), tokens, N * sizeof(int32_t));
  ops_->copy_from_host(w.targets.as<void>(), targets, N * sizeof(int32_t));
  return {w.tokens.as<int32_t>(), w.targets.as<int32_t>()};
}

double Gpt::flops_per_iteration(long long B, long long T) const {
  // Megatron's 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) counts forward+backward (x3) plus one
  // recompute forward (x4 in all); without recompute the same model FLOPs are 3/4 of it.
  const double l = cfg_.num_layers, h = cfg_.hidden_size, s = (double)T, V = cfg_.padded_vocab();
  double f = 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h));
  return recompute_ ? f : f * 0.75;
}

void Gpt::layer_forward(int l, const float* lp, LayerActs& a, const float* in, float* out, int B, int T) {
  const int N = B * T, C = cfg_.hidden_size, NH = cfg_.num_heads;
  ops_->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, in, lp + lo_.ln1w, lp + lo_.ln1b, N, C);
  ops_->matmul_forward(a.qkv, a.ln1, lp + lo_.qkvw, lp + lo_.qkvb, N, C, 3 * C, precision_);
  ops_->attention_forward(a.atty, a.att, a.qkv, B, T, C, NH, precision_);
  ops_->matmul_forward(a.res2, a.atty, lp + lo_.projw, lp + lo_.projb, N, C, C, precision_);
  ops_->residual_forward(a.res2, in, a.res2, (size_t)N * C);
  ops_->layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, lp + lo_.ln2w, lp + lo_.ln2b, N, C);
  ops_->matmul_forward(a.fch, a.ln2, lp + lo_.fcw, lp + lo_.fcb, N, C, 4 * C, precision_);
  ops_->gelu_forward(a.fch_gelu, a.fch, (size_t)N * 4 * C);
  ops_->matmul_forward(out, a.fch_gelu, lp + lo_.fcprojw, lp + lo_.fcprojb, N, 4 * C, C, precision_);
  ops_->residual_forward(out, a.res2, out, (size_t)N * C);
}

// dres holds d(loss)/d(layer output) on entry and d(loss)/d(layer input) on return.
void Gpt::layer_backward(int l, const float* lp, float* lg, LayerActs& a, const float* in, float* dres, int B, int T) {
  const int N = B * T, C = cfg_.hidden_size, NH = cfg_.num_heads;
  Workspace& w = *ws_;
  const size_t NC = (size_t)N * C;
  ops_->zero(w.dfch_gelu, NC * 4 * sizeof(float));
  ops_->matmul_backward(w.dfch_gelu, lg + lo_.fcprojw, lg + lo_.fcprojb, dres, a.fch_gelu, lp + lo_.fcprojw, N,
                           4 * C, C, precision_);
  ops_->zero(w.dfch, NC * 4 * sizeof(float));
  ops_->gelu_backward(w.dfch, a.fch, w.dfch_gelu, NC * 4);
  ops_->zero(w.dln, NC * sizeof(float));
  ops_->matmul_backward(w.dln, lg + lo_.fcw, lg + lo_.fcb, w.dfch, a.ln2, lp + lo_.fcw, N, C, 4 * C, precision_);
  // residual: d(res2) = dres (skip path) + layernorm2 backward, accumulated in place
  ops_->layernorm_backward(dres, lg + lo_.ln2w, lg + lo_.ln2b, w.dln, a.res2, lp + lo_.ln2w, a.ln2_mean, a.ln2_rstd,
                              N, C);
  ops_->zero(w.datty, NC * sizeof(float));
  ops_->matmul_backward(w.datty, lg + lo_.projw, lg + lo_.projb, dres, a.atty, lp + lo_.projw, N, C, C, precision_);
  ops_->zero(w.dqkv, NC * 3 * sizeof(float));
  ops_->attention_backward(w.dqkv, w.datty, a.qkv, a.att, B, T, C, NH, precision_);
  ops_->zero(w.dln, NC * sizeof(float));
  ops_->matmul_backward(w.dln, lg + lo_.qkvw, lg + lo_.qkvb, w.dqkv, a.ln1, lp + lo_.qkvw, N, C, 3 * C, precision_);
  ops_->layernorm_backward(dres, lg + lo_.ln1w, lg + lo_.ln1b, w.dln, in, lp + lo_.ln1w, a.ln1_mean, a.ln1_rstd, N,
                              C);
}

// Final norm + tied LM head + loss, chunked over rows. With backward, also writes d(x) into dx
// (overwritten) and accumulates the head's share of d(wte) and the final norm's gradients.
double Gpt::head(const float* ep, float* eg, const float* fp, float* fg, const float* x, const int32_t* targets, int B,
                 int T, float dloss, bool backward, float* dx) {
  const int N = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  Workspace& w = *ws_;
  ops_->layernorm_forward(w.lnf, w.lnf_mean, w.lnf_rstd, x, fp + lnfw_, fp + lnfb_, N, C);
  if (backward) ops_->zero(w.dln, (size_t)N * C * sizeof(float));
  double loss_sum = 0;
  for (int r0 = 0; r0 < N; r0 += kHeadRows) {
    int rows = std::min(kHeadRows, N - r0);
    const float* xin = w.lnf + (size_t)r0 * C;
    ops_->matmul_forward(w.logits, xin, ep + wte_, nullptr, rows, C, Vp, precision_);
    ops_->softmax_cross_entropy(w.logits, w.losses + r0, targets + r0, dloss, rows, V, Vp);
    if (backward)
      ops_->matmul_backward(w.dln + (size_t)r0 * C, eg + wte_, nullptr, w.logits, xin, ep + wte_, rows, C, Vp,
                               precision_);
  }
  const float* losses = w.losses;
  if (!ops_->host_memory()) {
    ops_->copy_to_host(w.host_losses.data(), w.losses, (size_t)N * sizeof(float));
    losses = w.host_losses.data();
  }
  for (int i = 0; i < N; ++i) loss_sum += losses[i];  // in row order, as on every backend
  if (backward) {
    ops_->zero(dx, (size_t)N * C * sizeof(float));
    ops_->layernorm_backward(dx, fg + lnfw_, fg + lnfb_, w.dln, x, fp + lnfw_, w.lnf_mean, w.lnf_rstd, N, C);
  }
  return loss_sum;
}

// Embedding and every layer's forward into the residual stream res[0..L]. With keep_acts each layer
// saves its activations in its own set (for backward without recompute); otherwise all share set 0.
// Returns the embedding block's parameters, still held (the tied head needs them).
const float* Gpt::forward_layers(ParamStore& store, const int32_t* tokens, int B, int T, bool keep_acts) {
  Workspace& w = *ws_;
  const int C = cfg_.hidden_size;
  const size_t NC = (size_t)B * T * C;
  const float* ep = store.params(0);
  ops_->encoder_forward(w.res, tokens, ep + wte_, ep + wpe_, B, T, C);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    layer_forward(l, store.params(l + 1), w.acts[keep_acts ? l : 0], w.res + l * NC, w.res + (l + 1) * NC, B, T);
    store.release(l + 1);
  }
  return ep;
}

double Gpt::forward_backward(ParamStore& store, const int32_t* host_tokens, const int32_t* host_targets, int B, int T,
                             float dloss) {
  const auto [tokens, targets] = stage_inputs(host_tokens, host_targets, B, T);
  const float* ep = forward_layers(store, tokens, B, T, /*keep_acts=*/!recompute_);
  Workspace& w = *ws_;
  const int L = cfg_.num_layers, C = cfg_.hidden_size;
  const size_t NC = (size_t)B * T * C;
  const float* fp = store.params(L + 1);
  double loss = head(ep, store.grads(0), fp, store.grads(L + 1), w.res + L * NC, targets, B, T, dloss, true, w.dres);
  store.release(L + 1);
  store.release(0);  // the tied head was the last reader of the embedding's parameters (ZeRO-3 frees them now)
  store.grads_ready(L + 1);
  for (int l = L - 1; l >= 0; --l) {
    LayerActs& a = w.acts[recompute_ ? 0 : l];
    const float* lp = store.params(l + 1);
    if (recompute_) layer_forward(l, lp, a, w.res + l * NC, w.res + (l + 1) * NC, B, T);
    layer_backward(l, lp, store.grads(l + 1), a, w.res + l * NC, w.dres, B, T);
    store.release(l + 1);
    store.grads_ready(l + 1);
  }
  float* eg = store.grads(0);
  ops_->encoder_backward(eg + wte_, eg + wpe_, w.dres, tokens, B, T, C);
  store.grads_ready(0);
  return loss;
}

double Gpt::forward_loss(ParamStore& store, const int32_t* host_tokens, const int32_t* host_targets, int B, int T) {
  const auto [tokens, targets] = stage_inputs(host_tokens, host_targets, B, T);
  // evaluation keeps no activations for backward: every layer reuses the first set
  const float* ep = forward_layers(store, tokens, B, T, /*keep_acts=*/false);
  Workspace& w = *ws_;
  const int L = cfg_.num_layers;
  const size_t NC = (size_t)B * T * cfg_.hidden_size;
  double loss = head(ep, nullptr, store.params(L + 1), nullptr, w.res + L * NC, targets, B, T, 0.0f, false, nullptr);
  store.release(L + 1);
  store.release(0);
  return loss;
}

}  // namespace hpct::model
