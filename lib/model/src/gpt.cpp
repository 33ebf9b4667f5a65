// GPT-2 forward/backward over hpct::kernels. See gpt.hpp for the contract.
#include "hpct/model/gpt.hpp"

#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/core/timer.hpp"
#include "gpt_acts.hpp"

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
  pos(tensor_parallel, "--tensor-model-parallel-size");
  if ((long long)vocab_size + vocab_granule() - 1 > 2147483647LL)  // padded_vocab() must not overflow
    throw config_error("--make-vocab-size-divisible-by", "--vocab-size " + std::to_string(vocab_size) +
                                                              " padded to a multiple of " + std::to_string(vocab_granule()) +
                                                              " does not fit 32 bits");
  if (hidden_size % num_heads != 0)
    throw config_error("--num-attention-heads", "--hidden-size " + std::to_string(hidden_size) +
                                                    " is not divisible by --num-attention-heads " +
                                                    std::to_string(num_heads));
  if (num_heads % tensor_parallel != 0)
    throw config_error("--tensor-model-parallel-size", "--num-attention-heads " + std::to_string(num_heads) +
                                                           " is not divisible by --tensor-model-parallel-size " +
                                                           std::to_string(tensor_parallel),
                       "each tensor-parallel rank computes whole heads: choose a size that divides the heads");
  if (!(init_std > 0)) throw config_error("--init-method-std", "--init-method-std must be positive");
  const auto& m = moe;
  if (m.expert_interval < 1)
    throw config_error("--expert-interval", "--expert-interval must be at least 1, got " + std::to_string(m.expert_interval));
  for (int e : m.num_experts)
    if (e < 1) throw config_error("--num-experts", "--num-experts entries must be at least 1, got " + std::to_string(e));
  const int nmoe = m.moe_layers(num_layers);
  if (m.num_experts.size() > 1 && static_cast<int>(m.num_experts.size()) != nmoe)
    throw config_error("--num-experts", "--num-experts lists " + std::to_string(m.num_experts.size()) +
                                            " counts but the model has " + std::to_string(nmoe) + " MoE layers (--num-layers " +
                                            std::to_string(num_layers) + " / --expert-interval " +
                                            std::to_string(m.expert_interval) + ")",
                       "give one count for every MoE layer, or a single count for all");
  if (!m.enabled(num_layers)) return;
  if (m.topk < 1 || m.topk > 2) throw config_error("--topk", "--topk must be 1 or 2, got " + std::to_string(m.topk));
  for (int l = 0; l < num_layers; ++l)
    if (int e = m.experts_of(l, num_layers); e > 0 && m.topk > e)
      throw config_error("--topk", "--topk " + std::to_string(m.topk) + " exceeds the " + std::to_string(e) +
                                       " experts of layer " + std::to_string(l + 1));
  if (!(m.train_capacity_factor > 0) || !std::isfinite(m.train_capacity_factor))
    throw config_error("--moe-train-capacity-factor", "--moe-train-capacity-factor must be positive");
  if (!(m.eval_capacity_factor > 0) || !std::isfinite(m.eval_capacity_factor))
    throw config_error("--moe-eval-capacity-factor", "--moe-eval-capacity-factor must be positive");
  if (m.min_capacity < 0) throw config_error("--moe-min-capacity", "--moe-min-capacity must not be negative");
  if (m.noisy_gate_policy != "None" && m.noisy_gate_policy != "Jitter" && m.noisy_gate_policy != "RSample")
    throw config_error("--moe-noisy-gate-policy", "--moe-noisy-gate-policy must be None, Jitter or RSample, got '" +
                                                      printable(m.noisy_gate_policy) + "'");
  if (!(m.loss_coeff >= 0) || !std::isfinite(m.loss_coeff))
    throw config_error("--moe-loss-coeff", "--moe-loss-coeff must be a non-negative number");
  if (!(m.z_loss_coeff >= 0) || !std::isfinite(m.z_loss_coeff))
    throw config_error("--moe-z-loss-coeff", "--moe-z-loss-coeff must be a non-negative number");
}

long long GptConfig::vocab_granule() const {
  return std::lcm((long long)std::max(1, vocab_multiple), (long long)std::max(1, tensor_parallel));
}

int GptConfig::padded_vocab() const {
  const long long g = vocab_granule();
  return static_cast<int>((vocab_size + g - 1) / g * g);
}

