// The GPT forward with a key/value cache (see decoder.hpp).
#include "hpct/model/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/kernels/moe_ops.hpp"
#include "hpct/kernels/ops.hpp"
#include "hpct/model/moe_gate.hpp"

namespace hpct::model {

namespace {
void grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}
}  // namespace

Decoder::Decoder(const GptConfig& cfg, const float* params, int sequences)
    : cfg_(cfg), p_(params), C_(cfg.hidden_size), T_(cfg.positions()), L_(cfg.num_layers), NH_(cfg.num_heads),
      Vp_(cfg.padded_vocab()) {
  cfg.validate();
  if (cfg.tensor_parallel != 1)
    throw config_error("--tensor-model-parallel-size", "the decoder runs the whole model on one process (tensor_parallel 1)");
  if (sequences < 1) throw Error("Decoder: need at least one sequence (got " + std::to_string(sequences) + ")");
  layout_ = Gpt::layout_for(cfg, 0, &t_);
  ops_ = kernels::cpu_ops();
  norm_ = Norm(*ops_, C_, cfg.normalization);
  attention_ = Attention(*ops_, kernels::Precision::fp32, C_, NH_, C_,
                         {cfg.rotary_dims(), static_cast<float>(cfg.rope_theta)}, cfg.kv_heads());
  mlp_ = Mlp(*ops_, kernels::Precision::fp32, C_, cfg.mlp);
  len_.assign(sequences, 0);
  KVC_ = cfg.kv_heads() * (C_ / NH_);
  const size_t cache = (size_t)L_ * sequences * T_ * KVC_;
  k_.assign(cache, 0.0f);
  v_.assign(cache, 0.0f);
}

void Decoder::extend(int s, const int32_t* tokens, int n, float* logits, bool all_rows) {
  if (s < 0 || s >= sequences()) throw Error("Decoder: no sequence " + std::to_string(s));
  if (n <= 0) return;
  if (len_[s] + n > T_)
    throw config_error("--seq-length", "sequence " + std::to_string(s) + " would reach position " +
                                           std::to_string(len_[s] + n - 1) + ", beyond the model's " +
                                           std::to_string(T_) + " positions");
  std::vector<Row> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = {s, len_[s] + i};
  std::vector<int> out;
  if (logits) {
    if (all_rows)
      for (int i = 0; i < n; ++i) out.push_back(i);
    else
      out.push_back(n - 1);
  }
  run(rows, tokens, out, logits);
  len_[s] += n;
}

void Decoder::copy(int from, int to) {
  if (from < 0 || from >= sequences() || to < 0 || to >= sequences())
    throw Error("Decoder::copy: no sequence " + std::to_string(from < 0 || from >= sequences() ? from : to));
  if (from == to) return;
  const size_t n = (size_t)len_[from] * KVC_;
  for (int l = 0; l < L_; ++l) {
    std::copy_n(kcache(l, from, 0), n, kcache(l, to, 0));
    std::copy_n(vcache(l, from, 0), n, vcache(l, to, 0));
  }
  len_[to] = len_[from];
}

void Decoder::step(const int* seqs, const int32_t* tokens, int k, float* logits) {
  std::vector<Row> rows(k);
  std::vector<int> out(k);
  for (int i = 0; i < k; ++i) {
    const int s = seqs[i];
    if (s < 0 || s >= sequences()) throw Error("Decoder: no sequence " + std::to_string(s));
    for (int j = 0; j < i; ++j)
      if (seqs[j] == s) throw Error("Decoder::step: sequence " + std::to_string(s) + " twice in one step");
    if (len_[s] >= T_)
      throw config_error("--seq-length", "sequence " + std::to_string(s) + " is full (" + std::to_string(T_) + " positions)");
    rows[i] = {s, len_[s]};
    out[i] = i;
  }
  run(rows, tokens, out, logits);
  for (int i = 0; i < k; ++i) ++len_[seqs[i]];
}

