// The model's parameter table (Megatron's names and tensor-parallel partitions) and its
// layout-independent initialisation; split from gpt.cpp. See gpt.hpp.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "hpct/core/error.hpp"
#include "hpct/core/rng.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::model {

ParamLayout Gpt::layout_for(const GptConfig& cfg, int tp_rank, GptTensors* tensors) {
  cfg.validate();
  ParamLayout layout;
  GptTensors local;
  GptTensors& found = tensors ? *tensors : local;
  found = {};
  const int64_t C = cfg.hidden_size, F = cfg.ffn(), Vp = cfg.padded_vocab(), T = cfg.positions();
  const int64_t KVC = (int64_t)cfg.kv_heads() * (C / cfg.num_heads);  // key (and value) channels
  // Megatron's split: column-parallel (rows of the (out, in) weight and its bias; QKV by sections
  // q|k|v), row-parallel (columns; the bias is a replica), everything else a replica.
  const int P = cfg.tensor_parallel;
  if (tp_rank < 0 || tp_rank >= P) throw Error("GPT layout: tensor-parallel rank " + std::to_string(tp_rank) + " of " + std::to_string(P));
  const Partition col{0, P, tp_rank, 1}, qkv{0, P, tp_rank, 3}, row{1, P, tp_rank, 1}, rep{-1, P, tp_rank, 1};
  // GPT-2 / Megatron init, declared with each tensor: weights N(0, std), the projections into the
  // residual stream (attention output, MLP fc2) N(0, std / sqrt(2L)), biases zero, norm weights one.
  const InitSpec w = InitSpec::normal(cfg.init_std), w_out = InitSpec::normal(cfg.init_std / std::sqrt(2.0 * cfg.num_layers));
  const InitSpec zero = InitSpec::zeros();
  layout.begin_block("embedding");
  found.embedding_block = static_cast<int>(layout.blocks().size()) - 1;
  found.wte = layout.add("embedding.word_embeddings.weight", {Vp, C}, true, col, w).offset;
  found.learned_positions = !cfg.rotary;
  if (found.learned_positions) {  // rotary positions have no table
    if (cfg.lora.own_position_block()) layout.begin_block("embedding.position");  // trains, the words frozen
    const TensorSpec& wpe = layout.add("embedding.position_embeddings.weight", {T, C}, true, rep, w);
    found.position_block = wpe.block;
    found.wpe = wpe.offset - layout.blocks().back().offset;
  }
  if (cfg.lora.adapts(LoraConfig::embedding)) {  // the tied embedding's adapters, beside it
    // As PEFT: A starts at zero (the adapted model starts as the base), B at N(0, 1).
    layout.begin_block("embedding.lora");
    layout.add("embedding.word_embeddings.lora_a.weight", {Vp, cfg.lora.rank}, true, col, zero);  // rows as wte's
    layout.add("embedding.word_embeddings.lora_b.weight", {C, cfg.lora.rank}, true, rep, InitSpec::normal(1.0));
  }
  int moe_index = 0;
  for (int l = 0; l < cfg.num_layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    layout.begin_block("layers." + std::to_string(l));
    LayerTensors o;
    o.block = static_cast<int>(layout.blocks().size()) - 1;
    size_t base = layout.numel();
    auto rel = [&](const std::string& n, std::vector<int64_t> s, bool wd, const Partition& part, const InitSpec& init) {
      return layout.add(p + n, std::move(s), wd, part, init).offset - base;
    };
    o.ln1 = Norm::declare(layout, p + "input_layernorm", C, rep, base, cfg.normalization);
    o.attn = Attention::declare(layout, p + "attention.", C, {qkv, row, rep}, w, w_out, base, cfg.linear_bias, KVC);
    o.ln2 = Norm::declare(layout, p + "post_attention_layernorm", C, rep, base, cfg.normalization);
    o.experts = cfg.moe.experts_of(l, cfg.num_layers);
    if (o.experts > 0) o.routerw = rel("mlp.router.weight", {o.experts, C}, false, rep, w);  // DeepSpeed's wg: no bias
    if (o.experts == 0 || cfg.moe.residual) o.mlp = Mlp::declare(layout, p + "mlp.", C, F, {col, row, rep}, w, w_out, base, cfg.mlp, cfg.linear_bias);
    if (o.experts > 0 && cfg.moe.residual) {
      o.coefw = rel("mlp.coefficient.weight", {2, C}, true, rep, w);
      o.coefb = rel("mlp.coefficient.bias", {2}, false, rep, zero);
    }
    if (o.experts > 0) {
      o.moe_index = moe_index++;
      for (int e = 0; e < o.experts; ++e) {
        // Every expert block has the same internal offsets as the dense MLP's tensors would alone.
        std::string ep = p + "mlp.experts." + std::to_string(e);
        layout.begin_block(ep, ReduceGroup::expert);
        o.expert_blocks.push_back(static_cast<int>(layout.blocks().size()) - 1);
        // Experts stay whole on a rank (every tensor-parallel rank holds the same ones), or with
        // --enable-expert-tensor-parallelism are split like the dense MLP.
        const bool split = cfg.moe.expert_tensor_parallel;
        o.expert_mlp = Mlp::declare(layout, ep + ".", C, F, {split ? col : rep, split ? row : rep, rep}, w, w_out,
                                    layout.blocks().back().offset, cfg.mlp, cfg.linear_bias);
      }
    }
    if (cfg.lora.enabled()) {  // A (rank, in), B (out, rank) beside each adapted linear's weight
      layout.begin_block(p + "lora");
      o.lora_block = static_cast<int>(layout.blocks().size()) - 1;
      base = layout.numel();
      const int64_t r = cfg.lora.rank;
      const char* names[4] = {"attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"};
      const bool gated = cfg.mlp == MlpKind::swiglu;  // fc's output: [gate | up], 2F
      const int64_t in[4] = {C, C, C, F}, out[4] = {C + 2 * KVC, C, gated ? 2 * F : F, C};
      // Split as the weight: a column-parallel linear's B by its output rows (QKV and a SwiGLU fc by
      // sections), a row-parallel linear's A by its input columns; the other factor a replica
      // (model/lora.cpp).
      const Partition fc_rows{0, P, tp_rank, gated ? 2 : 1};
      Partition qkv_rows = qkv;  // as query_key_value's rows (grouped: q | k | v of their own sizes)
      if (KVC != C) qkv_rows.sections = {C, KVC, KVC}, qkv_rows.stride = 1;
      const Partition a_part[4] = {rep, row, rep, row}, b_part[4] = {qkv_rows, rep, fc_rows, rep};
      // A: PEFT's kaiming_uniform(a=sqrt(5)) has variance 1/(3 in); the same variance, normal.
      // B starts at zero, so the adapted model starts as the base.
      for (int t = 0; t < 4; ++t)
        if (cfg.lora.adapts(t)) {
          const InitSpec a_init = InitSpec::normal(1.0 / std::sqrt(3.0 * static_cast<double>(in[t])));
          o.lora_a[t] = rel(std::string(names[t]) + ".lora_a.weight", {r, in[t]}, true, a_part[t], a_init);
          o.lora_b[t] = rel(std::string(names[t]) + ".lora_b.weight", {out[t], r}, true, b_part[t], zero);
        }
    }
    found.layers.push_back(std::move(o));
  }
  layout.begin_block("final_norm");
  size_t base = layout.numel();
  found.final_block = static_cast<int>(layout.blocks().size()) - 1;
  found.final_norm = Norm::declare(layout, "final_layernorm", C, rep, base, cfg.normalization);
  if (cfg.untie_embeddings) {  // the LM head's own weight, vocab-parallel as the embedding (Megatron's output_layer)
    layout.begin_block("output_layer");
    found.output_block = static_cast<int>(layout.blocks().size()) - 1;
    found.output = layout.add("output_layer.weight", {Vp, C}, true, col, w).offset - layout.blocks().back().offset;
  }
  if (cfg.lora.enabled())  // LoRA: the base model is frozen; the adapters and any modules to save train
    for (size_t b = 0; b < layout.blocks().size(); ++b) {
      const std::string& n = layout.blocks()[b].name;
      const bool adapters = n.size() >= 5 && n.compare(n.size() - 5, 5, ".lora") == 0;
      const bool saved = (n == "final_norm" && cfg.lora.saves(LoraConfig::final_layernorm)) ||
                         (n == "embedding" && cfg.lora.saves(LoraConfig::embeddings)) ||
                         n == "embedding.position";
      if (!adapters && !saved) layout.freeze(static_cast<int>(b));
    }
  return layout;
}