std::string GptConfig::describe() const {
  return "GPT: " + std::to_string(num_layers) + " layers, hidden " + std::to_string(hidden_size) + ", " +
         std::to_string(num_heads) + " heads, seq " + std::to_string(max_seq_length) + ", vocab " +
         std::to_string(vocab_size) + " (padded " + std::to_string(padded_vocab()) + ")" +
         (tensor_parallel > 1 ? ", tensor-parallel " + std::to_string(tensor_parallel) : std::string());
}

// Rows of the LM head processed at once: bounds the (rows, Vp) logits buffer (51 MB at
// Vp = 50304) instead of materialising (N, Vp), which is the largest tensor of a small GPT.
static constexpr int kHeadRows = 256;

int MoeConfig::experts_of(int layer, int num_layers) const {
  if (num_experts.empty() || expert_interval <= 0) return 0;
  const int n = layer + 1;  // Megatron-DeepSpeed numbers layers from 1
  if (n % expert_interval != 0) return 0;
  const int i = num_experts.size() == 1 ? 0 : (n - 1) / expert_interval;
  if (i >= static_cast<int>(num_experts.size())) return 0;
  return num_experts[i] > 1 ? num_experts[i] : 0;
}

bool MoeConfig::enabled(int num_layers) const {
  for (int l = 0; l < num_layers; ++l)
    if (experts_of(l, num_layers) > 0) return true;
  return false;
}

void Gpt::build_layout(const GptConfig& cfg, int tp_rank, ParamLayout& layout, std::vector<Block>* blocks, size_t* wte,
                       size_t* wpe, size_t* lnfw, size_t* lnfb) {
  const int64_t C = cfg.hidden_size, Vp = cfg.padded_vocab(), T = cfg.max_seq_length;
  // Megatron's split: column-parallel (rows of the (out, in) weight and its bias; QKV by sections
  // q|k|v), row-parallel (columns; the bias is a replica), everything else a replica.
  const int P = cfg.tensor_parallel;
  if (tp_rank < 0 || tp_rank >= P) throw Error("GPT layout: tensor-parallel rank " + std::to_string(tp_rank) + " of " + std::to_string(P));
  const Partition col{0, P, tp_rank, 1}, qkv{0, P, tp_rank, 3}, row{1, P, tp_rank, 1}, rep{-1, P, tp_rank, 1};
  layout.begin_block("embedding");
  *wte = layout.add("embedding.word_embeddings.weight", {Vp, C}, true, col).offset;
  *wpe = layout.add("embedding.position_embeddings.weight", {T, C}, true, rep).offset;
  int moe_index = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    layout.begin_block("layers." + std::to_string(l));
    Block o;
    o.block = static_cast<int>(layout.blocks().size()) - 1;
    size_t base = layout.numel();
    auto rel = [&](const std::string& n, std::vector<int64_t> s, bool wd, const Partition& part) {
      return layout.add(p + n, std::move(s), wd, part).offset - base;
    };
    o.ln1w = rel("input_layernorm.weight", {C}, false, rep);
    o.ln1b = rel("input_layernorm.bias", {C}, false, rep);
    o.qkvw = rel("attention.query_key_value.weight", {3 * C, C}, true, qkv);
    o.qkvb = rel("attention.query_key_value.bias", {3 * C}, false, qkv);
    o.projw = rel("attention.dense.weight", {C, C}, true, row);
    o.projb = rel("attention.dense.bias", {C}, false, rep);
    o.ln2w = rel("post_attention_layernorm.weight", {C}, false, rep);
    o.ln2b = rel("post_attention_layernorm.bias", {C}, false, rep);
    o.experts = cfg.moe.experts_of(l, cfg.num_layers);
    if (o.experts > 0) o.routerw = rel("mlp.router.weight", {o.experts, C}, false, rep);  // DeepSpeed's wg: no bias
    if (o.experts == 0 || cfg.moe.residual) {
      o.fcw = rel("mlp.dense_h_to_4h.weight", {4 * C, C}, true, col);
      o.fcb = rel("mlp.dense_h_to_4h.bias", {4 * C}, false, col);
      o.fcprojw = rel("mlp.dense_4h_to_h.weight", {C, 4 * C}, true, row);
      o.fcprojb = rel("mlp.dense_4h_to_h.bias", {C}, false, rep);
    }
    if (o.experts > 0 && cfg.moe.residual) {
      o.coefw = rel("mlp.coefficient.weight", {2, C}, true, rep);
      o.coefb = rel("mlp.coefficient.bias", {2}, false, rep);
    }
    if (o.experts > 0) {
      o.moe_index = moe_index++;
      for (int e = 0; e < o.experts; ++e) {
        // Every expert block has the same internal offsets as the dense MLP's tensors would alone.
        std::string ep = p + "mlp.experts." + std::to_string(e);
        layout.begin_block(ep, ReduceGroup::expert);
        o.expert_blocks.push_back(static_cast<int>(layout.blocks().size()) - 1);
        // Experts stay whole on a rank: every tensor-parallel rank holds the same ones.
        layout.add(ep + ".dense_h_to_4h.weight", {4 * C, C}, true, rep);
        layout.add(ep + ".dense_h_to_4h.bias", {4 * C}, false, rep);
        layout.add(ep + ".dense_4h_to_h.weight", {C, 4 * C}, true, rep);
        layout.add(ep + ".dense_4h_to_h.bias", {C}, false, rep);
      }
    }
    if (blocks) blocks->push_back(std::move(o));
  }
  layout.begin_block("final_norm");
  size_t base = layout.numel();
  *lnfw = layout.add("final_layernorm.weight", {C}, false, rep).offset - base;
  *lnfb = layout.add("final_layernorm.bias", {C}, false, rep).offset - base;
}

