// Small models and one fixed micro-batch shared by the whole-model tests (test_gpt.cpp,
// test_gpt_half.cpp), and a parameter store that also holds the 16-bit copies.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "hpct/kernels/half.hpp"
#include "hpct/model/gpt.hpp"

namespace hpct::test {

inline model::GptConfig tiny() {
  model::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 16;
  c.num_heads = 2;
  c.max_seq_length = 6;
  c.vocab_size = 23;
  c.vocab_multiple = 8;
  c.init_std = 0.2;  // larger than GPT-2's so every path carries a visible gradient
  return c;
}

inline model::GptConfig with_dropout(double attention, double hidden) {
  model::GptConfig c = tiny();
  c.attention_dropout = attention;
  c.hidden_dropout = hidden;
  return c;
}

// The fixed micro-batch of the step tests: B = 2 samples of T = 6 tokens and their targets.
constexpr int kB = 2, kT = 6;
inline std::pair<std::vector<int32_t>, std::vector<int32_t>> fixed_batch() {
  std::vector<int32_t> tok(kB * kT), tgt(kB * kT);
  for (int i = 0; i < kB * kT; ++i) {
    tok[i] = (i * 3 + 1) % 23;
    tgt[i] = (i * 11 + 2) % 23;
  }
  return {tok, tgt};
}

// The Llama options on tiny(): RMSNorm, SwiGLU 24 wide, no biases, an untied output layer, rotary.
inline model::GptConfig llama_like() {
  model::GptConfig c = tiny();
  c.normalization = model::NormKind::rmsnorm;
  c.mlp = model::MlpKind::swiglu;
  c.ffn_hidden_size = 24;
  c.linear_bias = false;
  c.untie_embeddings = true;
  c.rotary = true;
  return c;
}

// tiny() with LoRA adapters of rank 4 on the layers' four linears (qkv, proj, fc, fc2; not the embedding).
inline model::GptConfig layer_lora() {
  model::GptConfig c = tiny();
  c.lora.rank = 4;
  c.lora.targets = 0x0F;
  return c;
}

// tiny() with MoE layers of 2 experts (top-1).
inline model::GptConfig two_experts() {
  model::GptConfig c = tiny();
  c.moe.num_experts = {2};
  return c;
}

// tiny() with per-document attention and positions, the end-of-document token fixed_batch()'s
// fourth (sample 0 holds two documents).
inline model::GptConfig documents() {
  model::GptConfig c = tiny();
  c.reset_attention_mask = c.reset_position_ids = true;
  c.eod_token = 10;
  return c;
}

// A flat store that also keeps the parameters' 16-bit copy (ParamStore::params16), `shift`
// elements off where a test wants a wrong one.
struct HalfCopyStore : model::FlatParamStore {
  HalfCopyStore(const ParamLayout& l, const std::vector<float>& p, float* g, kernels::Precision prec, int shift = 0)
      : FlatParamStore(l, p.data(), g), layout(l), h(p.size() + 1), shift(shift) {
    kernels::to_half(p.data(), h.data(), p.size(), prec);
  }
  const uint16_t* params16(int b) override { return h.data() + layout.blocks()[b].offset + shift; }
  const ParamLayout& layout;
  std::vector<uint16_t> h;
  int shift;
};

}  // namespace hpct::test