void Gpt::init_params(float* params, uint64_t seed) const {
  for (size_t b = 0; b < layout_.blocks().size(); ++b)
    init_block(static_cast<int>(b), params + layout_.blocks()[b].offset, seed);
}

void Gpt::init_block(int block, float* dst, uint64_t seed) const {
  const size_t base = layout_.blocks()[block].offset;
  for (const auto& t : layout_.tensors()) {
    if (t.block != block) continue;
    float* p = dst + (t.offset - base);
    switch (t.init.kind) {
      case InitSpec::Kind::zeros:
      case InitSpec::Kind::ones:
        std::fill(p, p + t.numel, t.init.kind == InitSpec::Kind::ones ? 1.0f : 0.0f);
        continue;
      case InitSpec::Kind::unset:
        throw Error("tensor '" + t.name + "' declares no initialisation (its layout.add in model/gpt_layout.cpp)");
      case InitSpec::Kind::normal:
        break;
    }
    // One stream per tensor, keyed by its name: init does not depend on how others are laid out.
    Rng rng(mix_seed(seed, std::hash<std::string>{}(t.name) & 0xffffffffu, 0x1417));
    const double sd = t.init.std;
    // A tensor-parallel part draws the full tensor's sequence and keeps its own elements, so every
    // element has the value it has at T = 1 (Megatron's --use-cpu-initialization does the same).
    uint64_t next = 0;  // full-tensor index of the next draw
    t.for_full_runs(0, t.numel, [&](uint64_t full, uint64_t local, uint64_t n) {
      for (; next < full; ++next) rng.normal();
      for (uint64_t k = 0; k < n; ++k, ++next) p[local + k] = static_cast<float>(rng.normal() * sd);
    });
  }
}

}  // namespace hpct::model