ParamLayout Gpt::layout_for(const GptConfig& cfg, int tp_rank) {
  cfg.validate();
  ParamLayout layout;
  size_t a, b, c, d;
  build_layout(cfg, tp_rank, layout, nullptr, &a, &b, &c, &d);
  return layout;
}

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
  if (tp_.enabled() && !ops_->host_memory())
    throw config_error("--tensor-model-parallel-size", "tensor parallelism runs on the CPU backend only in this version (--device " + ops_->name() + ")",
                       "train with --device cpu, or --tensor-model-parallel-size 1 on the GPU");
  Cl_ = cfg_.hidden_size / tp_.size();
  NHl_ = cfg_.num_heads / tp_.size();
  Fl_ = 4 * cfg_.hidden_size / tp_.size();
  Vl_ = cfg_.padded_vocab() / tp_.size();
  vstart_ = tp_.rank() * Vl_;
  build_layout(cfg_, tp_.rank(), layout_, &blocks_, &wte_, &wpe_, &lnfw_, &lnfb_);
  final_block_ = static_cast<int>(layout_.blocks().size()) - 1;
  const size_t C = cfg_.hidden_size;
  ex_ = ExpertOffsets{0, 4 * C * C, 4 * C * C + 4 * C, 8 * C * C + 4 * C};
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const Block& o = blocks_[l];
    if (o.experts == 0) continue;
    if (o.experts % ep_size_ != 0)
      throw config_error("--moe-expert-parallel-size",
                         "--moe-expert-parallel-size " + std::to_string(ep_size_) + " does not divide the " +
                             std::to_string(o.experts) + " experts of layer " + std::to_string(l + 1),
                         "choose an expert-parallel size that divides every --num-experts entry");
    if (!ops_->host_memory())
      throw config_error("--device", "MoE layers run on the CPU backend only in this version (--device " + ops_->name() + ")",
                         "train MoE models with --device cpu");
  }
}