void Decoder::run(const std::vector<Row>& rows, const int32_t* tokens, const std::vector<int>& out_rows, float* logits) {
  const int R = static_cast<int>(rows.size()), C = C_, F = cfg_.ffn();
  const size_t RC = (size_t)R * C;
  const int Q = attention_.qkv_width();  // a qkv row: q, then the key and value heads
  grow(x_, RC), grow(ln_, RC), grow(qkv_, (size_t)R * Q), grow(atty_, RC), grow(res_, RC);
  grow(fch_, (size_t)R * mlp_.fc_width(F)), grow(fcg_, (size_t)R * F), grow(mean_, R), grow(rstd_, R);
  const int V = cfg_.vocab_size;
  const float* wte = block(t_.embedding_block) + t_.wte;
  const float* wpe = t_.learned_positions ? block(t_.position_block) + t_.wpe : nullptr;  // rotary: none
  pos_.resize(R);
  for (int r = 0; r < R; ++r) pos_[r] = rows[r].pos;
  for (int r = 0; r < R; ++r) {  // token + position embeddings
    if (tokens[r] < 0 || tokens[r] >= V)
      throw config_error("--prompt", "token " + std::to_string(tokens[r]) + " is not in the model's vocabulary 0.." +
                                         std::to_string(V - 1));
    const float* te = wte + (size_t)tokens[r] * C;
    for (int c = 0; c < C; ++c) x_[(size_t)r * C + c] = te[c] + (wpe ? wpe[(size_t)rows[r].pos * C + c] : 0.0f);
  }
  const NormStats stats{mean_.data(), rstd_.data()};
  for (int l = 0; l < L_; ++l) {
    const LayerTensors& o = t_.layers[l];
    const float* lp = block(o.block);
    const AttentionWeights aw = AttentionWeights::at(lp, o.attn);
    norm_.forward(NormWeights::at(lp, o.ln1), x_.data(), ln_.data(), stats, R);
    attention_.qkv(aw, ln_.data(), qkv_.data(), R, nullptr);
    attention_.rotate(qkv_.data(), R, pos_.data());  // rotary positions: q and k at each row's position
    for (int r = 0; r < R; ++r) {  // this layer's keys and values into the cache first: rows of one
      const float* q = qkv_.data() + (size_t)r * Q;  // prompt attend to each other through it
      std::copy(q + C, q + C + KVC_, kcache(l, rows[r].seq, rows[r].pos));
      std::copy(q + C + KVC_, q + C + 2 * KVC_, vcache(l, rows[r].seq, rows[r].pos));
    }
    attend(rows, l);
    attention_.project(aw, atty_.data(), res_.data(), R, nullptr);
    norm_.forward_residual(NormWeights::at(lp, o.ln2), x_.data(), res_.data(), res_.data(), ln_.data(), stats, R);
    if (o.experts == 0) mlp(MlpWeights::at(lp, o.mlp), ln_.data(), x_.data(), R);
    else moe(l, R, x_.data());
    ops_->residual_forward(x_.data(), res_.data(), x_.data(), RC);
  }
  if (out_rows.empty() || !logits) return;
  const int K = static_cast<int>(out_rows.size());
  for (int i = 0; i < K; ++i)  // the rows that need logits, packed
    std::copy(x_.data() + (size_t)out_rows[i] * C, x_.data() + (size_t)(out_rows[i] + 1) * C, res_.data() + (size_t)i * C);
  norm_.forward(NormWeights::at(block(t_.final_block), t_.final_norm), res_.data(), ln_.data(), stats, K);
  const float* head = t_.output_block < 0 ? wte : block(t_.output_block) + t_.output;  // tied: the word embedding
  ops_->matmul_forward(logits, ln_.data(), head, nullptr, K, C, Vp_, kernels::Precision::fp32);
}

void Decoder::mlp(const MlpWeights& w, const float* in, float* out, int R) {
  const int F = cfg_.ffn();
  grow(fch_, (size_t)R * mlp_.fc_width(F)), grow(fcg_, (size_t)R * F);
  mlp_.forward(w, in, fch_.data(), fcg_.data(), out, R, F, nullptr);
}

