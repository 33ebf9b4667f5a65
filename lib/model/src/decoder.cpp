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
  const ParamLayout layout = Gpt::layout_for(cfg);
  auto at = [&](const std::string& name) { return layout.find(name).offset; };
  wte_ = at("embedding.word_embeddings.weight");
  wpe_ = at("embedding.position_embeddings.weight");
  lnfw_ = at("final_layernorm.weight");
  lnfb_ = at("final_layernorm.bias");
  for (int l = 0; l < L_; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    LayerOffsets o{at(p + "input_layernorm.weight"), at(p + "input_layernorm.bias"),
                   at(p + "attention.query_key_value.weight"), at(p + "attention.query_key_value.bias"),
                   at(p + "attention.dense.weight"), at(p + "attention.dense.bias"),
                   at(p + "post_attention_layernorm.weight"), at(p + "post_attention_layernorm.bias")};
    o.experts = cfg.moe.experts_of(l, cfg.num_layers);
    if (o.experts == 0 || cfg.moe.residual) {
      o.fcw = at(p + "mlp.dense_h_to_4h.weight"), o.fcb = at(p + "mlp.dense_h_to_4h.bias");
      o.fcprojw = at(p + "mlp.dense_4h_to_h.weight"), o.fcprojb = at(p + "mlp.dense_4h_to_h.bias");
    }
    if (o.experts > 0) {
      o.routerw = at(p + "mlp.router.weight");
      if (cfg.moe.residual) o.coefw = at(p + "mlp.coefficient.weight"), o.coefb = at(p + "mlp.coefficient.bias");
      for (int e = 0; e < o.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        o.expert.push_back({at(x + "dense_h_to_4h.weight"), at(x + "dense_h_to_4h.bias"), at(x + "dense_4h_to_h.weight"),
                            at(x + "dense_4h_to_h.bias")});
      }
    }
    layers_.push_back(std::move(o));
  }
  len_.assign(sequences, 0);
  const size_t cache = (size_t)L_ * sequences * T_ * C_;
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
  const int R = static_cast<int>(rows.size()), C = C_, F = 4 * C_;
  const size_t RC = (size_t)R * C;
  grow(x_, RC), grow(ln_, RC), grow(qkv_, 3 * RC), grow(atty_, RC), grow(res_, RC);
  grow(fch_, (size_t)R * F), grow(fcg_, (size_t)R * F), grow(mean_, R), grow(rstd_, R);
  const int V = cfg_.vocab_size;
  for (int r = 0; r < R; ++r) {  // token + position embeddings
    if (tokens[r] < 0 || tokens[r] >= V)
      throw config_error("--prompt", "token " + std::to_string(tokens[r]) + " is not in the model's vocabulary 0.." +
                                         std::to_string(V - 1));
    const float* te = p_ + wte_ + (size_t)tokens[r] * C;
    const float* pe = p_ + wpe_ + (size_t)rows[r].pos * C;
    for (int c = 0; c < C; ++c) x_[(size_t)r * C + c] = te[c] + pe[c];
  }
  for (int l = 0; l < L_; ++l) {
    const LayerOffsets& o = layers_[l];
    kernels::layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), p_ + o.ln1w, p_ + o.ln1b, R, C);
    kernels::matmul_forward(qkv_.data(), ln_.data(), p_ + o.qkvw, p_ + o.qkvb, R, C, 3 * C);
    for (int r = 0; r < R; ++r) {  // this layer's keys and values into the cache first: rows of one
      const float* q = qkv_.data() + (size_t)r * 3 * C;  // prompt attend to each other through it
      std::copy(q + C, q + 2 * C, kcache(l, rows[r].seq, rows[r].pos));
      std::copy(q + 2 * C, q + 3 * C, vcache(l, rows[r].seq, rows[r].pos));
    }
    attend(rows, l);
    kernels::matmul_forward(res_.data(), atty_.data(), p_ + o.projw, p_ + o.projb, R, C, C);
    kernels::residual_forward(res_.data(), x_.data(), res_.data(), RC);
    kernels::layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), res_.data(), p_ + o.ln2w, p_ + o.ln2b, R, C);
    if (o.experts == 0) mlp(o.fcw, o.fcb, o.fcprojw, o.fcprojb, ln_.data(), x_.data(), R);
    else moe(l, R, x_.data());
    kernels::residual_forward(x_.data(), res_.data(), x_.data(), RC);
  }
  if (out_rows.empty() || !logits) return;
  const int K = static_cast<int>(out_rows.size());
  for (int i = 0; i < K; ++i)  // the rows that need logits, packed
    std::copy(x_.data() + (size_t)out_rows[i] * C, x_.data() + (size_t)(out_rows[i] + 1) * C, res_.data() + (size_t)i * C);
  kernels::layernorm_forward(ln_.data(), mean_.data(), rstd_.data(), res_.data(), p_ + lnfw_, p_ + lnfb_, K, C);
  kernels::matmul_forward(logits, ln_.data(), p_ + wte_, nullptr, K, C, Vp_);  // the head is the tied embedding
}