std::vector<int> Gpt::held_blocks() const {
  std::vector<int> held;
  for (size_t b = 0; b < layout_.blocks().size(); ++b) {
    bool mine = true;
    for (const auto& o : blocks_)
      for (size_t e = 0; e < o.expert_blocks.size(); ++e)
        if (o.expert_blocks[e] == static_cast<int>(b)) mine = static_cast<int>(e) / (o.experts / ep_size_) == ep_rank_;
    if (mine) held.push_back(static_cast<int>(b));
  }
  return held;
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
    if (is_norm_weight || is_bias) {
      std::fill(p, p + t.numel, is_norm_weight ? 1.0f : 0.0f);
      continue;
    }
    const double sd = is_out ? std_out : std_w;
    // A tensor-parallel part draws the full tensor's sequence and keeps its own elements, so every
    // element has the value it has at T = 1 (Megatron's --use-cpu-initialization does the same).
    uint64_t next = 0;  // full-tensor index of the next draw
    t.for_full_runs(0, t.numel, [&](uint64_t full, uint64_t local, uint64_t n) {
      for (; next < full; ++next) rng.normal();
      for (uint64_t k = 0; k < n; ++k, ++next) p[local + k] = static_cast<float>(rng.normal() * sd);
    });
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
  // Tensor-parallel parts: attention channels Cl = C/T, heads NH/T, MLP width F = 4C/T, Vl = Vp/T.
  const size_t N = (size_t)B * T, C = cfg_.hidden_size, L = cfg_.num_layers;
  const size_t Cl = Cl_, NHl = NHl_, F = Fl_, Vl = Vl_;
  const size_t nsets = recompute_ ? 1 : L;
  size_t per_layer = N * C * 3 + N * Cl + N * 4 + N * 3 * Cl + (size_t)B * NHl * T * T + N * F * 2;
  size_t total = nsets * per_layer + (L + 1) * N * C + N * C + 2 * N + N * C * 2 + N * Cl + N * 3 * Cl + N * F * 2 +
                 (size_t)kHeadRows * Vl + N;
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
    a.qkv = take(N * 3 * Cl);
    a.att = take((size_t)B * NHl * T * T);
    a.atty = take(N * Cl);
    a.res2 = take(N * C);
    a.ln2 = take(N * C);
    a.ln2_mean = take(N);
    a.ln2_rstd = take(N);
    a.fch = take(N * F);
    a.fch_gelu = take(N * F);
  }
  ws->res = take((L + 1) * N * C);
  ws->lnf = take(N * C);
  ws->lnf_mean = take(N);
  ws->lnf_rstd = take(N);
  ws->dres = take(N * C);
  ws->dln = take(N * C);
  ws->datty = take(N * Cl);
  ws->dqkv = take(N * 3 * Cl);
  ws->dfch = take(N * F);
  ws->dfch_gelu = take(N * F);
  ws->logits = take((size_t)kHeadRows * Vl);
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
  // MoE: a token runs k expert MLPs (and the dense one beside them in a residual MoE) where a dense
  // layer runs one; each MLP is 16h^2 of the layer's 24h^2 per token. Router and combine omitted.
  for (const auto& o : blocks_)
    if (o.experts > 0) f += 64.0 * B * s * h * h * (cfg_.moe.topk - 1 + (cfg_.moe.residual ? 1 : 0));
  return recompute_ ? f : f * 0.75;
}

void Gpt::mlp_forward(const float* fcw, const float* fcb, const float* projw, const float* projb, const float* x,
                      float* fch, float* fch_gelu, float* out, int rows, int F) {
  const int C = cfg_.hidden_size;
  ops_->matmul_forward(fch, x, fcw, fcb, rows, C, F, precision_);
  ops_->gelu_forward(fch_gelu, fch, (size_t)rows * F);
  ops_->matmul_forward(out, fch_gelu, projw, projb, rows, F, C, precision_);
}

// dx is ACCUMULATED (zero it first for an overwrite); the weight gradients too.
void Gpt::mlp_backward(const float* fcw, const float* projw, float* dfcw, float* dfcb, float* dprojw, float* dprojb,
                       const float* x, const float* fch, const float* fch_gelu, const float* dout, float* dx, int rows,
                       float* dfch, float* dfch_gelu, int F) {
  const int C = cfg_.hidden_size;
  const size_t n4 = (size_t)rows * F;
  ops_->zero(dfch_gelu, n4 * sizeof(float));
  ops_->matmul_backward(dfch_gelu, dprojw, dprojb, dout, fch_gelu, projw, rows, F, C, precision_);
  ops_->zero(dfch, n4 * sizeof(float));
  ops_->gelu_backward(dfch, fch, dfch_gelu, n4);
  ops_->matmul_backward(dx, dfcw, dfcb, dfch, x, fcw, rows, C, F, precision_);
}