// The training model's MoE forward (moe.cpp) in evaluation, every route kept: router logits in
// fp32, the gate's experts and weights, each expert's MLP over its rows, the weighted combine, and
// Residual-MoE's mix with the dense MLP.
void Decoder::moe(int l, int R, float* out) {
  const LayerTensors& o = t_.layers[l];
  const float* lp = block(o.block);
  const int C = C_, E = o.experts, K = cfg_.moe.topk;
  grow(logits_, (size_t)R * E);
  kernels::matmul_forward(logits_.data(), ln_.data(), lp + o.routerw, nullptr, R, C, E);
  GateConfig gc = gate_config(cfg_.moe, E, /*training=*/false);
  gc.drop_tokens = false;
  Routing r = select_experts(logits_.data(), R, gc, 0, /*training=*/false);
  assign_slots(r, *std::max_element(r.demand.begin(), r.demand.end()), gc, 0, /*training=*/false);
  // Rows in (expert, slot) order, as the training layer's dispatch buffer.
  const RouteOrder ro = route_order(r);
  const std::vector<size_t>& first = ro.first;
  const std::vector<int32_t>& pos = ro.pos;
  const std::vector<int32_t>& source = ro.source;
  const size_t S = first[E];
  grow(erows_, S * C), grow(ey_, S * C);
  kernels::gather_rows(erows_.data(), ln_.data(), source.data(), S, C);
  for (int e = 0; e < E; ++e)
    if (const int rows = r.load[e]; rows > 0)
      mlp(MlpWeights::at(block(o.expert_blocks[e]), o.expert_mlp), erows_.data() + first[e] * C,
          ey_.data() + first[e] * C, rows);
  if (!cfg_.moe.residual) {
    kernels::moe_combine(out, ey_.data(), pos.data(), r.weight.data(), R, K, C);
    return;
  }
  grow(dense_, (size_t)R * C), grow(coef_, (size_t)R * 2);
  std::vector<float> moe_out((size_t)R * C);
  kernels::moe_combine(moe_out.data(), ey_.data(), pos.data(), r.weight.data(), R, K, C);
  mlp(MlpWeights::at(lp, o.mlp), ln_.data(), dense_.data(), R);
  kernels::matmul_forward(coef_.data(), ln_.data(), lp + o.coefw, lp + o.coefb, R, C, 2);
  kernels::residual_mix(out, coef_.data(), moe_out.data(), dense_.data(), R, C);
}

void Decoder::attend(const std::vector<Row>& rows, int layer) {
  const int C = C_, HS = C_ / NH_, G = NH_ / (KVC_ / HS);  // G query heads per key/value head
  const float sc = 1.0f / std::sqrt(static_cast<float>(HS));
  grow(scores_, T_);
  float* sv = scores_.data();
  for (size_t r = 0; r < rows.size(); ++r) {
    const int s = rows[r].seq, keys = rows[r].pos + 1;  // causal: positions 0..pos of its own sequence
    for (int h = 0; h < NH_; ++h) {
      const float* q = qkv_.data() + r * attention_.qkv_width() + (size_t)h * HS;
      const size_t kvh = (size_t)(h / G) * HS;  // its key/value head
      float mx = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        const float* k = kcache(layer, s, j) + kvh;
        float d = 0.0f;
        for (int e = 0; e < HS; ++e) d += q[e] * k[e];
        sv[j] = d * sc;
        mx = std::max(mx, sv[j]);
      }
      double sum = 0.0;
      for (int j = 0; j < keys; ++j) sum += (sv[j] = std::exp(sv[j] - mx));
      const float inv = static_cast<float>(1.0 / sum);
      float* o = atty_.data() + r * C + (size_t)h * HS;
      std::fill(o, o + HS, 0.0f);
      for (int j = 0; j < keys; ++j) {
        const float* v = vcache(layer, s, j) + kvh;
        const float w = sv[j] * inv;
        for (int e = 0; e < HS; ++e) o[e] += w * v[e];
      }
    }
  }
}

}  // namespace hpct::model