void Decoder::mlp(size_t fcw, size_t fcb, size_t projw, size_t projb, const float* in, float* out, int R) {
  const int C = C_, F = 4 * C_;
  grow(fch_, (size_t)R * F), grow(fcg_, (size_t)R * F);
  kernels::matmul_forward(fch_.data(), in, p_ + fcw, p_ + fcb, R, C, F);
  kernels::gelu_forward(fcg_.data(), fch_.data(), (size_t)R * F);
  kernels::matmul_forward(out, fcg_.data(), p_ + projw, p_ + projb, R, F, C);
}

// The training model's MoE forward (moe.cpp) in evaluation, every route kept: router logits in
// fp32, the gate's experts and weights, each expert's MLP over its rows, the weighted combine, and
// Residual-MoE's mix with the dense MLP.
void Decoder::moe(int l, int R, float* out) {
  const LayerOffsets& o = layers_[l];
  const int C = C_, E = o.experts, K = cfg_.moe.topk;
  grow(logits_, (size_t)R * E);
  kernels::matmul_forward(logits_.data(), ln_.data(), p_ + o.routerw, nullptr, R, C, E);
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
    if (const int rows = r.load[e]; rows > 0) {
      const auto& w = o.expert[e];
      mlp(w[0], w[1], w[2], w[3], erows_.data() + first[e] * C, ey_.data() + first[e] * C, rows);
    }
  if (!cfg_.moe.residual) {
    kernels::moe_combine(out, ey_.data(), pos.data(), r.weight.data(), R, K, C);
    return;
  }
  grow(dense_, (size_t)R * C), grow(coef_, (size_t)R * 2);
  std::vector<float> moe_out((size_t)R * C);
  kernels::moe_combine(moe_out.data(), ey_.data(), pos.data(), r.weight.data(), R, K, C);
  mlp(o.fcw, o.fcb, o.fcprojw, o.fcprojb, ln_.data(), dense_.data(), R);
  kernels::matmul_forward(coef_.data(), ln_.data(), p_ + o.coefw, p_ + o.coefb, R, C, 2);
  kernels::residual_mix(out, coef_.data(), moe_out.data(), dense_.data(), R, C);
}

void Decoder::attend(const std::vector<Row>& rows, int layer) {
  const int C = C_, HS = C_ / NH_;
  const float sc = 1.0f / std::sqrt(static_cast<float>(HS));
  grow(scores_, T_);
  float* sv = scores_.data();
  for (size_t r = 0; r < rows.size(); ++r) {
    const int s = rows[r].seq, keys = rows[r].pos + 1;  // causal: positions 0..pos of its own sequence
    for (int h = 0; h < NH_; ++h) {
      const float* q = qkv_.data() + r * 3 * C + (size_t)h * HS;
      float mx = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        const float* k = kcache(layer, s, j) + (size_t)h * HS;
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
        const float* v = vcache(layer, s, j) + (size_t)h * HS;
        const float w = sv[j] * inv;
        for (int e = 0; e < HS; ++e) o[e] += w * v[e];
      }
    }
  }
}

}  // namespace hpct::model