void Gpt::layer_forward(ParamStore& store, int l, const float* lp, LayerActs& a, const float* in, float* out, int B,
                        int T) {
  const int N = B * T, C = cfg_.hidden_size;
  const Block& o = blocks_[l];
  ops_->layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, in, lp + o.ln1w, lp + o.ln1b, N, C);
  // Attention: QKV column-parallel (this rank's heads), the output projection row-parallel, then g.
  ops_->matmul_forward(a.qkv, a.ln1, lp + o.qkvw, lp + o.qkvb, N, C, 3 * Cl_, precision_);
  ops_->attention_forward(a.atty, a.att, a.qkv, B, T, Cl_, NHl_, precision_);
  ops_->matmul_forward(a.res2, a.atty, lp + o.projw, row_bias(lp + o.projb), N, Cl_, C, precision_);
  tp_.all_reduce(a.res2, (size_t)N * C);
  ops_->residual_forward(a.res2, in, a.res2, (size_t)N * C);
  ops_->layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, lp + o.ln2w, lp + o.ln2b, N, C);
  if (o.experts == 0) {  // fc column-parallel, fc2 row-parallel, then g
    mlp_forward(lp + o.fcw, lp + o.fcb, lp + o.fcprojw, row_bias(lp + o.fcprojb), a.ln2, a.fch, a.fch_gelu, out, N, Fl_);
    tp_.all_reduce(out, (size_t)N * C);
  } else {
    moe_forward(store, l, lp, a, out, N);
  }
  ops_->residual_forward(out, a.res2, out, (size_t)N * C);
}

// dres holds d(loss)/d(layer output) on entry and d(loss)/d(layer input) on return.
void Gpt::layer_backward(ParamStore& store, int l, const float* lp, float* lg, LayerActs& a, const float* in,
                         float* dres, int B, int T) {
  const int N = B * T, C = cfg_.hidden_size;
  const Block& o = blocks_[l];
  Workspace& w = *ws_;
  const size_t NC = (size_t)N * C;
  ops_->zero(w.dln, NC * sizeof(float));
  if (o.experts == 0) {
    mlp_backward(lp + o.fcw, lp + o.fcprojw, lg + o.fcw, lg + o.fcb, lg + o.fcprojw, lg + o.fcprojb, a.ln2, a.fch,
                 a.fch_gelu, dres, w.dln, N, w.dfch, w.dfch_gelu, Fl_);
    tp_.all_reduce(w.dln, NC);  // f's backward: the parts' input gradients summed
  } else {
    moe_backward(store, l, lp, lg, a, dres, w.dln, N);
  }
  // residual: d(res2) = dres (skip path) + layernorm2 backward, accumulated in place
  ops_->layernorm_backward(dres, lg + o.ln2w, lg + o.ln2b, w.dln, a.res2, lp + o.ln2w, a.ln2_mean, a.ln2_rstd, N, C);
  const size_t NCl = (size_t)N * Cl_;
  ops_->zero(w.datty, NCl * sizeof(float));
  ops_->matmul_backward(w.datty, lg + o.projw, lg + o.projb, dres, a.atty, lp + o.projw, N, Cl_, C, precision_);
  ops_->zero(w.dqkv, NCl * 3 * sizeof(float));
  ops_->attention_backward(w.dqkv, w.datty, a.qkv, a.att, B, T, Cl_, NHl_, precision_);
  ops_->zero(w.dln, NC * sizeof(float));
  ops_->matmul_backward(w.dln, lg + o.qkvw, lg + o.qkvb, w.dqkv, a.ln1, lp + o.qkvw, N, C, 3 * Cl_, precision_);
  tp_.all_reduce(w.dln, NC);
  ops_->layernorm_backward(dres, lg + o.ln1w, lg + o.ln1b, w.dln, in, lp + o.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
}

// Final norm + tied LM head + loss, chunked over rows. With backward, also writes d(x) into dx
// (overwritten) and accumulates the head's share of d(wte) and the final norm's gradients.
double Gpt::head(const float* ep, float* eg, const float* fp, float* fg, const float* x, const int32_t* targets, int B,
                 int T, float dloss, bool backward, float* dx) {
  const int N = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  Workspace& w = *ws_;
  // Vocab-parallel: this rank's Vl_ columns of the logits; the loss over the group (tensor_parallel.hpp).
  ops_->layernorm_forward(w.lnf, w.lnf_mean, w.lnf_rstd, x, fp + lnfw_, fp + lnfb_, N, C);
  if (backward) ops_->zero(w.dln, (size_t)N * C * sizeof(float));
  double loss_sum = 0;
  for (int r0 = 0; r0 < N; r0 += kHeadRows) {
    int rows = std::min(kHeadRows, N - r0);
    const float* xin = w.lnf + (size_t)r0 * C;
    ops_->matmul_forward(w.logits, xin, ep + wte_, nullptr, rows, C, Vl_, precision_);
    if (tp_.enabled())
      tp_.cross_entropy(w.logits, w.losses + r0, targets + r0, dloss, rows, Vl_, vstart_, V, backward);
    else
      ops_->softmax_cross_entropy(w.logits, w.losses + r0, targets + r0, dloss, rows, V, Vp);
    if (backward)
      ops_->matmul_backward(w.dln + (size_t)r0 * C, eg + wte_, nullptr, w.logits, xin, ep + wte_, rows, C, Vl_,
                               precision_);
  }
  const float* losses = w.losses;
  if (!ops_->host_memory()) {
    ops_->copy_to_host(w.host_losses.data(), w.losses, (size_t)N * sizeof(float));
    losses = w.host_losses.data();
  }
  for (int i = 0; i < N; ++i) loss_sum += losses[i];  // in row order, as on every backend
  if (backward) {
    tp_.all_reduce(w.dln, (size_t)N * C);
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
  if (tp_.enabled()) tp_.embedding_forward(w.res, tokens, ep + wte_, ep + wpe_, B, T, C, vstart_, Vl_);
  else ops_->encoder_forward(w.res, tokens, ep + wte_, ep + wpe_, B, T, C);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const int b = blocks_[l].block;
    layer_forward(store, l, store.params(b), w.acts[keep_acts ? l : 0], w.res + l * NC, w.res + (l + 1) * NC, B, T);
    store.release(b);
  }
  return ep;
}

double Gpt::forward_backward(ParamStore& store, const int32_t* host_tokens, const int32_t* host_targets, int B, int T,
                             float dloss) {
  const auto [tokens, targets] = stage_inputs(host_tokens, host_targets, B, T);
  training_ = true;
  dloss_ = dloss;
  Timer phase;
  const float* ep = forward_layers(store, tokens, B, T, /*keep_acts=*/!recompute_);
  phase_.forward += phase.seconds();
  phase.reset();
  Workspace& w = *ws_;
  const int L = cfg_.num_layers, C = cfg_.hidden_size;
  const size_t NC = (size_t)B * T * C;
  const int F = final_block_;
  const float* fp = store.params(F);
  double loss = head(ep, store.grads(0), fp, store.grads(F), w.res + L * NC, targets, B, T, dloss, true, w.dres);
  store.release(F);
  store.release(0);  // the tied head was the last reader of the embedding's parameters (ZeRO-3 frees them now)
  store.grads_ready(F);
  for (int l = L - 1; l >= 0; --l) {
    LayerActs& a = w.acts[recompute_ ? 0 : l];
    const int b = blocks_[l].block;
    const float* lp = store.params(b);
    if (recompute_) layer_forward(store, l, lp, a, w.res + l * NC, w.res + (l + 1) * NC, B, T);
    layer_backward(store, l, lp, store.grads(b), a, w.res + l * NC, w.dres, B, T);
    store.release(b);
    store.grads_ready(b);
  }
  float* eg = store.grads(0);
  if (tp_.enabled()) TensorParallel::embedding_backward(eg + wte_, eg + wpe_, w.dres, tokens, B, T, C, vstart_, Vl_);
  else ops_->encoder_backward(eg + wte_, eg + wpe_, w.dres, tokens, B, T, C);
  store.grads_ready(0);
  phase_.backward += phase.seconds();
  return loss;
}

double Gpt::forward_loss(ParamStore& store, const int32_t* host_tokens, const int32_t* host_targets, int B, int T) {
  const auto [tokens, targets] = stage_inputs(host_tokens, host_targets, B, T);
  training_ = false;
  // evaluation keeps no activations for backward: every layer reuses the first set
  const float* ep = forward_layers(store, tokens, B, T, /*keep_acts=*/false);
  Workspace& w = *ws_;
  const int L = cfg_.num_layers;
  const size_t NC = (size_t)B * T * cfg_.hidden_size;
  double loss = head(ep, nullptr, store.params(final_block_), nullptr, w.res + L * NC, targets, B, T, 0.0f, false, nullptr);
  store.release(final_block_);
  store.release(0);
  return loss;
}

}  // namespace hpct::model
